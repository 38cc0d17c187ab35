"""What ``diagnose()`` returns: one attempt's incidents with what they were found from (L1's
windows, each window's L2/L3, hardware signals, coverage, depth, observations), and the
diagnosis document of DESIGN.md §7 (``to_json``) that the CLI, the report, the web UI and
alerting read. Its JSON is built here and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.analysis.attribution import WindowOutcome
from argus.analysis.coverage import Coverage
from argus.analysis.incident import Incident, incidents_document
from argus.analysis.l1_windows import L1Result
from argus.analysis.observations import Depth, Observation
from argus.analysis.rootcause import WindowAnalysis
from argus.analysis.signals import HwSignals
from argus.store import Attempt
from argus.topology import GROUP_KINDS

__all__ = ["Diagnosis"]


@dataclass
class Diagnosis:
    attempt: Attempt
    l1: L1Result
    windows: list[WindowAnalysis]
    incidents: list[Incident]
    hw: HwSignals
    timings_s: dict[str, float] = field(default_factory=dict)
    coverage: Coverage | None = None
    store_note: str = ""  # why the incidents were not stored (read-only store …), else empty
    skipped_windows: list[tuple[int, int]] = field(default_factory=list)  # windows without phases
    depth: Depth | None = None  # how much could be compared (thin: "no incident" is not "match")
    observations: list[Observation] = field(default_factory=list)  # measured per rank, never claims
    attribution: list[WindowOutcome] = field(default_factory=list)  # each window's what-if attribution

    @property
    def missing(self) -> list[str]:
        """One line per thing the store lacked or could not give: damaged files, windows a crash
        left uncommitted, windows without phases."""
        a = self.attempt
        out = [d.reason for d in a.damage]
        pending = sum(a.uncommitted.values())
        if pending:
            out.append(f"{pending} file(s) of windows never committed (a writer stopped mid-window, or is still "
                       "writing) were left out")
        if self.skipped_windows:
            spans = ", ".join(f"{lo}–{hi}" for lo, hi in self.skipped_windows[:5])
            more = "…" if len(self.skipped_windows) > 5 else ""
            out.append(f"{len(self.skipped_windows)} window(s) have steps but no phases, so no rank was compared "
                       f"there: steps {spans}{more}")
        return out

    def unjudged_communicators(self) -> list[dict[str, Any]]:
        """Communicators no layout kind describes (Megatron's MODEL_PARALLEL grad-norm group, an
        embedding group): with no peer of their own kind they are not judged, and the document
        says which."""
        seen: dict[tuple[str, str], float] = {}
        for w in self.windows:
            for kernel, _stream, op, rate in (w.l3.unjudged if w.l3 else []):
                seen.setdefault((kernel, op), rate)
        out: list[dict[str, Any]] = [{"kernel": k, "op": op, "launches_per_rank_step": round(r, 3),
                                      "why": "no layout communicator launches it as often"}
                                     for (k, op), r in sorted(seen.items())[:32]]
        kinds = self.attempt.sql("SELECT DISTINCT group_kind FROM phases WHERE category = 'comm'").column(0)
        own = sorted(k for k in kinds.to_pylist() if k and k not in GROUP_KINDS)
        out += [{"group_kind": k, "why": "a group of its own kind (no layout group has its members)"} for k in own]
        return out

    def to_json(self) -> dict[str, Any]:
        """The diagnosis document (DESIGN.md §7, ``docs/schemas/diagnosis.schema.json``)."""
        a = self.attempt
        return incidents_document(a.identity.run_id, a.identity.attempt_id, a.layout.world_size, self.incidents, {
            "missing": self.missing,
            "incidents_stored": not self.store_note,
            "layout": str(a.layout), "steps": [int(self.l1.steps.min()), int(self.l1.steps.max())]
            if len(self.l1.steps) else [],
            "baseline_step_s": None if not np.isfinite(self.l1.baseline_s) else round(self.l1.baseline_s, 6),
            "l1": [w.to_json() for w in self.l1.windows],
            "coverage": None if self.coverage is None else self.coverage.to_json(),
            "depth": None if self.depth is None else self.depth.to_json(),
            "unjudged_communicators": self.unjudged_communicators(),
            "observations": [o.to_json() for o in self.observations],
            "attribution": [_outcome_json(o) for o in self.attribution],
        })

    def document(self) -> dict[str, Any]:
        """``to_json``, under the name its first readers used."""
        return self.to_json()


def _outcome_json(o: WindowOutcome) -> dict[str, Any]:
    """One window's attribution in the document: its slowdowns and fidelity, or why there is none."""
    out: dict[str, Any] = {"window": [o.lo, o.hi], "modeled": o.modeled}
    if o.attribution is not None:
        out.update(o.attribution.to_json())
    if o.note:
        out["note"] = o.note
    if o.findings:
        out["findings"] = [{"class": f.klass, "part": f.part, "shape": f.shape, "culprits": f.culprits[:16],
                            "phase": f.phase, "share": round(f.share, 3), "slowdown": round(f.slowdown, 4)}
                           for f in o.findings]
    return out
