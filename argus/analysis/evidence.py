"""The evidence contract: which records an incident's ``evidence`` list holds, and the fields
its readers (the CLI's deep lines, the HTML report, the web UI) rely on.

Evidence records stay JSON objects — they are stored as JSON in the incidents table, shown
verbatim in the report and served to the UI — but every kind is named here, with the level
that produces it and the fields a reader takes from it. ``check_evidence`` validates a list;
the golden tests run it over every scenario, so renaming a field in a producer breaks a
test, not a page.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from argus.vocab import EvidenceKind, Level  # re-exported: the kinds and levels live in the shared vocabulary

__all__ = ["Level", "EvidenceKind", "REQUIRED_FIELDS", "check_evidence"]


#: Fields a reader takes from a record of that kind (`cli/diagnose.py`, `report/page.py`,
#: `report/collect.py`, `report/charts.py`); kinds not listed are shown as they are.
REQUIRED_FIELDS: Mapping[EvidenceKind, frozenset[str]] = {
    EvidenceKind.WHAT_IF: frozenset({"steps", "step_s", "without_fault_s", "extra_s", "covers_steps", "slowdown_pct",
                                     "gpu_hours_lost"}),
    EvidenceKind.CRITICAL_PATH: frozenset({"by_rank"}),
    EvidenceKind.PIPELINE: frozenset({"note", "stages", "origin_stage", "origin_rank"}),
    EvidenceKind.GPU_IDLE: frozenset({"rank", "step", "phase", "phase_ms", "host_stall"}),
    EvidenceKind.HOST_PHASES: frozenset({"cause", "phase", "rank_s", "peers_s", "share"}),
    EvidenceKind.STACKS: frozenset({"rank", "cause", "samples", "top_frames"}),
    EvidenceKind.W1_MATRIX: frozenset({"kernel", "stream", "ranks", "culprits", "w1_ms"}),
    EvidenceKind.W1_OUTLIER: frozenset({"rank", "kernel", "stream", "peers", "extra_ms"}),
    EvidenceKind.GROUP_SHIFT: frozenset({"kernel", "stream", "ranks", "hosts"}),
    EvidenceKind.TRANSFER_SHIFT: frozenset({"collective", "group_kind", "step", "hosts", "extra_ms"}),
    EvidenceKind.BUSY_OUTLIER: frozenset({"rank", "phase", "steps", "ratio", "excess_s"}),
    EvidenceKind.LINK_ERRORS: frozenset({"hosts", "errors"}),
    EvidenceKind.LOG_LINES: frozenset({"events", "total"}),
    EvidenceKind.CPU_PRESSURE: frozenset({"hosts", "pressure_pct", "others_pct"}),
    EvidenceKind.IO_PRESSURE: frozenset({"hosts", "pressure_pct", "others_pct"}),
    EvidenceKind.STUCK_COLLECTIVE: frozenset({"group", "group_desc", "seq", "op", "arrived", "never_joined"}),
    EvidenceKind.CONSEQUENCE: frozenset({"group", "group_desc", "seq", "op", "arrived", "never_joined"}),
    EvidenceKind.REPLICA_DISAGREEMENT: frozenset({"group", "step", "sensor", "outvoted", "majority", "digests"}),
    EvidenceKind.EXPOSURE: frozenset({"first_step", "checkpoints_after", "resume_from_step"}),
    EvidenceKind.NONFINITE_OUTLIER: frozenset({"ranks", "step", "group"}),
    EvidenceKind.GEMM_VIOLATION: frozenset({"rank", "steps", "columns", "rerun"}),
}


def check_evidence(evidence: Iterable[Mapping[str, Any]]) -> list[str]:
    """Problems with ``evidence`` against the contract (empty when it holds)."""
    problems = []
    for i, e in enumerate(evidence):
        kind, level = e.get("kind"), e.get("level")
        if kind not in set(EvidenceKind):
            problems.append(f"evidence[{i}]: unknown kind {kind!r}")
            continue
        if level not in set(Level):
            problems.append(f"evidence[{i}] ({kind}): unknown level {level!r}")
        missing = REQUIRED_FIELDS.get(EvidenceKind(kind), frozenset()) - set(e)
        if missing:
            problems.append(f"evidence[{i}] ({kind}): missing {', '.join(sorted(missing))}")
    return problems
