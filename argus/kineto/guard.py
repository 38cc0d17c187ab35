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
_QUOTE, _BACKSLASH = 0x22, 0x5C
_OPEN = np.zeros(256, np.int8)
_OPEN[[0x5B, 0x7B]] = 1  # [ {
_CLOSE = np.zeros(256, np.int8)
_CLOSE[[0x5D, 0x7D]] = 1  # ] }


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
            if data.startswith(_BOM):
                data = data[len(_BOM):]
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
        a = np.frombuffer(data, np.uint8)
        n = a.size
        quote = a == _QUOTE
        backslash = a == _BACKSLASH
        if self._backslashes or backslash.any():  # a quote after an odd run of backslashes is escaped
            idx = np.arange(n, dtype=np.int64)
            last_plain = np.maximum.accumulate(np.where(backslash, -1, idx))
            run = np.where(last_plain >= 0, idx - last_plain, idx + 1 + self._backslashes)  # run ending at i
            before = np.empty(n, np.int64)
            before[0] = self._backslashes
            before[1:] = run[:-1]
            quote &= (before % 2) == 0
            self._backslashes = int(run[-1]) if backslash[-1] else 0
        quotes = np.flatnonzero(quote)
        # Parity of the quotes before each byte (plus the carried state) says whether it is in a string.
        inside = (np.cumsum(quote) - quote + self._in_string) % 2 == 1
        opens = (_OPEN[a] == 1) & ~inside
        closes = (_CLOSE[a] == 1) & ~inside
        delta = opens.astype(np.int32) - closes.astype(np.int32)
        depth = self._depth + np.cumsum(delta, dtype=np.int64)
        event_opens = np.flatnonzero(opens & (depth == _EVENT_DEPTH))
        too_deep = np.flatnonzero(depth > self._max_depth)
        if too_deep.size:
            i = int(too_deep[0])
            earlier = event_opens[event_opens <= i]
            if earlier.size:
                self._event_start = self.offset + int(earlier[-1])
            raise JsonLimitError(f"JSON nested deeper than {self._max_depth} levels {self._where(i)} "
                                 "(Kineto traces nest about 6 deep)")
        if event_opens.size:
            self._event_start = self.offset + int(event_opens[-1])
        self._depth = int(depth[-1])
        self._check_strings(quotes, n)

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
