"""From verdict to decision: the action's target, the remedy, and a price on both sides.

Operators of large jobs decide by cost: the GPU-hours a fault keeps burning against what an
action costs once. Doing nothing costs ``ranks × p/(100+p)`` GPU-hours per hour of training for a
job running ``p``% slower (every GPU's hour when it has stopped). An action costs:

* **change the job** (a remedy for a cause that is the job's own) or **cordon at the next
  checkpoint**: one restart of the whole job — ``ranks × restart`` — with no progress lost, since
  it waits for the checkpoint;
* **restart now**: the restart plus the progress since the last checkpoint, on average half the
  checkpoint interval — ``ranks × (restart + interval/2)``;
* observing, raising trace fidelity, verifying: nothing the job pays for.

The ladder escalates like the ski-rental rule: once the loss accumulated since the fault began
exceeds the cost of the next rung, take it — ``escalate_after_h = action cost / loss per hour``.
Below the warning line (impact < 5%) the price is still shown; the rung stays "observe".

What the store knows sets the figures: the checkpoint interval and duration from the steps every
rank spent saving (L1's checkpoint windows), the restart time from the gap between this attempt
and the previous one of the same run. What it does not know is assumed and said so (``basis``):
a restart of 10 minutes, a checkpoint every hour.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from argus.analysis.remedies import in_the_job, remedy

__all__ = ["JobFacts", "Decision", "decide", "job_facts", "DEFAULT_RESTART_S", "DEFAULT_CHECKPOINT_INTERVAL_S"]

DEFAULT_RESTART_S = 600.0
DEFAULT_CHECKPOINT_INTERVAL_S = 3600.0
HARDWARE_ACTIONS = ("cordon_node", "checkpoint_and_restart")


@dataclass(frozen=True)
class JobFacts:
    ranks: int
    step_s: float | None  # the healthy step time
    checkpoint_interval_s: float
    checkpoint_s: float | None  # one checkpoint's extra time, where one was seen
    restart_s: float
    measured: tuple[str, ...] = ()  # which of the figures the store measured (the rest are assumed)


@dataclass
class Decision:
    action: str
    target: dict[str, Any]  # ranks, hosts, gpus (and the stage, where the incident names one)
    remedy: str
    loss_gpuh_per_h: float | None  # doing nothing, per hour of training
    action_cost_gpuh: float  # what the action costs once
    pays_off_after_h: float | None  # hours of the loss that cost as much as the action (None: it costs nothing)
    next_rung: str | None  # the action the ladder escalates to, where there is one
    escalate_after_h: float | None  # hours of accumulated loss at which the next rung pays for itself
    basis: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("loss_gpuh_per_h", "action_cost_gpuh", "pays_off_after_h", "escalate_after_h"):
            if d[k] is not None:
                d[k] = round(float(d[k]), 3)
        return d


def job_facts(ranks: int, step_s: float | None, checkpoint_steps: list[int], checkpoint_ratio: list[float],
              restart_s: float | None) -> JobFacts:
    """Facts from what diagnosis saw: the steps every rank saved in (and their step-time ratio
    to the healthy step), the gap before this attempt."""
    measured = []
    interval, ckpt = DEFAULT_CHECKPOINT_INTERVAL_S, None
    if step_s and np.isfinite(step_s) and step_s > 0:
        if len(checkpoint_steps) >= 2:
            interval = float(np.median(np.diff(sorted(checkpoint_steps)))) * step_s
            measured.append("checkpoint_interval_s")
        if checkpoint_ratio:
            ckpt = max(float(np.median(checkpoint_ratio)) - 1.0, 0.0) * step_s
            measured.append("checkpoint_s")
    if restart_s is not None and restart_s > 0:
        measured.append("restart_s")
    else:
        restart_s = DEFAULT_RESTART_S
    return JobFacts(ranks, step_s, interval, ckpt, float(restart_s), tuple(measured))


def _loss_per_h(incident: dict[str, Any], ranks: int) -> float | None:
    pct = (incident.get("impact") or {}).get("slowdown_pct")
    if pct is None:
        return None
    pct = float(pct)
    if incident.get("class") in ("hang", "fail_stop"):
        return float(ranks)
    return ranks * pct / (100.0 + pct)


def decide(incident: dict[str, Any], facts: JobFacts) -> Decision:
    """The decision for one incident (its JSON) in a job with ``facts``."""
    klass, action = str(incident.get("class")), str(incident.get("action"))
    evidence = [e for e in incident.get("evidence") or [] if isinstance(e, dict)]
    target: dict[str, Any] = {"ranks": list(incident.get("culprit_ranks") or [])[:64],
                              "hosts": list(incident.get("hosts") or [])[:16],
                              "gpus": list(incident.get("gpus") or [])[:16]}
    stage = next((e.get("origin_stage", e.get("stage")) for e in evidence if e.get("kind") == "pipeline"), None)
    if isinstance(stage, int):
        target["stage"] = stage
    loss = _loss_per_h(incident, facts.ranks)
    restart = facts.ranks * facts.restart_s / 3600.0
    restart_now = facts.ranks * (facts.restart_s + facts.checkpoint_interval_s / 2) / 3600.0
    if action == "checkpoint_and_restart":
        cost, nxt = restart_now, None
    elif action == "cordon_node" or in_the_job(klass, evidence):
        # at the next checkpoint (a hardware action) or the job's own fix deployed then: one restart;
        # beyond it, for hardware, restarting at once
        cost, nxt = restart, ("checkpoint_and_restart" if action == "cordon_node" else None)
    elif action == "verify":
        cost, nxt = 0.0, "cordon_node"
    else:
        cost, nxt = 0.0, None
    # ski rental: the next rung pays for itself once the accumulated loss reaches its cost
    rung_cost = {"cordon_node": restart, "checkpoint_and_restart": restart_now}.get(nxt or "")
    escalate = rung_cost / loss if loss and rung_cost is not None else None
    pays_off = cost / loss if loss and cost else None
    basis = {"ranks": facts.ranks, "restart_s": round(facts.restart_s, 1),
             "checkpoint_interval_s": round(facts.checkpoint_interval_s, 1),
             "checkpoint_s": None if facts.checkpoint_s is None else round(facts.checkpoint_s, 2),
             "measured": list(facts.measured),
             "assumed": [k for k in ("restart_s", "checkpoint_interval_s") if k not in facts.measured]}
    return Decision(action, target, remedy(klass, evidence), loss, cost, pays_off, nxt, escalate, basis)
