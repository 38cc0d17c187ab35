"""A byte-level check of JSON nesting depth and string length, ahead of the streaming parser.

ijson keeps the path prefix of every open container (``traceEvents.item.args.a.a…``), so a
400 KB event nested 200,000 deep costs memory in the square of the depth (23 GB before the
kernel killed ``argus ingest``). The parser cannot be told a limit, so the bytes are checked
before it sees them: one vectorised pass per chunk (numpy over the chunk's bytes, a few
comparisons and cumulative sums, far faster than the parser itself) tracking the nesting depth
outside strings and the length of the string being read, with the state carried across chunks.
What exceeds a limit stops the file with a message naming the byte and the event it is in.

A UTF-8 byte-order mark at the very start, which yajl refuses, is dropped here too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MAX_JSON_DEPTH", "MAX_STRING_BYTES", "JsonLimitError", "JsonGuard"]

#: Deepest nesting of JSON containers accepted in a trace file. Kineto's deepest is about 6
#: (file → ``traceEvents`` → event → ``args`` → ``Input Dims`` → a shape); 64 leaves ten times
#: that for other tools' args while keeping ijson's prefix stack (≈ depth² bytes) under a few KB.
MAX_JSON_DEPTH = 64

#: Longest JSON string accepted (bytes, escapes included). Real kernel names (C++ templates) and
#: ``Call stack`` args run to tens of KB; 1 MiB is far above them and caps what one string (a name
#: kept per event) can pin in memory.
MAX_STRING_BYTES = 1 << 20

#: Nesting level of one trace event: the file's object (1) → ``traceEvents`` (2) → the event (3).
_EVENT_DEPTH = 3
_BOM = b"\xef\xbb\xbf"
# Byte classes, for one ``bytes.translate`` per chunk: open, close, quote, backslash; 0 for the rest.
_O, _C, _Q, _B = 1, 2, 3, 4
_CLASSES = bytes(_O if b in b"[{" else _C if b in b"]}" else _Q if b == 0x22 else _B if b == 0x5C else 0
                 for b in range(256))


class JsonLimitError(ValueError):
    """The file exceeds :data:`MAX_JSON_DEPTH` or :data:`MAX_STRING_BYTES`; the message says where."""


class JsonGuard:
    """A read-through stream that raises :class:`JsonLimitError` as soon as the bytes read so far
    nest too deep or hold too long a string. Costs a few array passes per chunk (no per-byte
    Python) and O(chunk) scratch memory."""

    def __init__(self, fh: Any, max_depth: int = MAX_JSON_DEPTH, max_string: int = MAX_STRING_BYTES):
        self._fh = fh
        self._max_depth, self._max_string = max_depth, max_string
        self.offset = 0  # bytes passed through
        self._depth = 0
        self._in_string = False
        self._string_len = 0  # bytes of the open string so far
        self._backslashes = 0  # run of backslashes at the end of the previous chunk
        self._event_start = -1  # byte where the current (or last) trace event began
        self._first = True

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        if self._first and data:
            self._first = False
            while len(data) < len(_BOM) and _BOM.startswith(data):  # a short first read: is it a BOM?
                more = self._fh.read(n)
                if not more:
                    break
                data += more
            if data.startswith(_BOM):
                data = data[len(_BOM):] or self._fh.read(n)  # an empty read would mean the end
        if data:
            self._check(data)
            self.offset += len(data)
        return data

    def readable(self) -> bool:
        return True

    def _where(self, i: int) -> str:
        at = self.offset + i
        if self._event_start >= 0:
            return f"at byte {at:,}, in the trace event starting at byte {self._event_start:,}"
        return f"at byte {at:,}"

    def _check(self, data: bytes) -> None:
        # One C pass classifies every byte; the rest works on the few structural ones.
        cls_all = np.frombuffer(data.translate(_CLASSES), np.uint8)
        pos = np.flatnonzero(cls_all)
        cls = cls_all[pos]
        is_quote = cls == _Q
        if self._backslashes or (cls == _B).any():
            is_quote &= self._unescaped(cls_all, pos)
        # Parity of the quotes before each token (plus the carried state): is it inside a string?
        before = np.cumsum(is_quote) - is_quote
        inside = (before + self._in_string) % 2 == 1
        structural = ((cls == _O) | (cls == _C)) & ~inside
        spos = pos[structural]
        depth = self._depth + np.cumsum(np.where(cls[structural] == _O, 1, -1))
        opens = cls[structural] == _O
        event_opens = spos[opens & (depth == _EVENT_DEPTH)]
        too_deep = np.flatnonzero(depth > self._max_depth)
        if too_deep.size:
            i = int(spos[too_deep[0]])
            earlier = event_opens[event_opens <= i]
            if earlier.size:
                self._event_start = self.offset + int(earlier[-1])
            raise JsonLimitError(f"JSON nested deeper than {self._max_depth} levels {self._where(i)} "
                                 "(Kineto traces nest about 6 deep)")
        if event_opens.size:
            self._event_start = self.offset + int(event_opens[-1])
        if depth.size:
            self._depth = int(depth[-1])
        self._check_strings(pos[is_quote], len(data))

    def _unescaped(self, cls_all: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """For each token, whether it is not preceded by an odd run of backslashes (only quotes
        care). Dense over the chunk, but only chunks holding a backslash pay for it."""
        n = cls_all.size
        backslash = cls_all == _B
        idx = np.arange(n, dtype=np.int64)
        last_plain = np.maximum.accumulate(np.where(backslash, -1, idx))
        run = np.where(last_plain >= 0, idx - last_plain, idx + 1 + self._backslashes)  # run ending at i
        run_before = np.concatenate(([self._backslashes], run[:-1]))
        self._backslashes = int(run[-1]) if backslash[-1] else 0
        return np.asarray(run_before[pos] % 2 == 0)

    def _check_strings(self, quotes: np.ndarray, n: int) -> None:
        """Lengths of the strings closed in this chunk, and of the one left open at its end."""
        carried = self._string_len if self._in_string else 0
        first_open = 1 if self._in_string else 0  # index in ``quotes`` of the first opening quote
        longest, where = -1, 0
        if self._in_string and quotes.size:
            longest, where = carried + int(quotes[0]), int(quotes[0])
        opening = quotes[first_open::2]
        closing = quotes[first_open + 1::2]
        if closing.size:
            lengths = closing - opening[: closing.size] - 1
            k = int(np.argmax(lengths))
            if int(lengths[k]) > longest:
                longest, where = int(lengths[k]), int(closing[k])
        ends_inside = (quotes.size + self._in_string) % 2 == 1
        if ends_inside:
            self._string_len = carried + n if not quotes.size else n - int(quotes[-1]) - 1
            if self._string_len > longest:
                longest, where = self._string_len, n - 1
        self._in_string = ends_inside
        if longest > self._max_string:
            raise JsonLimitError(f"a JSON string longer than {self._max_string:,} bytes {self._where(where)}")
