"""The socket side of the daemon's loop: accept, admit, read, reassemble frames, close.

One thread runs a ``selectors`` loop over the listening socket, the clients and a wake-up
pair (the writer thread's signal that a window is on disk). What a client may cost is
bounded here (``limits.py``): connections past ``max_connections`` or from another user are
closed and counted; a connection without a HELLO by ``hello_timeout_s`` is closed; unfinished
frames over all connections are capped; whatever a client's frames cause — a malformed one,
a refused HELLO — drops that client only. Complete frames go to ``dispatch`` (the daemon's
protocol); a closing connection goes to ``on_close`` first (the daemon lets go of the rank).
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import time
from pathlib import Path
from typing import Callable

from argus.processor.config import ProcessorConfig
from argus.processor.connection import Connection
from argus.processor.limits import ACCEPT_BACKOFF_S, DropReason, drop_reason
from argus.processor.listener import listen
from argus.processor.status import ProcessorStatus
from argus.wire import Msg
from argus.wire.client import peer_uid

__all__ = ["Connections"]

log = logging.getLogger("argus.processor")

_WAKE = "wake"


class Connections:
    def __init__(self, config: ProcessorConfig, status: ProcessorStatus,
                 dispatch: Callable[[Connection, Msg, bytes], None], on_close: Callable[[Connection], None],
                 note_drop: Callable[[Connection, str, int, int, str], None]):
        self.config = config
        self._status = status
        self._dispatch = dispatch
        self._on_close = on_close
        self._note_drop = note_drop
        self.by_fd: dict[int, Connection] = {}
        self.pending_bytes = 0  # bytes of unfinished frames over all connections
        self._sel = selectors.DefaultSelector()
        self._rx = bytearray(1 << 20)  # every socket read lands here first (one loop thread)
        self._rx_view = memoryview(self._rx)
        self._accept_paused_until = 0.0  # fd exhaustion: the listener rests until then
        self._next_sweep = 0.0
        self._listener: socket.socket | None = None
        # the writer wakes the loop when a window is on disk, so its ACK leaves at once
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)

    def values(self) -> list[Connection]:
        return list(self.by_fd.values())

    def listen(self) -> None:
        self._listener = listen(self.config.socket_path)
        self._sel.register(self._listener, selectors.EVENT_READ, None)

    def wake(self) -> None:
        """Wake the loop from another thread."""
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the loop is behind anyway) or closed at shutdown
            pass

    def poll(self, timeout: float) -> None:
        for key, _ in self._sel.select(timeout):
            if key.data == _WAKE:
                try:
                    self._wake_r.recv(4096)
                except OSError:
                    pass
            elif key.data is None:
                self._accept()
            else:
                self._read(key.data)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE/ENFILE/ENOBUFS/ENOMEM: rest, keep serving the connected
                self._status.accept_errors += 1
                if self._status.accept_errors in (1, 10, 100, 1000):
                    log.warning("cannot accept a connection (%s); pausing %.1f s", errno.errorcode.get(
                        exc.errno or 0, exc), ACCEPT_BACKOFF_S)
                self._sel.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + ACCEPT_BACKOFF_S
                return
            self._status.connections += 1
            try:
                uid = peer_uid(sock)
            except OSError:
                uid = None
            if uid is not None and os.getuid() != 0 and uid != os.getuid():
                self.count_drop(DropReason.FOREIGN_PEER)
                sock.close()
                continue
            if len(self.by_fd) >= self.config.max_connections:
                self.count_drop(DropReason.TOO_MANY_CONNECTIONS)
                sock.close()
                continue
            sock.setblocking(False)
            conn = Connection(sock)
            self.by_fd[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def resume_accept(self) -> None:
        if self._accept_paused_until and time.monotonic() >= self._accept_paused_until and self._listener:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, None)

    def count_drop(self, reason: DropReason) -> bool:
        """Count a dropped client; True when it is worth a log line (the first ten of a reason,
        then every power of ten: a flood of hostile clients does not fill the log)."""
        n = self._status.count_drop(str(reason))
        return n <= 10 or str(n).strip("0") == "1"

    def sweep(self) -> None:
        """Close connections that never said HELLO within ``hello_timeout_s``."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(1.0, self.config.hello_timeout_s / 2)
        for conn in [c for c in self.by_fd.values() if c.info is None and now - c.since > self.config.hello_timeout_s]:
            self.count_drop(DropReason.HELLO_TIMEOUT)
            self.close(conn, reason=None)

    def catch_up(self, attempts: set[tuple[str, str] | None]) -> None:
        """One more read of every connection of these attempts, and of those that have not
        said HELLO yet (they may belong to one), whatever this round's ``select`` said."""
        for conn in [c for c in self.by_fd.values() if c.attempt_key in attempts or c.info is None]:
            if conn.sock.fileno() >= 0:
                self._read(conn)

    def _read(self, conn: Connection) -> None:
        """One ``recv`` into the loop's buffer (``recv(1 MiB)`` allocates and faults in a
        fresh MiB per call, ~16 µs: 8% of the processor's CPU with many small frames)."""
        try:
            got = conn.sock.recv_into(self._rx)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            got = 0
        if not got:
            self.close(conn, reason="disconnected")
            return
        conn.rx.feed(bytes(self._rx_view[:got]))
        self.drain(conn)
        if conn.sock.fileno() < 0:
            return
        self.pending_bytes += conn.rx.pending_bytes - conn.held
        conn.held = conn.rx.pending_bytes
        if self.pending_bytes > self.config.max_pending_frame_bytes:
            if self.count_drop(DropReason.FRAME_BUDGET):
                log.warning("%s holds %d bytes of an unfinished frame with %d held in all (limit %d); dropping it",
                            conn.who, conn.held, self.pending_bytes, self.config.max_pending_frame_bytes)
            self._note_drop(conn, "frames", 0, 1, "frame_budget")
            self.close(conn, reason=None)

    def drain(self, conn: Connection) -> None:
        """Handle every complete frame in the connection's buffer."""
        try:
            for msg, payload in conn.rx.frames():
                if conn.sock.fileno() < 0:
                    return
                self._status.frames += 1
                self._dispatch(conn, msg, payload)
        except Exception as exc:  # whatever a client causes drops that client only
            reason = drop_reason(exc)
            self._status.garbage_frames += 1
            if not self.count_drop(reason):
                pass
            elif reason == DropReason.INTERNAL:
                log.exception("frame from %s failed (%r); dropping the connection", conn.who, exc)
            else:
                log.warning("%s from %s (%s); dropping the connection (%d so far)", reason, conn.who, exc,
                            self._status.dropped_clients[str(reason)])
            try:
                self._note_drop(conn, "frames", 0, 1, "malformed")
            except Exception:  # noqa: BLE001
                pass
            conn.rx.clear()
            self.close(conn, reason=None)

    def close(self, conn: Connection, reason: str | None) -> None:
        """Let go of the rank (``on_close``), then of the socket; ``reason`` "disconnected"
        counts the disconnect and a batch it cut off mid-frame."""
        self._on_close(conn)
        if conn.sock.fileno() in self.by_fd:
            self._sel.unregister(conn.sock)
            del self.by_fd[conn.sock.fileno()]
        if reason == "disconnected":
            self._status.disconnects += 1
            if conn.rx.pending_bytes:  # a batch cut off mid-frame
                self._note_drop(conn, "frames", 0, 1, "disconnected")
            if conn.info is not None:
                log.warning("rank %d disconnected", conn.info.rank)
        self.pending_bytes -= conn.held
        conn.held = 0
        conn.rx.clear()
        conn.sock.close()

    def close_listener(self, path: Path) -> None:
        """Stop accepting and remove the socket path."""
        if self._listener is None:
            return
        if not self._accept_paused_until:  # while paused (fd exhaustion) it is not registered
            self._sel.unregister(self._listener)
        self._listener.close()
        try:
            path.unlink()
        except FileNotFoundError:
            pass

    def close_wake(self) -> None:
        self._sel.unregister(self._wake_r)
        self._wake_r.close()
        self._wake_w.close()
