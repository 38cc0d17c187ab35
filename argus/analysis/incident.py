"""Incidents: the unit Argus reports — class, culprits, window, phase, kernels, state, impact,
action and evidence — as the JSON document of DESIGN.md §7 and as rows of the store."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from argus.analysis.remedies import remedy
from argus.store import TABLES, conform

__all__ = ["Incident", "IncidentClass", "State", "Severity", "Action", "CLASSES", "STATES", "SEVERITIES", "ACTIONS", "WARNING_PCT", "CRITICAL_PCT", "grade", "run_share_pct",
           "incidents_table", "incidents_document", "SCHEMA_VERSION"]

#: Host name the topology reader gives a rank no host reported (``Topology.from_table``).
UNKNOWN_HOST = "unknown"

class IncidentClass(StrEnum):
    """Root-cause classes (DESIGN.md §7). Members are their strings: JSON, Parquet and
    comparisons with plain strings see the value."""

    COMPUTE_STRAGGLER = "compute_straggler"
    LINK_DEGRADATION = "link_degradation"
    PIPELINE_IMBALANCE = "pipeline_imbalance"
    HOST_STALL = "host_stall"
    HANG = "hang"
    FAIL_STOP = "fail_stop"  # a rank stopped with an error (its exception, a signal): from the job's log
    INPUT_IMBALANCE = "input_imbalance"
    #: the job runs slower than it did and no group of ranks, stage or link explains it (the
    #: attribution rules them out): every rank alike — the input, the code, the cluster
    JOB_SLOWDOWN = "job_slowdown"
    #: replicas that stopped holding the same bits (``sdc.py``): a claim about correctness, not
    #: speed, so never graded by a slowdown
    SILENT_DATA_CORRUPTION = "silent_data_corruption"
    HEALTHY = "healthy"


class State(StrEnum):
    SUSPECTED = "suspected"  # one level's evidence
    CONFIRMED = "confirmed"  # independent levels agree and the impact clears the floor
    INCONCLUSIVE = "inconclusive"  # levels disagree: shown with both sides, never claimed


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Action(StrEnum):
    OBSERVE = "observe"
    RAISE_TRACE_FIDELITY = "raise_trace_fidelity"
    #: a suspected hardware fault seen only by comparison: check the suspect (a GEMM on its GPU,
    #: a transfer over its link) before anyone cordons it
    VERIFY = "verify"
    CORDON_NODE = "cordon_node"
    CHECKPOINT_AND_RESTART = "checkpoint_and_restart"


CLASSES = tuple(IncidentClass)
STATES = tuple(State)
SEVERITIES = tuple(Severity)
ACTIONS = tuple(Action)
_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: The impact floor: below this attributable slowdown (% of the job's step time over the
#: incident's steps) an incident is an observation, ``info``, however sure the evidence. A
#: healthy job's step time varies by about this much from run to run, and 2% of a 10,000-GPU
#: job is what an operator would page for.
WARNING_PCT = 2.0
#: A fifth of the job's time lost: worth acting on now.
CRITICAL_PCT = 20.0


def grade(slowdown_pct: float | None) -> Severity:
    """The severity an attributable slowdown earns."""
    if slowdown_pct is None or not slowdown_pct >= WARNING_PCT:  # also NaN
        return Severity.INFO
    return Severity.CRITICAL if slowdown_pct >= CRITICAL_PCT else Severity.WARNING


def run_share_pct(step_time: dict[int, float], extra_s: float) -> float:
    """How much longer (%) the run took for ``extra_s``: a one-off's cost to the job, spread
    over every step (a one-off has no "steps between" to spread over)."""
    run_s = sum(t for t in step_time.values() if np.isfinite(t))
    return 100.0 * extra_s / max(run_s - extra_s, 1e-12) if run_s > 0 else 0.0


@dataclass
class Incident:
    klass: IncidentClass
    culprit_ranks: list[int]
    hosts: list[str]
    gpus: list[str]
    start_step: int
    end_step: int
    phase: str
    kernels: list[str]
    state: State
    severity: Severity
    slowdown_pct: float | None
    gpu_hours_lost: float | None
    action: Action
    evidence: list[dict[str, Any]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)  # the steps actually affected (intermittent faults)
    summary: str = ""
    decision: dict[str, Any] | None = None  # target, remedy and price (``decision.py``), set by the diagnosis
    #: incidents this one's culprits were taken to explain (a link whose slow transfers are their
    #: victims' waits): held back, and put back by ``reinstate_victims`` if a later level finds
    #: these culprits cost the job nothing. Never serialised.
    victims: list["Incident"] = field(default_factory=list, repr=False, compare=False)
    #: the most a rule's evidence can claim whatever the impact (one window against one peer is
    #: too thin to tell a slow device from a shared host's noise): the arbiter grades below it.
    #: Never serialised.
    claim_cap: Severity | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a misspelt class, state, severity or action fails here, where it is made
        object.__setattr__(self, "klass", IncidentClass(self.klass))
        self.state, self.severity, self.action = State(self.state), Severity(self.severity), Action(self.action)
        if self.action == Action.CORDON_NODE and not any(h and h != UNKNOWN_HOST for h in self.hosts):
            # no topology row for the culprits: naming no host, we cannot send anyone to cordon one
            self.action = Action.VERIFY
            self.summary += (" — their host is unknown (the store has no topology rows for these ranks), so no "
                             "host action is recommended")

    def __setattr__(self, name: str, value: Any) -> None:
        """Severity and state are bounded by the impact, by construction: an incident is never
        above the grade its attributable slowdown earns (``grade``), and never ``confirmed``
        below the impact floor, nor with an action other than ``observe`` there —
        whatever a detector or a later level sets. A hang stops the
        job: it keeps what it was given. A hardware signal whose cost this job cannot measure
        (``slowdown_pct`` None: a link trained down that every comparable group crosses) earns
        a warning at most — worth a look, never a confirmed claim."""
        kind = {"state": State, "severity": Severity, "action": Action}.get(name)
        object.__setattr__(self, name, kind(value) if kind is not None else value)
        if name in ("severity", "slowdown_pct", "state", "action", "evidence") and "summary" in self.__dict__ \
                and self.klass not in (IncidentClass.HANG, IncidentClass.FAIL_STOP,
                                       IncidentClass.SILENT_DATA_CORRUPTION):
            hw_only = self.slowdown_pct is None and any(e.get("level") == "hw" for e in self.evidence)
            allowed = Severity.WARNING if hw_only else Severity(grade(self.slowdown_pct))
            if hw_only and self.state == State.CONFIRMED:
                object.__setattr__(self, "state", State.SUSPECTED)
            if _SEVERITY_RANK[self.severity] > _SEVERITY_RANK[allowed]:
                object.__setattr__(self, "severity", allowed)
            if allowed == Severity.INFO:  # nothing to act on: watch it
                if self.state == State.CONFIRMED:
                    object.__setattr__(self, "state", State.SUSPECTED)
                object.__setattr__(self, "action", Action.OBSERVE)

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
            "action": self.action, "remedy": remedy(str(self.klass), self.evidence), "summary": self.summary,
            "evidence": self.evidence, **({"decision": self.decision} if self.decision is not None else {}),
        }

    def to_row(self, detected_ns: int) -> dict[str, Any]:
        """One row of the store's ``incidents`` table (evidence as JSON text); ``json_from_row``
        reads it back."""
        return {
            "id": self.id, "class": self.klass, "state": self.state, "severity": self.severity,
            "culprit_ranks": self.culprit_ranks, "hosts": self.hosts, "gpus": self.gpus,
            "start_step": self.start_step, "end_step": self.end_step, "phase": self.phase, "kernels": self.kernels,
            "slowdown_pct": self.slowdown_pct, "gpu_hours_lost": self.gpu_hours_lost, "action": self.action,
            "evidence": json.dumps(self.evidence, default=str), "detected_ns": detected_ns,
        }

    @staticmethod
    def json_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
        """A stored ``incidents`` row as the incident JSON of ``to_json``, as far as a row holds
        it: the stored values as they are (not re-graded), no summary, steps, remedy nor
        decision, and the row's ``detected_ns`` added. Unreadable evidence reads as none."""
        try:
            evidence = json.loads(row.get("evidence") or "[]")
        except ValueError:
            evidence = []
        return {
            "id": row["id"], "class": row["class"], "state": row["state"], "severity": row["severity"],
            "culprit_ranks": list(row["culprit_ranks"] or []), "hosts": list(row["hosts"] or []),
            "gpus": list(row["gpus"] or []), "window": {"start_step": row["start_step"], "end_step": row["end_step"]},
            "steps": [], "phase": row["phase"] or "", "kernels": list(row["kernels"] or []),
            "impact": {"slowdown_pct": row["slowdown_pct"], "gpu_hours_lost": row["gpu_hours_lost"]},
            "action": row["action"], "summary": "", "evidence": evidence if isinstance(evidence, list) else [],
            "detected_ns": row.get("detected_ns"),
        }


#: The diagnosis document's version (``docs/schemas/diagnosis.schema.json``): raised when a field
#: is removed or changes meaning; fields may be added within a version.
SCHEMA_VERSION = 1


def incidents_document(run_id: str, attempt_id: str, ranks: int, incidents: list[Incident],
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "run_id": run_id, "attempt_id": attempt_id, "ranks": ranks,
            "incidents": [i.to_json() for i in incidents], **(extra or {})}


def incidents_table(incidents: list[Incident]) -> pa.Table:
    now = time.time_ns()
    cols: dict[str, list] = {name: [] for name in TABLES["incidents"].column_names}
    for inc in incidents:
        row = inc.to_row(now)
        for name, values in cols.items():
            values.append(row[name])
    return conform("incidents", cols)
