"""Who the daemon serves: a HELLO admits a rank into its run attempt (opened or created in the
store) or refuses it; a closing connection lets the rank go; idle attempts are released.

A HELLO is validated whole (``parse_hello``, the layout against the attempt) before anything is
allocated for it or written to disk. A run whose ``attempt.json`` cannot be used (corrupt,
foreign, another layout) is refused — that run, never the daemon — and the refusal is
remembered for ``ATTEMPT_RETRY_S``, so ranks reconnecting in a loop cost one read per interval.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

from argus.errors import ArgusError, ProtocolError
from argus.processor.assembler import RankInfo
from argus.processor.attempts import AttemptKey, AttemptState
from argus.processor.config import ProcessorConfig
from argus.processor.connection import Connection
from argus.processor.cpu_time import CpuTimeSampler
from argus.processor.hangs import HangWatch
from argus.processor.intake import Intake
from argus.processor.limits import ATTEMPT_RETRY_S, MAX_REFUSED, DropReason, HelloRefused
from argus.processor.rings import Rings
from argus.processor.samplers import Samplers
from argus.processor.status import ProcessorStatus
from argus.store import Store
from argus.topology import Layout, RunIdentity, parse_layout
from argus.wire import decode_json
from argus.wire.hello import Hello, parse_hello

__all__ = ["Admission"]

log = logging.getLogger("argus.processor")


class Admission:
    def __init__(self, config: ProcessorConfig, store: Store, status: ProcessorStatus,
                 attempts: dict[AttemptKey, AttemptState], rings: Rings, cpu_time: CpuTimeSampler,
                 samplers: Samplers, hangs: HangWatch, intake: Intake):
        self._config = config
        self._store = store
        self._status = status
        self._attempts = attempts  # the daemon's: opened here, released in forget_idle
        self._rings = rings
        self._cpu_time = cpu_time
        self._samplers = samplers
        self._hangs = hangs
        self._intake = intake
        self._refused: dict[AttemptKey, tuple[float, str]] = {}  # attempt → (retry at, why)

    def hello(self, conn: Connection, payload: bytes) -> None:
        """A ``HELLO`` frame: admit its rank, or raise :class:`HelloRefused` (the client is dropped)."""
        try:
            hello = parse_hello(decode_json(payload))
        except ProtocolError as exc:
            raise HelloRefused(str(exc)) from None
        self._admit(conn, hello)

    def _admit(self, conn: Connection, hello: Hello) -> None:
        """Admit a rank: every field was validated (``parse_hello``) and the layout is checked
        against the attempt before anything is allocated for it or written to disk."""
        if conn.info is not None:
            raise ProtocolError("second HELLO on one connection")
        rank, world = hello.rank, hello.world_size
        try:
            layout = parse_layout(hello.layout, world_size=world, order=hello.order)
        except ArgusError as exc:
            raise HelloRefused(f"rank {rank}: {exc}") from None
        key = (hello.run_id, hello.attempt_id)
        st = self._attempts.get(key)
        if st is None:
            st = self._open_attempt(key, layout)
        elif st.attempt.layout != layout:
            raise HelloRefused(f"rank {rank} reports layout {layout}, the attempt has {st.attempt.layout}")
        st.topology.hosts[rank] = hello.host or self._config.host
        st.topology.local_ranks[rank] = hello.local_rank
        st.topology.gpu_uuids[rank] = hello.gpu_uuid
        st.new_ranks.append(rank)
        conn.info = RankInfo(rank=rank, gpu_uuid=hello.gpu_uuid)
        conn.attempt_key = key
        conn.pid = hello.pid
        if hello.ring:
            self._rings.open(conn, hello.ring, conn.pid)
        if hello.kernels == "cpu_ops" and conn.pid is not None and hello.tid is not None:
            ring = conn.ring
            conn.cpu_timed = self._cpu_time.add(conn.token, conn.pid, hello.tid, hello.clock_offset_ns,
                                                ring.inflight.op_capture if ring is not None else None)
        self._samplers.rank_joined(conn.token, conn.info, key, hello.to_doc())
        self._status.ranks_seen += 1
        if hello.pid is not None:  # argus run's job log names a line's rank by its pid (NCCL's prefix)
            pids = self._status.rank_pids
            if len(pids) < 4096:
                pids[str(hello.pid)] = rank
        log.info("rank %d of %s/%s connected (pid %s)", rank, key[0], key[1], hello.pid)

    def _open_attempt(self, key: AttemptKey, layout: Layout) -> AttemptState:
        """The run's attempt (opened or created); a corrupt, foreign or differing
        ``attempt.json`` refuses the run (logged once per ``ATTEMPT_RETRY_S``), never the daemon."""
        now = time.monotonic()
        refused = self._refused.get(key)
        if refused is not None and now < refused[0]:
            raise HelloRefused(refused[1], DropReason.ATTEMPT_REFUSED)
        try:
            attempt = self._store.open_or_create_attempt(RunIdentity(*key), layout, source="processor")
        except Exception as exc:  # noqa: BLE001 - whatever the file holds, only this run is refused
            why = f"run {key[0]}/{key[1]} refused: its attempt in {self._config.store} cannot be used ({exc})"
            self._refused[key] = (now + ATTEMPT_RETRY_S, why)
            self._status.refused_attempts[f"{key[0]}/{key[1]}"] = str(exc)[:500]
            log.error("%s", why)
            raise HelloRefused(why, DropReason.ATTEMPT_REFUSED) from None
        self._refused.pop(key, None)
        self._status.refused_attempts.pop(f"{key[0]}/{key[1]}", None)
        st = self._attempts[key] = AttemptState.open(attempt, layout, self._config)
        self._status.note_run(f"{key[0]}/{key[1]}", MAX_REFUSED)  # every run/attempt its ranks wrote (argus run says which)
        return st

    def let_go(self, conn: Connection, stopping: bool) -> None:
        """A connection closes: its rank leaves (ring, hang view, CPU timing, samplers);
        ``stopping``: the shutdown drained its ring already."""
        if conn.info is not None and conn.attempt_key in self._attempts:
            self._rings.release(conn, stopping=stopping)
            self._hangs.rank_left(conn)
        if conn.cpu_timed:
            self._cpu_time.remove(conn.token)
            conn.cpu_timed = False
        self._intake.sampled(self._samplers.rank_left(conn.token))

    def forget_idle(self, conns: Iterable[Connection]) -> None:
        """Let go of attempts that have had no rank, open window or pending write for
        ``ATTEMPT_IDLE_S`` (a rank that comes back reopens it from the store), and of expired
        refusals past ``MAX_REFUSED``: a processor that lives for weeks across many runs, or
        meets many run ids, holds only what it serves."""
        now = time.monotonic()
        busy = {c.attempt_key for c in conns if c.attempt_key is not None}
        for key, st in list(self._attempts.items()):
            if key in busy or st.assembler.windows or st.in_flight:
                st.idle_since = None
            elif st.idle_since is None:
                st.idle_since = now
            elif now - st.idle_since >= self._config.attempt_idle_s:
                del self._attempts[key]
                self._status.attempts_forgotten += 1
                log.info("attempt %s/%s idle for %.0f s: released", key[0], key[1], now - st.idle_since)
        if len(self._refused) > MAX_REFUSED:
            for key in [k for k, (retry_at, _) in self._refused.items() if retry_at <= now]:
                del self._refused[key]
                self._status.refused_attempts.pop(f"{key[0]}/{key[1]}", None)
