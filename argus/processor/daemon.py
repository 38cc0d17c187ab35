"""The per-host processor daemon: ingest ranks' batches, window them, compress, write.

One thread runs a ``selectors`` loop over a unix socket: it accepts ranks, reassembles
frames and decodes them with ``np.frombuffer`` into the window assembler. A second thread
writes closed windows (compression, Parquet, Perfetto evidence) so a slow disk never stalls
ingestion; the hand-off queue is bounded and what cannot be held is dropped and counted.
The processor's own samplers (stacks with py-spy, GPU telemetry with NVML; ``samplers.py``)
run on their own threads and hand their records to the loop through a queue it drains each
cycle; their strings go into the ranks' name tables, so a client's name ids are mapped to
table indices once the two interleave.

Failure model: a rank that disconnects or sends a malformed frame is logged and dropped;
the others continue. SIGTERM/SIGINT flush every open window before exit. A crash loses at
most the open windows: every closed window is on disk before it is acknowledged.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import selectors
import signal
import socket
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
from argus.processor.cpu_time import CpuTimeSampler
from argus.processor.hang_patrol import HangPatrol
from argus.processor.hardware import HardwareSampler
from argus.processor.host_counters import HostCountersSampler
from argus.processor.limits import ACCEPT_BACKOFF_S, ATTEMPT_RETRY_S, MAX_REFUSED, DropReason, HelloRefused, drop_reason
from argus.processor.listener import listen
from argus.processor.samplers import Output, Samplers
from argus.processor.rings import Rings
from argus.processor.stacks import StackSampler
from argus.processor.status import FlushProgress, ProcessorStatus, status_path
from argus.processor.writer import WriterThread
from argus.store import Store
from argus.topology import RunIdentity, parse_layout
from argus.wire import DROP_TABLES, KINDS, TABLES_BY_MSG, Msg, decode_array, decode_json, encode_json
from argus.wire.client import peer_uid
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
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, Connection] = {}
        self._attempts: dict[tuple[str, str], AttemptState] = {}
        self.status = ProcessorStatus(started=time.time(), pid=os.getpid(), host=config.host,
                                      socket=str(config.socket_path))
        self._pending_bytes = 0  # bytes of unfinished frames over all connections
        self._rx = bytearray(1 << 20)  # every socket read lands here first (one loop thread)
        self._rx_view = memoryview(self._rx)
        self._accept_paused_until = 0.0  # fd exhaustion: the listener rests until then
        self._refused: dict[tuple[str, str], tuple[float, str]] = {}  # attempt → (retry at, why)
        self._next_sweep = 0.0
        # the writer wakes the loop when a window is on disk, so its ACK leaves at once
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._last_status = 0.0
        self._last_window_wall = 0.0
        self._liveness: Any = None
        self._listener: socket.socket | None = None
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
        self._writer = WriterThread(config.queue_windows, self._attempts, self._tsdb, self.status, self._wake)

    # -- lifecycle -----------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _listen(self) -> None:
        self._listener = listen(self.config.socket_path)
        self._sel.register(self._listener, selectors.EVENT_READ, None)

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
                self._poll(0.1)
                self._cycle()
        finally:
            self._shutdown()

    def _preload(self) -> None:
        """Import what the writer needs before the first window, not in it: the compression
        brings in scipy (~0.4 CPU-s, once per process), which otherwise stalls the first
        window's write and shares the GIL with ingest while it runs."""
        import argus.compress  # noqa: F401

        if self.config.evidence:
            import argus.evidence  # noqa: F401

    def _shutdown(self) -> None:
        self._stopping = True
        for conn in list(self._conns.values()):
            self._drain(conn)
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
        for conn in list(self._conns.values()):
            self._close(conn, reason=None)
        if self._listener is not None:
            if not self._accept_paused_until:  # while paused (fd exhaustion) it is not registered
                self._sel.unregister(self._listener)
            self._listener.close()
            try:
                self.config.socket_path.unlink()
            except FileNotFoundError:
                pass
        self._rings.reap()
        self._cpu_time.stop()
        self.status.stopping = None
        self._write_status(force=True)
        self._sel.unregister(self._wake_r)
        self._wake_r.close()
        self._wake_w.close()
        log.info("processor stopped: %d windows written", self.status.windows_written)

    # -- socket loop ---------------------------------------------------------------------
    def _poll(self, timeout: float) -> None:
        for key, _ in self._sel.select(timeout):
            if key.data == "wake":
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
                self.status.accept_errors += 1
                if self.status.accept_errors in (1, 10, 100, 1000):
                    log.warning("cannot accept a connection (%s); pausing %.1f s", errno.errorcode.get(
                        exc.errno or 0, exc), ACCEPT_BACKOFF_S)
                self._sel.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + ACCEPT_BACKOFF_S
                return
            self.status.connections += 1
            try:
                uid = peer_uid(sock)
            except OSError:
                uid = None
            if uid is not None and os.getuid() != 0 and uid != os.getuid():
                self._count_drop(DropReason.FOREIGN_PEER)
                sock.close()
                continue
            if len(self._conns) >= self.config.max_connections:
                self._count_drop(DropReason.TOO_MANY_CONNECTIONS)
                sock.close()
                continue
            sock.setblocking(False)
            conn = Connection(sock)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _resume_accept(self) -> None:
        if self._accept_paused_until and time.monotonic() >= self._accept_paused_until and self._listener:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, None)

    def _count_drop(self, reason: DropReason) -> bool:
        """Count a dropped client; True when it is worth a log line (the first ten of a reason,
        then every power of ten: a flood of hostile clients does not fill the log)."""
        n = self.status.count_drop(str(reason))
        return n <= 10 or str(n).strip("0") == "1"

    def _sweep(self) -> None:
        """Close connections that never said HELLO within ``hello_timeout_s``."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(1.0, self.config.hello_timeout_s / 2)
        for conn in [c for c in self._conns.values() if c.info is None and now - c.since > self.config.hello_timeout_s]:
            self._count_drop(DropReason.HELLO_TIMEOUT)
            self._close(conn, reason=None)

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
            self._close(conn, reason="disconnected")
            return
        conn.rx.feed(bytes(self._rx_view[:got]))
        self._drain(conn)
        if conn.sock.fileno() < 0:
            return
        self._pending_bytes += conn.rx.pending_bytes - conn.held
        conn.held = conn.rx.pending_bytes
        if self._pending_bytes > self.config.max_pending_frame_bytes:
            if self._count_drop(DropReason.FRAME_BUDGET):
                log.warning("%s holds %d bytes of an unfinished frame with %d held in all (limit %d); dropping it",
                            conn.who, conn.held, self._pending_bytes, self.config.max_pending_frame_bytes)
            self._note_drop(conn, "frames", 0, 1, "frame_budget")
            self._close(conn, reason=None)

    def _drain(self, conn: Connection) -> None:
        """Handle every complete frame in the connection's buffer."""
        try:
            for msg, payload in conn.rx.frames():
                if conn.sock.fileno() < 0:
                    return
                self.status.frames += 1
                self._dispatch(conn, msg, payload)
        except Exception as exc:  # noqa: BLE001 - whatever a client causes drops that client only
            reason = drop_reason(exc)
            self.status.garbage_frames += 1
            if not self._count_drop(reason):
                pass
            elif reason == DropReason.INTERNAL:
                log.exception("frame from %s failed (%r); dropping the connection", conn.who, exc)
            else:
                log.warning("%s from %s (%s); dropping the connection (%d so far)", reason, conn.who, exc,
                            self.status.dropped_clients[str(reason)])
            try:
                self._note_drop(conn, "frames", 0, 1, "malformed")
            except Exception:  # noqa: BLE001
                pass
            conn.rx.clear()
            self._close(conn, reason=None)

    def _dispatch(self, conn: Connection, msg: Msg, payload: bytes) -> None:
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
            self._close(conn, reason=None)
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

    def _close(self, conn: Connection, reason: str | None) -> None:
        if conn.info is not None and conn.attempt_key in self._attempts:
            self._rings.release(conn, stopping=self._stopping)
            self._hangs.rank_left(conn)
        if conn.cpu_timed:
            self._cpu_time.remove(conn.token)
            conn.cpu_timed = False
        self._feed(self._samplers.rank_left(conn.token))
        if conn.sock.fileno() in self._conns:
            self._sel.unregister(conn.sock)
            del self._conns[conn.sock.fileno()]
        if reason == "disconnected":
            self.status.disconnects += 1
            if conn.rx.pending_bytes:  # a batch cut off mid-frame
                self._note_drop(conn, "frames", 0, 1, "disconnected")
            if conn.info is not None:
                log.warning("rank %d disconnected", conn.info.rank)
        self._pending_bytes -= conn.held
        conn.held = 0
        conn.rx.clear()
        conn.sock.close()

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
        self._resume_accept()
        self._sweep()
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

    def _wake(self) -> None:
        """The writer wakes the loop when a window is on disk, so its ACK leaves at once."""
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (the loop is behind anyway) or closed at shutdown
            pass

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
