"""One window of one writer's data, and the single path that writes it to the store.

The live processor and the offline importers both end here, so a store looks the same
whichever way it was filled: steps, phases, stacks and hardware samples as they came;
kernel events as the ``kernel_summaries`` and ``kernel_sketches`` they were compressed into
(and kept raw only when asked — small runs, tests).

The compression itself is the ingest layer's (``argus.ingest.summarize``): the store only
writes tables, so it does not depend on ``argus.compress`` (which depends on the store's
schemas).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from argus.store.attempt import Attempt

__all__ = ["KernelSummaries", "WINDOW_STEPS", "WindowData", "WindowWriter", "WindowStats"]

#: Steps per window unless configured: the processor's windows, the simulator's summaries and the
#: analysis's smallest window all default to it (``argus processor --window-steps``).
WINDOW_STEPS = 5


@dataclass
class WindowData:
    """Tables in the store's schemas (see ``argus/store/schema.py``); any may be None."""

    window: int
    start_step: int
    end_step: int
    steps: pa.Table | None = None
    phases: pa.Table | None = None
    kernels: pa.Table | None = None  # raw events, ``kernels`` schema
    stacks: pa.Table | None = None
    hw: pa.Table | None = None
    drops: pa.Table | None = None
    checks: pa.Table | None = None


@dataclass(frozen=True, slots=True)
class KernelSummaries:
    """A window's kernel events compressed: ``kernel_summaries`` and ``kernel_sketches`` rows."""

    summaries: pa.Table
    sketches: pa.Table


@dataclass
class WindowStats:
    window: int
    rows: dict[str, int] = field(default_factory=dict)
    kernel_events: int = 0
    bytes_written: int = 0
    kernel_summaries: pa.Table | None = None  # what was written, for the TSDB sinks
    kernel_sketches: pa.Table | None = None


class WindowWriter:
    """Writes :class:`WindowData` for one writer partition of an attempt."""

    def __init__(self, attempt: Attempt, writer_id: str, *, raw_kernels: bool = False, durable: bool = True):
        self.attempt = attempt
        self.writer = attempt.writer(writer_id, durable=durable)
        self.raw_kernels = raw_kernels

    def write(self, data: WindowData, summaries: KernelSummaries | None = None) -> WindowStats:
        """Write the window's tables as one unit: readers see all of them or none (a crash
        between two files leaves an uncommitted unit, removed later by this partition's writer).

        ``summaries`` are the window's kernels compressed (``argus.ingest.summarize``); raw
        kernels are written only with ``raw_kernels``, so without summaries a window's kernel
        events are counted but not kept."""
        stats = WindowStats(window=data.window)
        unit = self.writer.unit(data.window)
        for table in ("steps", "phases", "stacks", "hw", "drops", "checks"):
            t = getattr(data, table)
            if t is not None and t.num_rows:
                unit.write(table, t)
                stats.rows[table] = t.num_rows
        k = data.kernels
        if k is not None and k.num_rows:
            stats.kernel_events = k.num_rows
            if self.raw_kernels:
                unit.write("kernels", k)
                stats.rows["kernels"] = k.num_rows
        if summaries is not None:
            unit.write("kernel_summaries", summaries.summaries)
            unit.write("kernel_sketches", summaries.sketches)
            stats.rows["kernel_summaries"] = summaries.summaries.num_rows
            stats.kernel_summaries = summaries.summaries
            stats.kernel_sketches = summaries.sketches
            stats.rows["kernel_sketches"] = summaries.sketches.num_rows
        unit.commit()
        self.writer.bytes_written += unit.bytes_written
        stats.bytes_written = self.writer.bytes_written
        return stats
