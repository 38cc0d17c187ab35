"""Where every record the daemon takes in reaches its rank's windows: the ranks' batches (from
their sockets or their rings), the drops they report, and the processor's own samplers' records.

Runs on the loop's thread only. A batch for a rank whose attempt is not served (a client that
never said HELLO) is counted in the status file, never in another run.
"""

from __future__ import annotations

from typing import Mapping, cast

import numpy as np

from argus.processor.assembler import RankInfo
from argus.processor.attempts import AttemptKey, AttemptState
from argus.processor.connection import Connection
from argus.processor.cpu_time import CpuTimeSampler
from argus.processor.hangs import HangWatch
from argus.processor.samplers import Output, Samplers
from argus.processor.status import ProcessorStatus
from argus.wire import DROP_TABLES, KINDS, Msg

__all__ = ["Intake"]

_CPU_OP = KINDS.index("cpu_op")


class Intake:
    def __init__(self, status: ProcessorStatus, attempts: Mapping[AttemptKey, AttemptState], cpu_time: CpuTimeSampler,
                 samplers: Samplers, hangs: HangWatch):
        self._status = status
        self._attempts = attempts
        self._cpu_time = cpu_time  # CPU ops timed in CPU time (cpu_time.py)
        self._samplers = samplers
        self._hangs = hangs

    def records(self, conn: Connection, msg: Msg, records: np.ndarray) -> None:
        """One batch of a rank's records (from its socket or its ring) into the windows."""
        conn.map_names(msg, records)
        if msg == Msg.KERNELS and conn.cpu_timed:
            ops = records["kind"] == _CPU_OP
            if ops.any():
                cpu = self._cpu_time.cpu_durations(conn.token, records["start_ns"][ops], records["dur_ns"][ops])
                if cpu is not None:
                    self._status.cpu_ops_cpu_timed += int(ops.sum())
                    self._status.cpu_ops_wall_ns += int(records["dur_ns"][ops].sum())
                    self._status.cpu_ops_cpu_ns += int(cpu.sum())
                    records["dur_ns"][ops] = cpu
        st = self._attempts[conn.attempt_key]  # type: ignore[index]
        st.assembler.add(cast(RankInfo, conn.info), msg, records)  # a rank's records come after its HELLO
        self._status.events += len(records)
        if msg == Msg.STEPS:
            self._samplers.steps_reported(conn.token, records)
            self._hangs.steps_reported(conn.attempt_key, records)

    def drops(self, conn: Connection, rows: np.ndarray) -> None:
        """A rank's ``DROPS`` frame: what its producer's full buffers lost, per table."""
        for row in rows:
            table = DROP_TABLES[min(int(row["table"]), len(DROP_TABLES) - 1)]
            self.note_drop(conn, table, max(int(row["events"]), 0), max(int(row["batches"]), 0),
                           "producer_buffer_full")

    def note_drop(self, conn: Connection, table: str, events: int, batches: int, reason: str) -> None:
        key = conn.attempt_key  # a client that never said HELLO is counted here, not in another run
        if key is None or key not in self._attempts:
            self._status.drops_before_hello += max(events, batches)
            return
        rank = conn.info.rank if conn.info else -1
        self._attempts[key].assembler.note_drop(-1, rank, table, events, batches, reason)

    def sampled(self, outputs: list[Output]) -> None:
        """Give the samplers' records to their ranks' windows."""
        for handle, msg, records in outputs:
            st = self._attempts.get(handle.attempt_key)
            if st is None:
                continue
            if msg == Msg.DROPS:
                for row in records:
                    st.assembler.note_drop(-1, handle.rank, DROP_TABLES[int(row["table"])], int(row["events"]),
                                           int(row["batches"]), "queue_full")
                continue
            st.assembler.add(handle.info, msg, records)
            self._status.sampled_records += len(records)
