"""The per-host processor daemon: ingest ranks' batches, window them, compress, write.

The daemon is the composition of the parts, each in its own module: it builds them, runs the
loop (poll the sockets, then one cycle over the parts) and stops them in order.

* ``connections.py`` — the ``selectors`` loop's sockets: accept, admission limits, frames;
* ``rings.py`` — the ranks' shared-memory rings, drained every cycle;
* ``hang_patrol.py`` — live hang detection over the rings' in-flight blocks;
* ``samplers.py`` — the processor's own samplers (py-spy stacks, NVML, host counters) on
  their threads, their records handed to the loop through a queue it drains each cycle;
* ``attempts.py`` — per run attempt: the window assembler, the rank table, its exporters;
* ``admission.py`` — HELLO: a rank admitted into its attempt (opened or created) or refused;
  a rank let go when its connection closes; idle attempts released;
* ``dispatch.py`` — the protocol: each client frame (HELLO, names, records, drops, FLUSH, BYE)
  to its handler;
* ``intake.py`` — records (sockets, rings, samplers) and drops into their ranks' windows;
* ``handoff.py`` — closed windows to the writer; what goes back to the ranks (ACKs, the
  samplers' CONTROL requests);
* ``writer.py`` — the writer thread: closed windows (``argus.ingest.ClosedWindow``) through
  the store, TSDB and evidence exporters, so a slow disk never stalls ingestion; the hand-off
  queue is bounded and what cannot be held is dropped and counted;
* ``status.py`` — the status file, one typed record, and its snapshot.

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
from typing import Any

from argus.ingest import TsdbExporter
from argus.processor.admission import Admission
from argus.processor.attempts import AttemptKey, AttemptState, partitions
from argus.processor.config import ProcessorConfig
from argus.processor.connection import Connection
from argus.processor.connections import Connections
from argus.processor.cpu_time import CpuTimeSampler
from argus.processor.dispatch import Dispatch
from argus.processor.handoff import Handoff
from argus.processor.hang_patrol import HangPatrol
from argus.processor.hardware import HardwareSampler
from argus.processor.host_counters import HostCountersSampler
from argus.processor.intake import Intake
from argus.processor.rings import Rings
from argus.processor.samplers import Sampler, Samplers
from argus.processor.stacks import StackSampler
from argus.processor.status import FlushProgress, ProcessorStatus, liveness, status_path
from argus.processor.writer import WriterThread
from argus.store import Store

__all__ = ["ProcessorConfig", "Processor"]

log = logging.getLogger("argus.processor")


class Processor:
    """Run with :meth:`serve_forever`; stop with :meth:`stop` (or SIGTERM)."""

    def __init__(self, config: ProcessorConfig):
        self.config = config
        self.store = Store.create(config.store)
        self._stop = threading.Event()
        self._stopping = False
        self._attempts: dict[AttemptKey, AttemptState] = {}
        self.status = ProcessorStatus(started=time.time(), pid=os.getpid(), host=config.host,
                                      socket=str(config.socket_path))
        self._last_status = 0.0
        self._samplers = Samplers(_own_samplers(config))
        self._cpu_time = CpuTimeSampler()  # CPU ops timed in CPU time (cpu_time.py)
        # the rings feed the intake, which tells the hang patrol (which reads the rings) of steps
        self._rings = Rings(self.status, lambda *batch: self._intake.records(*batch),
                            lambda *drop: self._intake.note_drop(*drop))
        self._patrol = HangPatrol(config.hang, config.host, config.py_spy, self._rings, self.status)
        self._hangs = self._patrol.watch
        self._intake = Intake(self.status, self._attempts, self._cpu_time, self._samplers, self._hangs)
        self._admission = Admission(config, self.store, self.status, self._attempts, self._rings, self._cpu_time,
                                    self._samplers, self._hangs, self._intake)
        self._connections = Connections(config, self.status, lambda *frame: self._dispatch(*frame),
                                        lambda conn: self._admission.let_go(conn, stopping=self._stopping),
                                        self._intake.note_drop)
        self._liveness: Any = None
        self._tsdb: TsdbExporter | None = None
        if config.remote_write:  # imported only when asked for: the TSDB path is optional
            from argus.tsdb import RemoteWriteSink

            from argus.tsdb.sink import Liveness

            self._liveness = Liveness(config.host)  # replaced by the loop; read by the sinks' threads
            self._tsdb = TsdbExporter([RemoteWriteSink(c, liveness=lambda: self._liveness) for c in config.remote_write],
                                      config.host, lambda: partitions(self._attempts), config.remote_write_flush_s)
        self._writer = WriterThread(config.queue_windows, self._attempts, self._tsdb, self.status,
                                    self._connections.wake)
        self._handoff = Handoff(config.host, self._attempts, self._writer, self.status, self._connections)
        self._dispatch = Dispatch(self._admission, self._intake, self._handoff,
                                  lambda conn: self._connections.close(conn, reason=None))

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

    def _cycle(self) -> None:
        self._connections.resume_accept()
        self._connections.sweep()
        for conn in self._connections.values():
            if conn.ring is not None:
                self._rings.drain(conn)
        self._patrol.check(self._conns.values(), self._attempts, self._handoff.send)
        self._intake.sampled(self._samplers.collect(time.time_ns()))
        self._handoff.send_controls(self._samplers.take_controls())
        for conn in self._connections.values():
            if conn.tx:
                conn.push()
        self._handoff.close_ready()
        self._handoff.acknowledge()
        self._admission.forget_idle(self._conns.values())
        self._write_status()

    def _shutdown(self) -> None:
        self._stopping = True
        for conn in self._connections.values():
            self._connections.drain(conn)
            self._rings.drain(conn, final=True)
        self._intake.sampled(self._samplers.close(time.time_ns()))
        self._handoff.close_all(self._heartbeat)
        self._writer.put_stopping(None, self._heartbeat)
        self._writer.join(self._heartbeat)
        self._heartbeat(busy_s=self.config.remote_write_flush_s if self._tsdb is not None else 0.0)
        if self._tsdb is not None:
            self._tsdb.close()
        self._handoff.acknowledge()
        for conn in self._connections.values():
            self._connections.close(conn, reason=None)
        self._connections.close_listener(self.config.socket_path)
        self._rings.reap()
        self._cpu_time.stop()
        self.status.stopping = None
        self._write_status(force=True)
        self._connections.close_wake()
        log.info("processor stopped: %d windows written", self.status.windows_written)

    # -- the glue ------------------------------------------------------------------------
    def _heartbeat(self, busy_s: float = 0.0) -> None:
        """The status file while flushing at shutdown: ``argus run`` reads its progress
        (windows written, windows left) to tell a slow flush from a stuck processor;
        ``busy_until`` covers a bounded wait in which no window moves (TSDB sinks)."""
        self._handoff.acknowledge()
        self.status.stopping = FlushProgress(windows_left=self._handoff.windows_left(), busy_until=time.time() + busy_s)
        self._write_status(force=True)

    def _write_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_status < self.config.status_interval_s:
            return
        self._last_status = now
        conns = self._connections.values()
        for conn in conns:
            self._rings.note_producer_cpu(conn)
        if self._tsdb is not None:
            self._liveness = liveness(self.config.host, conns, self._attempts, self._hangs.last_step_wall,
                                      self._handoff.last_window_wall)
        self.status.take_snapshot(self.config, self._attempts, conns, self._connections.pending_bytes, self._samplers,
                                  self._tsdb)
        self.status.write(status_path(self.config.store, self.config.host))


def _own_samplers(config: ProcessorConfig) -> list[Sampler]:
    """The processor's own samplers: py-spy stacks (first), NVML, host counters, as configured."""
    samplers: list[Sampler] = [HardwareSampler(interval_s=config.hw_interval_s)]
    if config.host_counters:
        samplers.append(HostCountersSampler(interval_s=config.hw_interval_s, root=config.host_root))
    if config.stacks:
        samplers.insert(0, StackSampler(hz=config.stack_hz, suspect_hz=config.suspect_stack_hz,
                                        py_spy=config.py_spy))
    return samplers
