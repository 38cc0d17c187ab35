"""The client side of the processor protocol: what a producer (or a test, or a bench) uses.

One client per rank. It interns strings, packs record arrays into frames and writes them
to the processor's unix socket; acknowledgements are read without blocking. The client is
deliberately simple and synchronous: the producer runs it on its own background thread and
owns reconnection and drop-counting policy.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from argus.errors import ProtocolError
from argus.wire.frames import FrameReader
from argus.wire.protocol import MAX_JSON_PAYLOAD, Msg, encode_array, encode_json

__all__ = ["ProcessorClient", "Interner", "MAX_NAME_CHARS", "peer_uid"]

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: A name longer than this is cut (C++ template kernel names run to a few KiB); the processor
#: refuses longer ones.
MAX_NAME_CHARS = 4096


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a unix socket (``SO_PEERCRED``; None where the
    platform has none)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, opt, _PEERCRED.size))
    return uid


class Interner:
    """Assigns small integer ids to strings; remembers which ids the server already knows."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self._unsent: list[tuple[int, str]] = []

    def id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.ids)
            self._unsent.append((found, name))
        return found

    def ids_of(self, names: Iterable[str]) -> np.ndarray:
        return np.fromiter((self.id(n) for n in names), dtype=np.int32)

    def take_unsent(self) -> list[tuple[int, str]]:
        out, self._unsent = self._unsent, []
        return out

    def resend_all(self) -> None:
        """After a reconnect the server knows nothing: every name goes out again."""
        self._unsent = [(i, n) for n, i in self.ids.items()]


class ProcessorClient:
    """A connection from one rank to its host's processor."""

    def __init__(self, socket_path: str | Path, hello: dict[str, Any], timeout_s: float = 5.0):
        self.socket_path = str(socket_path)
        self.hello = dict(hello)
        self.timeout_s = timeout_s
        self.names = Interner()
        self.sock: socket.socket | None = None
        self.acks: list[dict[str, Any]] = []
        self.controls: list[dict[str, Any]] = []  # server requests (e.g. sample your own stacks)
        self._rx = FrameReader()
        self.peer_closed = False  # the processor closed the connection (seen by poll_acks)

    # -- connection ----------------------------------------------------------------------
    def connect(self, retries: int = 0, delay_s: float = 0.1) -> "ProcessorClient":
        last: OSError | None = None
        for attempt in range(retries + 1):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(self.timeout_s)
                s.connect(self.socket_path)
                uid = peer_uid(s)
                if uid is not None and uid not in (os.getuid(), 0):  # never tell another user our HELLO
                    raise ConnectionRefusedError(f"{self.socket_path} is served by uid {uid}, not by this user")
                self.sock = s
                self._rx = FrameReader()
                self.peer_closed = False
                self.names.resend_all()
                self._send(encode_json(Msg.HELLO, self.hello))
                return self
            except OSError as exc:
                last = exc
                s.close()
                if attempt < retries:
                    time.sleep(delay_s)
        raise ConnectionError(f"cannot reach the processor at {self.socket_path}: {last}")

    def close(self, bye: bool = True) -> None:
        if self.sock is not None:
            try:
                if bye:
                    self._send(encode_json(Msg.BYE, {}))
            except OSError:
                pass
            self.sock.close()
            self.sock = None

    def __enter__(self) -> "ProcessorClient":
        return self if self.sock is not None else self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sending -------------------------------------------------------------------------
    def _send(self, frame: bytes) -> None:
        if self.sock is None:
            raise ConnectionError("not connected")
        self.sock.sendall(frame)

    def _send_names(self) -> None:
        new = self.names.take_unsent()
        chunk: list[tuple[int, str]] = []
        size = 0
        for i, name in new:  # frames under MAX_JSON_PAYLOAD (a 4096-char name escapes to ≤ 24 KiB)
            entry = (i, name[:MAX_NAME_CHARS])
            chunk.append(entry)
            size += len(json.dumps(entry)) + 1
            if size > MAX_JSON_PAYLOAD // 2:
                self._send(encode_json(Msg.NAMES, chunk))
                chunk, size = [], 0
        if chunk:
            self._send(encode_json(Msg.NAMES, chunk))

    def send(self, msg: Msg, records: np.ndarray) -> None:
        """Send one batch of packed records (``protocol.DTYPES[msg]``), names first."""
        self._send_names()
        self._send(encode_array(msg, records))

    def send_raw(self, frame: bytes) -> None:
        """Send pre-built bytes (benchmarks, and tests that send malformed frames)."""
        self._send(frame)

    def flush(self, seq: int) -> None:
        self._send(encode_json(Msg.FLUSH, {"seq": seq}))

    # -- acknowledgements ------------------------------------------------------------------
    def poll_acks(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Read whatever ACK frames have arrived (waiting up to ``wait_s`` for the first)."""
        if self.sock is None:
            return self.acks
        deadline = time.monotonic() + wait_s
        while True:
            remaining = deadline - time.monotonic()
            self.sock.settimeout(max(remaining, 0.0) if wait_s else 0.0)
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, TimeoutError, socket.timeout):
                chunk = None
            finally:
                self.sock.settimeout(self.timeout_s)
            if chunk == b"":
                self.peer_closed = True
                break  # server closed
            if chunk:
                self._rx.feed(chunk)
                self._parse_acks()
                if wait_s and not self.acks and time.monotonic() < deadline:
                    continue
                break  # what arrived is read: do not sit out the rest of wait_s
            if chunk is None or not wait_s or time.monotonic() >= deadline:
                break
        return self.acks

    def wait_for_ack(self, predicate, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ack in self.poll_acks(wait_s=min(0.2, max(deadline - time.monotonic(), 0.0))):
                if predicate(ack):
                    return ack
        raise TimeoutError(f"no matching ACK within {timeout_s} s (have {self.acks})")

    def _parse_acks(self) -> None:
        for msg, payload in self._rx.frames():
            if msg == Msg.ACK:
                self.acks.append(json.loads(payload))
            elif msg == Msg.CONTROL:
                self.controls.append(json.loads(payload))
            else:
                raise ProtocolError(f"unexpected {msg.name} frame from the processor")
