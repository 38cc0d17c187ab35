"""The per-host processor daemon: ingest ranks' batches, window them, compress, write.

The daemon is the composition of the parts, each in its own module, and the protocol that
joins them (HELLO, names, records, drops, FLUSH, BYE):

* ``connections.py`` — the ``selectors`` loop's sockets: accept, admission limits, frames;
* ``rings.py`` — the ranks' shared-memory rings, drained every cycle;
* ``hang_patrol.py`` — live hang detection over the rings' in-flight blocks;
* ``samplers.py`` — the processor's own samplers (py-spy stacks, NVML, host counters) on
  their threads, their records handed to the loop through a queue it drains each cycle;
* ``attempts.py`` — per run attempt: the window assembler, the rank table, its exporters;
* ``writer.py`` — the writer thread: closed windows (``argus.ingest.ClosedWindow``) through
  the store, TSDB and evidence exporters, so a slow disk never stalls ingestion; the hand-off
  queue is bounded and what cannot be held is dropped and counted;
* ``status.py`` — the status file, one typed record.

Failure model: a rank that disconnects or sends a malformed frame is logged and dropped;
the others continue. SIGTERM/SIGINT flush every open window before exit. A crash loses at
most the open windows: every closed window is on disk before it is acknowledged.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from argus.errors import ArgusError, ProtocolError
from argus.ingest import TsdbExporter
from argus.processor.assembler import RankInfo
from argus.processor.attempts import AttemptState
from argus.processor.config import ProcessorConfig
from argus.processor.connection import Connection, parse_names
from argus.processor.connections import Connections
from argus.processor.cpu_time import CpuTimeSampler
from argus.processor.hang_patrol import HangPatrol
from argus.processor.hardware import HardwareSampler
from argus.processor.host_counters import HostCountersSampler
from argus.processor.limits import ATTEMPT_RETRY_S, MAX_REFUSED, DropReason, HelloRefused
from argus.processor.samplers import Output, Samplers
from argus.processor.rings import Rings
from argus.processor.stacks import StackSampler
from argus.processor.status import FlushProgress, ProcessorStatus, status_path
from argus.processor.writer import WriterThread
from argus.store import Store
from argus.topology import RunIdentity, parse_layout
from argus.wire import DROP_TABLES, KINDS, TABLES_BY_MSG, Msg, decode_array, decode_json, encode_json
from argus.wire.hello import Hello, parse_hello

__all__ = ["ProcessorConfig", "Processor"]

log = logging.getLogger("argus.processor")


_CPU_OP = KINDS.index("cpu_op")


class Processor:
    """Run with :meth:`serve_forever`; stop with :meth:`stop` (or SIGTERM)."""

    def __init__(self, config: ProcessorConfig):
        self.config = config
        self.store = Store.create(config.store)
        self._stop = threading.Event()
        self._attempts: dict[tuple[str, str], AttemptState] = {}
        self.status = ProcessorStatus(started=time.time(), pid=os.getpid(), host=config.host,
                                      socket=str(config.socket_path))
        self._connections = Connections(config, self.status, self._dispatch, self._let_go, self._note_drop)
        self._refused: dict[tuple[str, str], tuple[float, str]] = {}  # attempt → (retry at, why)
        self._last_status = 0.0
        self._last_window_wall = 0.0
        self._liveness: Any = None
        samplers: list[Any] = [HardwareSampler(interval_s=config.hw_interval_s)]
        if config.host_counters:
            samplers.append(HostCountersSampler(interval_s=config.hw_interval_s, root=config.host_root))
        if config.stacks:
            samplers.insert(0, StackSampler(hz=config.stack_hz, suspect_hz=config.suspect_stack_hz,
                                            py_spy=config.py_spy))
        self._samplers = Samplers(samplers)
        self._rings = Rings(self.status, self._records, self._note_drop)
        self._patrol = HangPatrol(config.hang, config.host, config.py_spy, self._rings, self.status)
        self._hangs = self._patrol.watch
        self._cpu_time = CpuTimeSampler()  # CPU ops timed in CPU time (cpu_time.py)
        self._stopping = False
        self._tsdb: TsdbExporter | None = None
        if config.remote_write:  # imported only when asked for: the TSDB path is optional
            from argus.tsdb import RemoteWriteSink

            from argus.tsdb.sink import Liveness

            self._liveness = Liveness(config.host)  # replaced by the loop; read by the sinks' threads
            self._tsdb = TsdbExporter([RemoteWriteSink(c, liveness=lambda: self._liveness) for c in config.remote_write],
                                      config.host, self._partitions, config.remote_write_flush_s)
        self._writer = WriterThread(config.queue_windows, self._attempts, self._tsdb, self.status,
                                    self._connections.wake)

    @property
    def _conns(self) -> dict[int, Connection]:
        return self._connections.by_fd

    @property
    def _pending_bytes(self) -> int:
        return self._connections.pending_bytes

    # -- lifecycle -----------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _listen(self) -> None:
        self._connections.listen()

    def _partitions(self) -> dict[tuple[str, str], Any]:
        """The store partition of every attempt served now (where TSDB drops are recorded)."""
        return {key: st.store.partition for key, st in self._attempts.items()}

    def serve_forever(self) -> None:
        self._preload()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.status.startup_cpu_s = round(ru.ru_utime + ru.ru_stime, 3)  # imports: paid once per host
        self._listen()
        self._writer.start()
        self._samplers.start()
        if self._tsdb is not None:
            self._tsdb.start()
        log.info("processor on %s writing %s (host %s)", self.config.socket_path, self.config.store, self.config.host)
        try:
            while not self._stop.is_set():
                self._connections.poll(0.1)
                self._cycle()
        finally:
            self._shutdown()

    def _preload(self) -> None:
        """Import what the writer needs before the first window, not in it: the compression
        brings in scipy (~0.4 CPU-s, once per process), which otherwise stalls the first
        window's write and shares the GIL with ingest while it runs."""
        import argus.compress

        if self.config.evidence:
            import argus.evidence  # noqa: F401

    def _shutdown(self) -> None:
        self._stopping = True
        for conn in self._connections.values():
            self._connections.drain(conn)
            self._rings.drain(conn, final=True)
        self._feed(self._samplers.close(time.time_ns()))
        for key, st in self._attempts.items():
            for idx in st.assembler.ready({}, final=True):
                self._enqueue(key, idx, block=True)
        self._writer.put_stopping(None, self._heartbeat)
        self._writer.join(self._heartbeat)
        self._heartbeat(busy_s=self.config.remote_write_flush_s if self._tsdb is not None else 0.0)
        if self._tsdb is not None:
            self._tsdb.close()
        self._handle_done()
        for conn in self._connections.values():
            self._connections.close(conn, reason=None)
        self._connections.close_listener(self.config.socket_path)
        self._rings.reap()
        self._cpu_time.stop()
        self.status.stopping = None
        self._write_status(force=True)
        self._connections.close_wake()
        log.info("processor stopped: %d windows written", self.status.windows_written)

    # -- the protocol ------------------------------------------------------------------------
    def _dispatch(self, conn: Connection, msg: Msg, payload: bytes) -> None:
        """One complete frame of a client (``Connections`` drops the client if this raises)."""
        if msg == Msg.HELLO:
            try:
                hello = parse_hello(decode_json(payload))
            except ProtocolError as exc:
                raise HelloRefused(str(exc)) from None
            self._hello(conn, hello)
            return
        if conn.info is None:
            raise ProtocolError(f"{msg.name} before HELLO")
        if msg == Msg.NAMES:
            conn.add_names(parse_names(decode_json(payload), len(conn.id_map)))
        elif msg in TABLES_BY_MSG:
            self._records(conn, msg, decode_array(msg, payload))
        elif msg == Msg.DROPS:
            for row in decode_array(msg, payload):
                table = DROP_TABLES[min(int(row["table"]), len(DROP_TABLES) - 1)]
                self._note_drop(conn, table, max(int(row["events"]), 0), max(int(row["batches"]), 0),
                                "producer_buffer_full")
        elif msg == Msg.FLUSH:
            doc = decode_json(payload)
            seq = doc.get("seq") if isinstance(doc, dict) else None
            if type(seq) is not int or not 0 <= seq < 1 << 63:
                raise ProtocolError(f"FLUSH seq must be a non-negative 64-bit integer, not {seq!r:.40}")
            key = conn.attempt_key
            assert key is not None  # set with conn.info
            st = self._attempts[key]
            pending = {(key, w) for w in st.assembler.force_all()}
            conn.flushes.append((seq, pending))
            self._maybe_ack_flushes(conn)
        elif msg == Msg.BYE:
            self._connections.close(conn, reason=None)
        else:
            raise ProtocolError(f"unexpected {msg.name} from a client")

    def _records(self, conn: Connection, msg: Msg, records: np.ndarray) -> None:
        """One batch of a rank's records (from its socket or its ring) into the windows."""
        conn.map_names(msg, records)
        if msg == Msg.KERNELS and conn.cpu_timed:
            ops = records["kind"] == _CPU_OP
            if ops.any():
                cpu = self._cpu_time.cpu_durations(conn.token, records["start_ns"][ops], records["dur_ns"][ops])
                if cpu is not None:
                    self.status.cpu_ops_cpu_timed += int(ops.sum())
                    self.status.cpu_ops_wall_ns += int(records["dur_ns"][ops].sum())
                    self.status.cpu_ops_cpu_ns += int(cpu.sum())
                    records["dur_ns"][ops] = cpu
        st = self._attempts[conn.attempt_key]  # type: ignore[index]
        st.assembler.add(conn.info, msg, records)
        self.status.events += len(records)
        if msg == Msg.STEPS:
            self._samplers.steps_reported(conn.token, records)
            self._hangs.steps_reported(conn.attempt_key, records)

    def _hello(self, conn: Connection, hello: Hello) -> None:
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
        st.topology.hosts[rank] = hello.host or self.config.host
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
        self.status.ranks_seen += 1
        if hello.pid is not None:  # argus run's job log names a line's rank by its pid (NCCL's prefix)
            pids = self.status.rank_pids
            if len(pids) < 4096:
                pids[str(hello.pid)] = rank
        log.info("rank %d of %s/%s connected (pid %s)", rank, key[0], key[1], hello.pid)

    def _open_attempt(self, key: tuple[str, str], layout: Any) -> AttemptState:
        """The run's attempt (opened or created); a corrupt, foreign or differing
        ``attempt.json`` refuses the run (logged once per ``ATTEMPT_RETRY_S``), never the daemon."""
        now = time.monotonic()
        refused = self._refused.get(key)
        if refused is not None and now < refused[0]:
            raise HelloRefused(refused[1], DropReason.ATTEMPT_REFUSED)
        try:
            attempt = self.store.open_or_create_attempt(RunIdentity(*key), layout, source="processor")
        except Exception as exc:  # noqa: BLE001 - whatever the file holds, only this run is refused
            why = f"run {key[0]}/{key[1]} refused: its attempt in {self.config.store} cannot be used ({exc})"
            self._refused[key] = (now + ATTEMPT_RETRY_S, why)
            self.status.refused_attempts[f"{key[0]}/{key[1]}"] = str(exc)[:500]
            log.error("%s", why)
            raise HelloRefused(why, DropReason.ATTEMPT_REFUSED) from None
        self._refused.pop(key, None)
        self.status.refused_attempts.pop(f"{key[0]}/{key[1]}", None)
        st = self._attempts[key] = AttemptState.open(attempt, layout, self.config)
        self.status.note_run(f"{key[0]}/{key[1]}", MAX_REFUSED)  # every run/attempt its ranks wrote (argus run says which)
        return st

    def _let_go(self, conn: Connection) -> None:
        """A connection closes: its rank leaves (ring, hang view, CPU timing, samplers)."""
        if conn.info is not None and conn.attempt_key in self._attempts:
            self._rings.release(conn, stopping=self._stopping)
            self._hangs.rank_left(conn)
        if conn.cpu_timed:
            self._cpu_time.remove(conn.token)
            conn.cpu_timed = False
        self._feed(self._samplers.rank_left(conn.token))

    def _note_drop(self, conn: Connection, table: str, events: int, batches: int, reason: str) -> None:
        key = conn.attempt_key  # a client that never said HELLO is counted here, not in another run
        if key is None or key not in self._attempts:
            self.status.drops_before_hello += max(events, batches)
            return
        rank = conn.info.rank if conn.info else -1
        self._attempts[key].assembler.note_drop(-1, rank, table, events, batches, reason)

    def _active(self, key: tuple[str, str]) -> dict[int, RankInfo]:
        return {c.info.rank: c.info for c in self._conns.values() if c.attempt_key == key and c.info}

    # -- samplers ------------------------------------------------------------------------
    def _feed(self, outputs: list[Output]) -> None:
        """Give the samplers' records to their ranks' windows (main thread only)."""
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
            self.status.sampled_records += len(records)

    def _control(self) -> None:
        """Send the samplers' requests (``Msg.CONTROL``) to their ranks."""
        for token, doc in self._samplers.take_controls():
            conn = next((c for c in self._conns.values() if c.token == token), None)
            if conn is not None:
                self._send(conn, encode_json(Msg.CONTROL, doc))
                self.status.controls_sent += 1

    # -- windows -------------------------------------------------------------------------
    def _cycle(self) -> None:
        self._connections.resume_accept()
        self._connections.sweep()
        for conn in list(self._conns.values()):
            if conn.ring is not None:
                self._rings.drain(conn)
        self._patrol.check(self._conns.values(), self._attempts, self._send)
        self._feed(self._samplers.collect(time.time_ns()))
        self._control()
        for conn in list(self._conns.values()):
            if conn.tx:
                conn.push()
        for key, st in self._attempts.items():
            for idx in st.assembler.ready(self._active(key), final=not self._active(key)):
                if not self._enqueue(key, idx, block=False):
                    break
        self._handle_done()
        self._forget_idle()
        self._write_status()

    def _forget_idle(self) -> None:
        """Let go of attempts that have had no rank, open window or pending write for
        ``ATTEMPT_IDLE_S`` (a rank that comes back reopens it from the store), and of expired
        refusals past ``MAX_REFUSED``: a processor that lives for weeks across many runs, or
        meets many run ids, holds only what it serves."""
        now = time.monotonic()
        busy = {c.attempt_key for c in self._conns.values() if c.attempt_key is not None}
        for key, st in list(self._attempts.items()):
            if key in busy or st.assembler.windows or st.in_flight:
                st.idle_since = None
            elif st.idle_since is None:
                st.idle_since = now
            elif now - st.idle_since >= self.config.attempt_idle_s:
                del self._attempts[key]
                self.status.attempts_forgotten += 1
                log.info("attempt %s/%s idle for %.0f s: released", key[0], key[1], now - st.idle_since)
        if len(self._refused) > MAX_REFUSED:
            for key in [k for k, (retry_at, _) in self._refused.items() if retry_at <= now]:
                del self._refused[key]
                self.status.refused_attempts.pop(f"{key[0]}/{key[1]}", None)

    def _enqueue(self, key: tuple[str, str], index: int, block: bool) -> bool:
        """Hand a closed window to the writer; when the writer is behind (and not shutting
        down) the window stays buffered, and the assembler's memory cap counts what it drops."""
        if not block and self._writer.full:
            return False
        st = self._attempts[key]
        window = st.close_window(index, self.config.host)
        st.in_flight += 1
        if block:
            self._writer.put_stopping(window, self._heartbeat)
        else:
            self._writer.offer(window)  # only this thread puts: there is room
        return True

    def _heartbeat(self, busy_s: float = 0.0) -> None:
        """The status file while flushing at shutdown: ``argus run`` reads its progress
        (windows written, windows left) to tell a slow flush from a stuck processor;
        ``busy_until`` covers a bounded wait in which no window moves (TSDB sinks)."""
        self._handle_done()
        self.status.stopping = FlushProgress(
            windows_left=self._writer.backlog + sum(len(st.assembler.windows) for st in self._attempts.values()),
            busy_until=time.time() + busy_s)
        self._write_status(force=True)

    def _handle_done(self) -> None:
        for done in self._writer.written():
            st = self._attempts.get(done.key)
            if st is not None:
                st.in_flight -= 1
            if done.rows is None:
                continue
            ack = done.ack()
            self.status.note_ack(ack)
            self._last_window_wall = time.time()
            for conn in list(self._conns.values()):
                if conn.attempt_key != done.key or conn.info is None:
                    continue
                if conn.info.rank in done.ranks:
                    self._send(conn, encode_json(Msg.ACK, ack))
                for _, pending in conn.flushes:
                    pending.discard((done.key, done.window))
                self._maybe_ack_flushes(conn)

    def _maybe_ack_flushes(self, conn: Connection) -> None:
        done = [seq for seq, pending in conn.flushes if not pending]
        conn.flushes = [(s, p) for s, p in conn.flushes if p]
        for seq in done:
            self._send(conn, encode_json(Msg.ACK, {"seq": seq}))

    def _send(self, conn: Connection, frame: bytes) -> None:
        if not conn.send(frame):
            self.status.acks_dropped += 1  # a client that stopped reading loses ACKs, nothing else

    def _note_liveness(self) -> None:
        """The snapshot the sinks' heartbeats send (built here, on the loop's thread)."""
        from argus.tsdb.sink import Liveness

        connected: dict[tuple[str, str], int] = {}
        for conn in self._conns.values():
            if conn.info is not None and conn.attempt_key is not None:
                connected[conn.attempt_key] = connected.get(conn.attempt_key, 0) + 1
        runs = tuple((run, attempt, connected.get((run, attempt), 0), self._hangs.last_step_wall.get((run, attempt), 0.0))
                     for run, attempt in sorted(set(self._attempts) | set(connected)))
        self._liveness = Liveness(self.config.host, runs, sum(st.in_flight for st in self._attempts.values()),
                                  self._last_window_wall)

    def _write_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status < self.config.status_interval_s:
            return
        self._last_status = now
        for conn in self._conns.values():
            self._rings.note_producer_cpu(conn)
        if self._tsdb is not None:
            self._note_liveness()
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        s = self.status
        s.cpu_s = round(own.ru_utime + own.ru_stime, 3)
        s.children_cpu_s = round(children.ru_utime + children.ru_stime, 3)  # py-spy
        s.updated = time.time()
        s.open_windows = {f"{k[0]}/{k[1]}": sorted(st.assembler.windows) for k, st in self._attempts.items()}
        s.buffered_events = sum(st.assembler.buffered_events for st in self._attempts.values())
        s.pending_frame_bytes = self._pending_bytes
        s.open_connections = len(self._conns)
        s.samplers = self._samplers.status()
        s.config = {k: str(v) for k, v in asdict(self.config).items()}
        if self._tsdb is not None:
            s.remote_write = self._tsdb.stats()
        s.write(status_path(self.config.store, self.config.host))
