"""Where a closed window goes: the store, the TSDB sinks, Perfetto evidence.

Each destination is an exporter with the shape OpenTelemetry's SDK gives span exporters:
``export(window)``, ``flush()``, ``close()``. The writer thread hands every window to them in
order — the store first (a window is acknowledged only once it is on disk), then the TSDB
(best effort), then the evidence policy.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from argus.ingest.window import ClosedWindow, summarize
from argus.store import Attempt, AttemptWriter, WindowWriter
from argus.topology import Topology

__all__ = ["WindowExporter", "StoreExporter", "TsdbExporter", "EvidenceExporter", "window_job"]

log = logging.getLogger("argus.processor")


class WindowExporter(Protocol):
    def export(self, window: ClosedWindow) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class StoreExporter:
    """One attempt's store partition of this host (``WindowWriter``): the window's topology
    rows, then its tables as one unit, kernels compressed on the way."""

    def __init__(self, attempt: Attempt, writer_id: str, *, raw_kernels: bool = False, durable: bool = True):
        self.writer = WindowWriter(attempt, writer_id, raw_kernels=raw_kernels, durable=durable)

    @property
    def partition(self) -> AttemptWriter:
        """The partition itself, for the one-off tables (hangs, remote-write drops)."""
        return self.writer.writer

    def export(self, window: ClosedWindow) -> None:
        if window.topology_rows is not None:
            self.partition.write("topology", window.topology_rows, window=window.window)
        if window.summaries is None:
            window.summaries = summarize(window.data)
        window.rows = self.writer.write(window.data, window.summaries).rows

    def flush(self) -> None:
        pass  # every export is committed before it returns

    def close(self) -> None:
        pass


class TsdbExporter:
    """The TSDB sinks (``argus.tsdb.RemoteWriteSink``): a window is a queue append per sink;
    what the sinks dropped is recorded in the store's ``drops`` table of its attempt."""

    def __init__(self, sinks: list[Any], host: str, partitions: Callable[[], Mapping[tuple[str, str], AttemptWriter]],
                 flush_s: float):
        self.sinks = sinks
        self.host = host
        self._partitions = partitions  # the attempts served now: key → store partition
        self._flush_s = flush_s

    def start(self) -> None:
        for sink in self.sinks:
            sink.start()

    def export(self, window: ClosedWindow) -> None:
        job = window_job(window)
        for sink in self.sinks:
            sink.submit(job)
        partition = self._partitions().get(window.key)
        if partition is not None:
            self._store_drops(window.key, partition)

    def flush(self) -> None:
        pass  # the sinks send on their own threads; ``close`` waits for them

    def close(self) -> None:
        """Flush the sinks (bounded by ``flush_s``), then record their last drops."""
        for sink in self.sinks:
            sink.close(timeout_s=self._flush_s)
        for key, partition in self._partitions().items():
            try:
                self._store_drops(key, partition)
            except Exception as exc:  # noqa: BLE001 - shutting down: log, never raise
                log.warning("cannot record remote-write drops: %s", exc)

    def stats(self) -> list[dict[str, Any]]:
        return [sink.stats() for sink in self.sinks]

    def _store_drops(self, key: tuple[str, str], partition: AttemptWriter) -> None:
        rows = [(w, ev, b, reason) for sink in self.sinks for w, ev, b, reason in sink.take_drops(key)]
        if rows:
            partition.write("drops", {
                "window": [r[0] for r in rows], "rank": [-1] * len(rows), "host": [self.host] * len(rows),
                "table": ["remote_write"] * len(rows), "events": [r[1] for r in rows],
                "batches": [r[2] for r in rows], "reason": [r[3] for r in rows]}, window=max(r[0] for r in rows))


class EvidenceExporter:
    """Perfetto traces of chosen windows of one attempt, under ``evidence/<host>/`` with
    its retention. A trace costs a few ms to build: one is written when the window's steps are
    slow against the recent ones (what an analysis will want to open), else at most every
    ``interval_s``."""

    def __init__(self, attempt: Attempt, topology: Topology, host: str, *, interval_s: float, max_bytes: int,
                 max_age_s: float):
        self.attempt = attempt
        self.topology = topology  # the live table: ranks that join later are named too
        self.host = host
        self.interval_s = interval_s
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.last = float("-inf")  # monotonic time of the last evidence file
        self.recent: list[float] = []  # median step time of recent windows

    def export(self, window: ClosedWindow) -> None:
        if self.due(window):
            self.write(window)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def due(self, window: ClosedWindow) -> bool:
        data = window.data
        step_s = float("nan")
        if data.steps is not None and data.steps.num_rows:
            import numpy as np

            d = (data.steps.column("end_ns").to_numpy() - data.steps.column("start_ns").to_numpy()) / 1e9
            step_s = float(np.median(d)) if d.size else float("nan")
        recent = self.recent
        slow = bool(recent) and step_s == step_s and step_s > 1.3 * sorted(recent)[len(recent) // 2]
        if step_s == step_s:
            recent.append(step_s)
            del recent[:-32]
        now = time.monotonic()
        if slow or now - self.last >= self.interval_s:
            self.last = now
            return True
        return False

    def write(self, window: ClosedWindow) -> Path | None:
        try:
            from argus.evidence import enforce_retention, write_perfetto_trace
        except ImportError:  # evidence module not available: keep summaries flowing
            return None
        data = window.data
        directory = self.attempt.path / "evidence" / self.host
        directory.mkdir(parents=True, exist_ok=True)
        hosts = {int(r): str(h) for r, h in enumerate(self.topology.hosts) if h != "unknown"}
        path = directory / f"{data.window:09d}-{os.urandom(4).hex()}.pftrace"
        write_perfetto_trace(path, phases=data.phases, kernels=data.kernels, hosts=hosts,
                             title=f"{self.attempt.identity.run_id} window {data.window} ({self.host})")
        enforce_retention(directory, max_bytes=self.max_bytes, max_age_s=self.max_age_s)
        return path


def window_job(window: ClosedWindow) -> Any:
    """The TSDB sinks' view of a closed window (``argus.tsdb.WindowJob``): its tables are shared,
    not copied. Built here, so the pipeline depends on the tsdb package and never the reverse;
    imported on first use: the TSDB path is optional."""
    from argus.tsdb import WindowJob

    d, summaries = window.data, window.summaries
    return WindowJob(run_id=window.run.run_id, attempt_id=window.run.attempt_id, host=window.host,
                     layout=window.layout, ranks={r: (p.host, p.local_rank, p.gpu_uuid) for r, p in window.ranks.items()},
                     window=d.window, start_step=d.start_step, end_step=d.end_step, steps=d.steps, phases=d.phases,
                     hw=d.hw, drops=d.drops, summaries=summaries.summaries if summaries is not None else None,
                     sketches=summaries.sketches if summaries is not None else None)
