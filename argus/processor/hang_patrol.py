"""Live hang detection in the daemon's loop: every half second the ranks' in-flight blocks
go to :class:`~argus.processor.hangs.HangWatch`; a hang found is written into the attempt
as a snapshot, and the job's ranks on this host are asked for their Flight Recorder rings."""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Mapping

from argus.processor.attempts import AttemptState
from argus.processor.connection import Connection
from argus.processor.hangs import HangConfig, HangWatch
from argus.processor.rings import Rings
from argus.processor.stacks import find_py_spy, parse_dump, run_dump
from argus.processor.status import ProcessorStatus
from argus.store import FLIGHT_RECORDER_DIR
from argus.wire import Msg, encode_json

__all__ = ["HangPatrol", "CHECK_INTERVAL_S"]

log = logging.getLogger("argus.processor")

CHECK_INTERVAL_S = 0.5


class HangPatrol:
    def __init__(self, config: HangConfig, host: str, py_spy: str | None, rings: Rings, status: ProcessorStatus):
        self.watch = HangWatch(config, host, dump=self._main_stack)
        self._py_spy = find_py_spy(py_spy)
        self._rings = rings
        self._status = status
        self._next_check = 0.0

    def _main_stack(self, pid: int) -> str | None:
        """The main thread's folded stack (one ``py-spy dump``), for a hang snapshot."""
        if self._py_spy is None:
            return None
        kind, text = run_dump(self._py_spy, pid)
        if kind != "ok":
            return None
        threads = parse_dump(text, pid)
        main = [f for name, f in threads if name == "MainThread"] or [f for _, f in threads[:1]]
        if not main:
            return None
        return ";".join(f for f in main[0].split(";") if "argus/producer/" not in f)  # the user's frames

    def check(self, conns: Iterable[Connection], attempts: Mapping[tuple[str, str], AttemptState],
              send: Callable[[Connection, bytes], None]) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_INTERVAL_S
        self._rings.reap()
        conns = list(conns)
        views = self._rings.views(conns)
        try:
            found = self.watch.check(views)
        except Exception as exc:  # noqa: BLE001 - e.g. a ring truncated under us: skip this check
            self._status.hang_check_errors += 1
            log.warning("hang check failed (%r)", exc)
            return
        for key, cols in found.items():
            st = attempts.get(key)
            if st is None:
                continue
            try:
                window = max(st.assembler.windows, default=0)
                st.store.partition.write("hangs", cols, window=window)
                self._status.hang_snapshots += 1
            except Exception as exc:  # keep serving
                log.exception("cannot write the hang snapshot of %s/%s: %s", key[0], key[1], exc)
            self._ask_flight_recorder(key, st, conns, send)

    def _ask_flight_recorder(self, key: tuple[str, str], st: AttemptState, conns: list[Connection],
                             send: Callable[[Connection, bytes], None]) -> None:
        """Ask the job's ranks here for their Flight Recorder rings (PyTorch's record of every
        recent collective: who entered which, in sequence), written into the attempt for the
        diagnosis (``analysis/hangs.py``) — the evidence NCCL writes only on its timeout, gloo
        never, taken while the job is stuck."""
        doc = {"flight_recorder": {"dir": str(st.attempt.path / FLIGHT_RECORDER_DIR)}}
        for conn in conns:
            if conn.attempt_key == key and conn.info is not None:
                try:
                    send(conn, encode_json(Msg.CONTROL, doc))
                    self._status.flight_recorder_asked += 1
                except Exception:  # noqa: BLE001 - a closed connection: that rank cannot answer
                    pass
