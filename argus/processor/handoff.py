"""Closed windows to the writer thread, and what the daemon sends its ranks: the writer's
answers as ACKs, the samplers' requests.

A window is acknowledged only once it is on disk: each rank in it gets the window's ``ACK``,
and a ``FLUSH`` is answered (``ACK {"seq"}``) once every window it forced is done. A ``FLUSH``
forces its attempt's windows at the end of the loop's round, after one more read of every
connection of the attempt: what another rank sent before it belongs in those windows, and on
one host "sent before" means "in our socket buffer by now", though maybe not in the round's
``select`` (closing at once wrote such a window twice, the late batch as a second copy). When the
writer is behind, windows stay in the assembler (whose memory cap counts what it drops) except
at shutdown, when the loop waits for room. A client that stopped reading loses ACKs, nothing
else. Runs on the loop's thread only.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from argus.processor.assembler import RankInfo
from argus.processor.attempts import AttemptKey, AttemptState
from argus.processor.connection import Connection
from argus.processor.connections import Connections
from argus.processor.status import ProcessorStatus
from argus.processor.writer import WriterThread
from argus.wire import Msg, encode_json

__all__ = ["Handoff"]


class Handoff:
    def __init__(self, host: str, attempts: Mapping[AttemptKey, AttemptState], writer: WriterThread,
                 status: ProcessorStatus, connections: Connections):
        self._host = host
        self._attempts = attempts
        self._writer = writer
        self._status = status
        self._connections = connections
        self.last_window_wall = 0.0  # wall time the last window was written (the TSDB liveness)
        self._flushes: list[tuple[Connection, int]] = []  # FLUSHes read this round, not yet applied

    # -- windows to the writer -----------------------------------------------------------
    def close_ready(self) -> None:
        """Hand over every window its attempt's assembler closes now (a window is final once
        no rank of its attempt is connected); stop when the writer is full."""
        self._apply_flushes()
        for key, st in self._attempts.items():
            active = self._active(key)
            for idx in st.assembler.ready(active, final=not active):
                if not self.enqueue(key, idx, block=False):
                    break

    def close_all(self, heartbeat: Callable[[], None]) -> None:
        """At shutdown: every open window, waiting for room (``heartbeat`` meanwhile)."""
        self._apply_flushes()
        for key, st in self._attempts.items():
            for idx in st.assembler.ready({}, final=True):
                self.enqueue(key, idx, block=True, heartbeat=heartbeat)

    def enqueue(self, key: AttemptKey, index: int, block: bool, heartbeat: Callable[[], None] | None = None) -> bool:
        """Hand a closed window to the writer; when the writer is behind (and not shutting
        down) the window stays buffered, and the assembler's memory cap counts what it drops."""
        if not block and self._writer.full:
            return False
        st = self._attempts[key]
        window = st.close_window(index, self._host)
        st.in_flight += 1
        if block:
            assert heartbeat is not None
            self._writer.put_stopping(window, heartbeat)
        else:
            self._writer.offer(window)  # only this thread puts: there is room
        return True

    def windows_left(self) -> int:
        """Windows queued for the writer or still open (the shutdown's progress)."""
        return self._writer.backlog + sum(len(st.assembler.windows) for st in self._attempts.values())

    def _active(self, key: AttemptKey) -> dict[int, RankInfo]:
        return {c.info.rank: c.info for c in self._connections.by_fd.values() if c.attempt_key == key and c.info}

    # -- answers to the ranks ------------------------------------------------------------
    def acknowledge(self) -> None:
        """The windows the writer finished since the last call: ACK them to their ranks and
        answer the FLUSHes they complete (failed windows are not acknowledged)."""
        for done in self._writer.written():
            st = self._attempts.get(done.key)
            if st is not None:
                st.in_flight -= 1
            if done.rows is None:
                continue
            ack = done.ack()
            self._status.note_ack(ack)
            self.last_window_wall = time.time()
            for conn in list(self._connections.by_fd.values()):
                if conn.attempt_key != done.key or conn.info is None:
                    continue
                if conn.info.rank in done.ranks:
                    self.send(conn, encode_json(Msg.ACK, ack))
                for _, pending in conn.flushes:
                    pending.discard((done.key, done.window))
                self._ack_flushes(conn)

    def flush(self, conn: Connection, seq: int) -> None:
        """A rank's ``FLUSH``: its attempt's open windows close at the end of this round
        (``close_ready``); answered once all are written."""
        assert conn.attempt_key is not None  # set with conn.info
        self._flushes.append((conn, seq))

    def _apply_flushes(self) -> None:
        """Read every connection of the flushing attempts once more (a FLUSH read there joins
        this batch), then force their open windows."""
        if not self._flushes:
            return
        self._connections.catch_up({conn.attempt_key for conn, _ in self._flushes})
        flushes, self._flushes = self._flushes, []
        for conn, seq in flushes:
            key = conn.attempt_key
            st = self._attempts.get(key) if key is not None else None
            pending: set[tuple[AttemptKey, int]] = set()
            if key is not None and st is not None:  # (an attempt outlives its ranks' FLUSHes)
                pending = {(key, w) for w in st.assembler.force_all()}
            conn.flushes.append((seq, pending))
            self._ack_flushes(conn)

    def _ack_flushes(self, conn: Connection) -> None:
        done = [seq for seq, pending in conn.flushes if not pending]
        conn.flushes = [(s, p) for s, p in conn.flushes if p]
        for seq in done:
            self.send(conn, encode_json(Msg.ACK, {"seq": seq}))

    def send_controls(self, controls: list[tuple[int, dict[str, Any]]]) -> None:
        """The samplers' requests (``Msg.CONTROL``) to their ranks, by connection token."""
        for token, doc in controls:
            conn = next((c for c in self._connections.by_fd.values() if c.token == token), None)
            if conn is not None:
                self.send(conn, encode_json(Msg.CONTROL, doc))
                self._status.controls_sent += 1

    def send(self, conn: Connection, frame: bytes) -> None:
        if not conn.send(frame):
            self._status.acks_dropped += 1  # a client that stopped reading loses ACKs, nothing else
