"""Reassemble frames from a byte stream: the one frame reader of both ends of the socket.

Bytes arrive in arbitrary chunks; :meth:`FrameReader.feed` appends them and
:meth:`FrameReader.frames` yields every complete ``(message type, payload)`` in order. A bad
header raises :class:`~argus.errors.ProtocolError` (the connection is then unusable: framing is
lost). Payloads are copied out once, so the buffer never grows beyond one unfinished frame
plus the last chunk.
"""

from __future__ import annotations

from typing import Iterator

from argus.wire.protocol import HEADER, Msg, decode_header

__all__ = ["FrameReader"]


class FrameReader:
    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished frame (a connection cut here lost a batch)."""
        return len(self._buf)

    def clear(self) -> None:
        self._buf.clear()

    def frames(self) -> Iterator[tuple[Msg, bytes]]:
        buf = self._buf
        while len(buf) >= HEADER.size:
            msg, length = decode_header(bytes(buf[:HEADER.size]))
            end = HEADER.size + length
            if len(buf) < end:
                return
            payload = bytes(buf[HEADER.size:end])
            del buf[:end]
            yield msg, payload
