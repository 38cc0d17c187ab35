"""Incidents: the unit Argus reports — class, culprits, window, phase, kernels, state, impact,
action and evidence — as the JSON document of DESIGN.md §7 and as rows of the store."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from argus.store import TABLES, conform

__all__ = ["Incident", "CLASSES", "STATES", "SEVERITIES", "ACTIONS", "WARNING_PCT", "CRITICAL_PCT", "grade",
           "incidents_table", "incidents_document"]

CLASSES = ("compute_straggler", "link_degradation", "pipeline_imbalance", "host_stall", "hang", "input_imbalance",
           "healthy")
STATES = ("suspected", "confirmed", "inconclusive")
SEVERITIES = ("info", "warning", "critical")
ACTIONS = ("observe", "raise_trace_fidelity", "cordon_node", "checkpoint_and_restart")
_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: The impact floor: below this attributable slowdown (% of the job's step time over the
#: incident's steps) an incident is an observation, ``info``, however sure the evidence. A
#: healthy job's step time varies by about this much from run to run, and 2% of a 10,000-GPU
#: job is what an operator would page for.
WARNING_PCT = 2.0
#: A fifth of the job's time lost: worth acting on now.
CRITICAL_PCT = 20.0


def grade(slowdown_pct: float | None) -> str:
    """The severity an attributable slowdown earns."""
    if slowdown_pct is None or not slowdown_pct >= WARNING_PCT:  # also NaN
        return "info"
    return "critical" if slowdown_pct >= CRITICAL_PCT else "warning"


@dataclass
class Incident:
    klass: str
    culprit_ranks: list[int]
    hosts: list[str]
    gpus: list[str]
    start_step: int
    end_step: int
    phase: str
    kernels: list[str]
    state: str
    severity: str
    slowdown_pct: float | None
    gpu_hours_lost: float | None
    action: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)  # the steps actually affected (intermittent faults)
    summary: str = ""

    def __post_init__(self) -> None:
        assert self.klass in CLASSES and self.state in STATES and self.severity in SEVERITIES and self.action in ACTIONS

    def __setattr__(self, name: str, value: Any) -> None:
        """Severity and state are bounded by the impact, by construction: an incident is never
        above the grade its attributable slowdown earns (``grade``), and never ``confirmed``
        below the impact floor, nor with an action other than ``observe`` there —
        whatever a detector or a later level sets. A hang stops the
        job: it keeps what it was given."""
        object.__setattr__(self, name, value)
        if name in ("severity", "slowdown_pct", "state", "action") and "action" in self.__dict__ \
                and self.klass != "hang":
            allowed = grade(self.slowdown_pct)
            if _SEVERITY_RANK[self.severity] > _SEVERITY_RANK[allowed]:
                object.__setattr__(self, "severity", allowed)
            if allowed == "info":  # nothing to act on: watch it
                if self.state == "confirmed":
                    object.__setattr__(self, "state", "suspected")
                object.__setattr__(self, "action", "observe")

    @property
    def id(self) -> str:
        """Stable across re-runs of the same diagnosis: class, culprits and onset."""
        key = f"{self.klass}|{','.join(map(str, self.culprit_ranks))}|{self.start_step}"
        return f"inc-{hashlib.sha1(key.encode()).hexdigest()[:10]}"

    @property
    def severity_rank(self) -> int:
        return _SEVERITY_RANK[self.severity]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "class": self.klass, "state": self.state, "severity": self.severity,
            "culprit_ranks": self.culprit_ranks, "hosts": self.hosts, "gpus": self.gpus,
            "window": {"start_step": self.start_step, "end_step": self.end_step}, "steps": self.steps,
            "phase": self.phase, "kernels": self.kernels,
            "impact": {"slowdown_pct": None if self.slowdown_pct is None else round(self.slowdown_pct, 2),
                       "gpu_hours_lost": None if self.gpu_hours_lost is None else round(self.gpu_hours_lost, 4)},
            "action": self.action, "summary": self.summary, "evidence": self.evidence,
        }


def incidents_document(run_id: str, attempt_id: str, ranks: int, incidents: list[Incident],
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"run_id": run_id, "attempt_id": attempt_id, "ranks": ranks,
            "incidents": [i.to_json() for i in incidents], **(extra or {})}


def incidents_table(incidents: list[Incident]) -> pa.Table:
    now = time.time_ns()
    cols: dict[str, list] = {name: [] for name in TABLES["incidents"].column_names}
    for inc in incidents:
        j = inc.to_json()
        cols["id"].append(j["id"])
        cols["class"].append(inc.klass)
        cols["state"].append(inc.state)
        cols["severity"].append(inc.severity)
        cols["culprit_ranks"].append(inc.culprit_ranks)
        cols["hosts"].append(inc.hosts)
        cols["gpus"].append(inc.gpus)
        cols["start_step"].append(inc.start_step)
        cols["end_step"].append(inc.end_step)
        cols["phase"].append(inc.phase)
        cols["kernels"].append(inc.kernels)
        cols["slowdown_pct"].append(inc.slowdown_pct)
        cols["gpu_hours_lost"].append(inc.gpu_hours_lost)
        cols["action"].append(inc.action)
        cols["evidence"].append(json.dumps(inc.evidence, default=str))
        cols["detected_ns"].append(now)
    return conform("incidents", cols)
