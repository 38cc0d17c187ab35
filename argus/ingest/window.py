"""A closed window as one record, from the assembler to every exporter.

Before this record a window changed form at each hand-off (a 4-tuple on the writer's
queue, a ``WindowJob`` for the TSDB, a 6-tuple back to the loop). One dataclass carries
what every consumer needs: the tables, whose they are (run, host, the ranks' places), the
topology rows to record with it, and — once the store exporter computed them — the kernel
summaries the TSDB exporter sends on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from argus.store.window import KernelSummaries, WindowData, WindowStats, WindowWriter
from argus.topology import Layout, RunIdentity

__all__ = ["ClosedWindow", "RankPlace", "WrittenWindow", "summarize", "write_window"]


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where a rank runs: its host, local rank and GPU (the TSDB series' labels)."""

    host: str
    local_rank: int
    gpu_uuid: str


@dataclass(slots=True)
class ClosedWindow:
    """One window of one attempt on this host, closed and on its way to the exporters."""

    run: RunIdentity
    host: str  # the processor's host: the store partition and the ``host`` label
    layout: Layout
    data: WindowData
    ranks: dict[int, RankPlace]  # the ranks with records in the window
    topology_rows: pa.Table | None = None  # the ranks that joined since the last window
    summaries: KernelSummaries | None = None  # the kernels compressed (set by the store exporter)
    rows: dict[str, int] | None = None  # rows written per table (set by the store exporter)

    @property
    def key(self) -> tuple[str, str]:
        return (self.run.run_id, self.run.attempt_id)

    @property
    def window(self) -> int:
        return self.data.window


@dataclass(frozen=True, slots=True)
class WrittenWindow:
    """The writer's answer for one window: ``rows`` is None when it could not be written."""

    key: tuple[str, str]
    window: int
    start_step: int
    end_step: int
    ranks: frozenset[int] = frozenset()
    rows: dict[str, int] | None = None

    @classmethod
    def of(cls, closed: ClosedWindow, written: bool) -> WrittenWindow:
        d = closed.data
        if not written:
            return cls(closed.key, d.window, d.start_step, d.end_step)
        return cls(closed.key, d.window, d.start_step, d.end_step, frozenset(closed.ranks), closed.rows or {})

    def ack(self) -> dict[str, Any]:
        """The ACK document the window's ranks receive (and the status file keeps)."""
        return {"window": self.window, "start_step": self.start_step, "end_step": self.end_step, "rows": self.rows}


def summarize(data: WindowData) -> KernelSummaries | None:
    """The window's kernel events compressed (None when it has none): what the store keeps
    of them. Imports the compression (scipy) on first use."""
    k = data.kernels
    if k is None or not k.num_rows:
        return None
    from argus.compress import summarize_kernels

    summaries, sketches = summarize_kernels(k, data.window, data.start_step, data.end_step)
    return KernelSummaries(summaries, sketches)


def write_window(writer: WindowWriter, data: WindowData) -> WindowStats:
    """Compress the window's kernels and write it through ``writer``: the offline importers'
    one call (the processor's store exporter does the same)."""
    return writer.write(data, summarize(data))
