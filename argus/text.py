"""Untrusted text made safe to show: what traces and ranks name reaches a terminal or a page as text.

Phase, kernel, host and frame names, run and attempt ids all come from the observed job (a
Kineto file, a rank's HELLO, a stored Parquet column), so they may hold anything: ANSI/OSC
escapes that retitle or rewrite the terminal, BEL, NUL, a bidi override (U+202E) that shows
text reversed, a lone surrogate that cannot be encoded, or rich markup such as ``[/]`` that
makes ``console.print`` raise. :func:`visible` is the one place that turns the invisible
characters into their Python escapes (``\\x1b``, ``\\u202e``), so what was in the name is
what is shown; :func:`term` adds rich-markup escaping and a length cap for the CLI, and the
report's ``esc`` adds HTML escaping on top of :func:`visible`.
"""

from __future__ import annotations

import re

__all__ = ["visible", "term", "MAX_TERMINAL_CHARS"]

#: Longest untrusted string printed on a terminal, in characters of the original. Long enough
#: for real C++ template kernel names (CUTLASS/cuBLAS names run to ~1,000 characters); a name
#: of megabytes would otherwise take seconds to lay out in a rich table and flood the screen.
MAX_TERMINAL_CHARS = 2048

# Every code point whose Unicode category is Cc (C0, DEL, C1), Cf (format: bidi embeddings,
# overrides and isolates, zero-width characters, BOM, tag characters), Cs (surrogates) or
# Zl/Zp (line and paragraph separators, which terminals and editors treat as new lines). Listed
# as ranges so one regex pass handles megabytes; tests/cli/test_safe_output.py checks the
# list against ``unicodedata`` over all of Unicode.
_INVISIBLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")


def _escape_char(m: re.Match[str]) -> str:
    cp = ord(m.group())
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def visible(value: object) -> str:
    """``str(value)`` with every control, format, separator and surrogate character written
    as its Python escape (``"\\x1b]0;x\\x07"``), so it can neither act on a terminal nor hide."""
    try:
        s = value if isinstance(value, str) else str(value)
    except Exception:  # noqa: BLE001 - a hostile __str__: show the type rather than raise into the caller
        s = f"<unprintable {type(value).__name__}>"
    return _INVISIBLE.sub(_escape_char, s)


def term(value: object, limit: int = MAX_TERMINAL_CHARS) -> str:
    """:func:`visible` text, cut at ``limit`` characters, with rich markup escaped: safe to
    put inside a string that ``console.print`` parses for markup, and in a table cell."""
    from rich.markup import escape

    s = value if isinstance(value, str) else visible(value)
    if len(s) > limit:
        s = f"{s[:limit]}…(+{len(s) - limit:,} chars)"
    return escape(visible(s))
