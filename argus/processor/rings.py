"""The ranks' shared-memory rings: opened at HELLO, drained every cycle, released when the
rank leaves, their files removed once the writing process is gone.

A ring is the rank's own file: nothing in it may end the processor. Bad contents drop that
ring (counted), and the rank's socket records still flow. A rank that leaves without closing
its ring (killed, stuck in exit) stays in its job's hang view with its last in-flight state.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from argus.errors import ProtocolError
from argus.processor.assembler import RankInfo
from argus.processor.connection import Connection
from argus.processor.hangs import RankView
from argus.processor.status import ProcessorStatus
from argus.wire import TABLES_BY_MSG, Msg, RingReader

__all__ = ["Rings", "alive"]

log = logging.getLogger("argus.processor")

RankKey = tuple[tuple[str, str], int]  # ((run, attempt), rank)


class Rings:
    def __init__(self, status: ProcessorStatus, records: Callable[[Connection, Msg, np.ndarray], None],
                 note_drop: Callable[[Connection, str, int, int, str], None]):
        self._status = status
        self._records = records  # a batch into the rank's windows (the daemon's, as for socket batches)
        self._note_drop = note_drop
        self.departed: dict[RankKey, RankView] = {}  # ranks gone without closing their ring
        self._orphans: list[tuple[Path, int]] = []  # ring files whose writer was still exiting

    def open(self, conn: Connection, path: Any, pid: Any) -> None:
        try:
            conn.ring = RingReader(str(path), expect_pid=int(pid) if pid is not None else None)
        except Exception as exc:  # noqa: BLE001 - the rank's socket records still flow
            self._status.ring_errors += 1
            log.warning("rank %s: cannot read its ring %s (%s); its records are lost",
                        conn.info.rank if conn.info else "?", path, exc)

    def drain(self, conn: Connection, final: bool = False) -> None:
        """Everything the rank wrote into its ring since the last pass (``final``: all of it,
        the writer is gone or we are stopping)."""
        ring = conn.ring
        if ring is None or conn.info is None:
            return
        try:
            names = ring.new_names()
            if names:
                conn.add_names(names)
            for msg, records in ring.drain(settled=not final).items():
                self._records(conn, msg, records)
            for msg, n in ring.new_drops().items():
                self._note_drop(conn, TABLES_BY_MSG[msg], n, 0, "producer_buffer_full")
        except Exception as exc:  # noqa: BLE001 - a ring is the rank's file: it never ends the processor
            self._status.garbage_frames += 1
            self._status.ring_errors += 1
            log.warning("rank %d: bad ring contents (%r); no longer reading it", conn.info.rank, exc)
            ring.close()
            conn.ring = None

    def release(self, conn: Connection, stopping: bool) -> None:
        """Last drain of a departed rank's ring (not while stopping: the shutdown drained it);
        the file goes once its writer is gone."""
        ring = conn.ring
        if ring is None:
            return
        if not stopping:
            self.drain(conn, final=True)
        if conn.ring is None:
            return
        self.note_producer_cpu(conn)
        conn.ring = None
        assert conn.info is not None and conn.attempt_key is not None
        try:
            last = ring.inflight.read()
        except ProtocolError:
            last = None
        if not ring.closed_by_writer and last is not None:
            self.departed[(conn.attempt_key, conn.info.rank)] = RankView(
                conn.attempt_key, conn.info.rank, conn.pid, lambda: last, conn.name_of(), alive=False)
        gone = ring.closed_by_writer or not alive(ring.pid)
        ring.close(unlink=gone)
        if not gone:
            self._orphans.append((ring.path, ring.pid))  # removed once its writer is gone

    def reap(self) -> None:
        """Ring files of departed ranks whose processes were still exiting when they left."""
        keep = []
        for path, pid in self._orphans:
            if alive(pid):
                keep.append((path, pid))
            else:
                path.unlink(missing_ok=True)
        self._orphans = keep

    def views(self, conns: Iterable[Connection]) -> list[RankView]:
        """The hang watch's view of every rank with a ring: the connected ones live, the
        departed ones of jobs still running here with their last state."""
        views = []
        for conn in conns:
            if conn.ring is None or conn.info is None or conn.attempt_key is None:
                continue
            info, id_map, ring = conn.info, conn.id_map, conn.ring
            views.append(RankView(conn.attempt_key, info.rank, conn.pid, ring.inflight.read, _namer(info, id_map)))
        live = {(v.key, v.rank) for v in views}
        jobs = {v.key for v in views}
        for k in [k for k in self.departed if k[0] not in jobs]:
            del self.departed[k]  # the job is over on this host
        return views + [v for k, v in self.departed.items() if k not in live]

    def note_producer_cpu(self, conn: Connection) -> None:
        """The CPU the rank's producer threads report in its in-flight block (for benchmarks)."""
        if conn.ring is not None and conn.info is not None:
            try:
                cpu = conn.ring.inflight.read().argus_cpu_ns
            except ProtocolError:  # the ring shrank: the next drain pass drops it
                return
            self._status.producer_cpu_s[str(conn.info.rank)] = round(cpu / 1e9, 4)


def alive(pid: int) -> bool:
    """Does process ``pid`` still run (a zombie does not)?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namer(info: RankInfo, id_map: list[int]) -> Callable[[int], str]:
    """A rank's name id → its name (``""`` for an id it never sent)."""
    def name(i: int) -> str:
        return info.names[id_map[i]] if 0 <= i < len(id_map) else ""
    return name
