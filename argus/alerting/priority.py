"""Alert priorities: what should page someone, what should reach a channel, what can wait.

* **P0** — the job is not making progress: a hang (steps that never finished) or a GPU
  lost (a rank that stopped reporting while the others block); or it computes wrong values:
  a confirmed silent data corruption (a suspected one is P1).
* **P1** — the job is paying for it: a straggler (compute, pipeline, host stall) costing
  more than 10% of the job over its window, or a degraded link (a shared link slows every
  step it carries, whatever the percentage today).
* **P2** — worth knowing: everything else that is not purely informational.
"""

from __future__ import annotations

from typing import Any

from argus.analysis.incident import IncidentClass, Severity, State

__all__ = ["priority", "PRIORITIES", "P1_SLOWDOWN_PCT"]

PRIORITIES = ("P0", "P1", "P2")
P1_SLOWDOWN_PCT = 10.0


def priority(incident: dict[str, Any]) -> str | None:
    """P0–P2 for one incident of the incidents document, or None (info: no alert)."""
    klass = incident["class"]
    if klass in (IncidentClass.HANG, IncidentClass.FAIL_STOP):
        return "P0"
    if klass == IncidentClass.SILENT_DATA_CORRUPTION:  # wrong values spread through every all-reduce and checkpoint
        return "P0" if incident.get("state") == State.CONFIRMED else "P1"
    if incident.get("severity") == Severity.INFO or klass in (IncidentClass.HEALTHY, IncidentClass.INPUT_IMBALANCE):
        return None
    if klass == IncidentClass.LINK_DEGRADATION:
        return "P1"
    pct = (incident.get("impact") or {}).get("slowdown_pct") or 0.0
    return "P1" if pct > P1_SLOWDOWN_PCT else "P2"
