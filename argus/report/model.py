"""What a report shows, as plain data: gathered once from a store, rendered by ``page``.

Every array here is already bounded for display (steps binned, ranks sampled), so rendering
costs the same for 64 ranks and for 10,240.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["StepSeries", "PhaseHeatmap", "KernelCdfs", "EvidenceFile", "IncidentView", "JobLogView", "ReportData"]


@dataclass(slots=True)
class StepSeries:
    """Job step time per step (median rank) and the p10–p90 spread across ranks, in seconds.

    Above ``max_points`` steps, consecutive steps are binned: the line keeps each bin's
    *maximum* (a one-step spike must stay visible), the band its widest extent."""

    steps: np.ndarray
    job_s: np.ndarray
    p10_s: np.ndarray
    p90_s: np.ndarray
    unfinished_steps: list[int] = field(default_factory=list)
    steps_per_point: int = 1

    @property
    def n_points(self) -> int:
        return len(self.steps)


@dataclass(slots=True)
class PhaseHeatmap:
    """Rank × phase mean durations over an incident window, each column divided by the peers'
    median: culprits first, then sampled peers, then peer quantile rows."""

    row_labels: list[str]
    row_ranks: list[int | None]  # None for quantile rows
    columns: list[str]
    mean_ms: np.ndarray  # (rows, columns)
    ratio: np.ndarray  # mean_ms / peer median of the column
    culprit_rows: list[int]
    separators: list[int]
    peers_total: int
    peers_sampled: int
    steps: tuple[int, int]


@dataclass(slots=True)
class KernelCdfs:
    """Reconstructed duration CDFs of one kernel: culprits vs their peers (median and p10–p90)."""

    kernel: str
    stream: int
    grid_ms: np.ndarray
    culprits: list[tuple[int, np.ndarray]]
    peer_median: np.ndarray
    peer_lo: np.ndarray
    peer_hi: np.ndarray
    n_peers: int
    steps: tuple[int, int]


@dataclass(slots=True)
class EvidenceFile:
    """A Perfetto trace under ``<attempt>/evidence/<host>/``."""

    host: str
    name: str
    bytes: int
    window: int | None
    steps: tuple[int, int] | None

    @property
    def rel_path(self) -> str:
        """Path relative to the attempt directory."""
        return f"evidence/{self.host}/{self.name}"


@dataclass(slots=True)
class IncidentView:
    incident: dict[str, Any]  # the incident JSON of DESIGN.md §7
    heatmap: PhaseHeatmap | None = None
    cdfs: list[KernelCdfs] = field(default_factory=list)
    files: list[EvidenceFile] = field(default_factory=list)
    files_total: int = 0
    source: str = "diagnosis"  # or "store": read from the store's incidents table

    @property
    def id(self) -> str:
        return str(self.incident.get("id", ""))


@dataclass(slots=True)
class JobLogView:
    """The job's own output as ``argus run`` kept it (the ``logs`` table), whatever the incidents:
    every kind's event count, its first events (at most ``MAX_LOG_PER_KIND`` each, time order)
    and the lines no signature matched, as a count."""

    counts: dict[str, int]  # kind → events stored (``other`` excluded), kinds in order of first event
    events: list[dict[str, Any]]  # rank, ts_ns, host, stream, kind, severity, text
    other_lines: int = 0

    def shown(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]


@dataclass(slots=True)
class ReportData:
    run_id: str
    attempt_id: str
    layout: str
    ranks: int
    hosts: int
    source: str
    scenario: str | None
    series: StepSeries
    baseline_s: float | None
    l1_windows: list[dict[str, Any]]
    incidents: list[IncidentView]
    attempt_path: str
    diagnosed: bool
    diagnosis_s: float | None = None
    generated_ns: int = 0
    missing: list[str] = field(default_factory=list)  # what the store lacked (damaged files, gaps)
    #: the job's hosts as the store's kept health checks judge them (``NodeStanding.to_json``)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    #: the job's log (``argus run``'s ``logs`` table); None when the store has none
    job_log: JobLogView | None = None

    @property
    def step_range(self) -> tuple[int, int] | None:
        if not len(self.series.steps):
            return None
        # Python ints: numpy int64 arithmetic wraps on a step number near 2**63
        return int(self.series.steps[0]), int(self.series.steps[-1]) + int(self.series.steps_per_point) - 1

    def summary_json(self) -> dict[str, Any]:
        """The cheap part, for the web UI's JSON API."""
        s = self.series
        return {
            "run_id": self.run_id, "attempt_id": self.attempt_id, "layout": self.layout, "ranks": self.ranks,
            "hosts": self.hosts, "source": self.source, "scenario": self.scenario,
            "steps": list(self.step_range) if self.step_range else [], "baseline_step_s": self.baseline_s,
            "l1": self.l1_windows, "incidents": len(self.incidents), "diagnosed": self.diagnosed, "missing": self.missing, "nodes": self.nodes,
            "step_time": {"steps": s.steps.tolist(), "job_s": _nan_none(s.job_s), "p10_s": _nan_none(s.p10_s),
                          "p90_s": _nan_none(s.p90_s), "steps_per_point": s.steps_per_point,
                          "unfinished_steps": s.unfinished_steps},
        }


def _nan_none(a: np.ndarray) -> list[float | None]:
    return [None if not np.isfinite(v) else round(float(v), 6) for v in a]
