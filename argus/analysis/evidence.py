"""The evidence contract: which records an incident's ``evidence`` list holds, and the fields
its readers (the CLI's deep lines, the HTML report, the web UI) rely on.

Evidence records stay JSON objects — they are stored as JSON in the incidents table, shown
verbatim in the report and served to the UI — but every kind is named here, with the level
that produces it and the fields a reader takes from it. ``check_evidence`` validates a list;
the golden tests run it over every scenario, so renaming a field in a producer breaks a
test, not a page.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Protocol

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


# -- constructors --------------------------------------------------------------------------------
# One per kind the root-cause rules write (``analysis/rootcause/``): the JSON object itself,
# keys in the order readers and stored documents have always seen them, so a field renamed
# here is renamed for every rule at once. Kinds and levels are the StrEnum members: JSON,
# Parquet and string comparisons see their values.


class _HasJson(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def l1_window(window: _HasJson) -> dict[str, Any]:
    """An L1 window (``regression``, ``jitter`` …) as evidence: its own JSON, kind included."""
    return {"level": Level.L1, **window.to_json()}


def steps_never_finished(steps: Any) -> dict[str, Any]:
    return {"level": Level.L1, "kind": EvidenceKind.STEPS_NEVER_FINISHED, "steps": steps}


def blocked_in_collectives(ranks: int, collectives: dict[str, int]) -> dict[str, Any]:
    return {"level": Level.L2, "kind": EvidenceKind.BLOCKED_IN_COLLECTIVES, "ranks": ranks, "collectives": collectives}


def never_joined(ranks: list[int], last_phase: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {"level": Level.L2, "kind": EvidenceKind.NEVER_JOINED, "ranks": ranks, "last_phase": last_phase}


def busy_outlier(finding: _HasJson) -> dict[str, Any]:
    """An L2 busy finding; its own ``kind`` ("busy") keeps its place, renamed."""
    return {"level": Level.L2, **finding.to_json(), "kind": EvidenceKind.BUSY_OUTLIER}


def late_arrival(finding: _HasJson) -> dict[str, Any]:
    return {"level": Level.L2, **finding.to_json(), "kind": EvidenceKind.LATE_ARRIVAL}


def transfer_shift(finding: _HasJson) -> dict[str, Any]:
    return {"level": Level.L2, **finding.to_json(), "kind": EvidenceKind.TRANSFER_SHIFT}


def victim_transfers(hosts: list[str], ranks: list[int], steps: list[int], collectives: list[str],
                     note: str) -> dict[str, Any]:
    return {"level": Level.L2, "kind": EvidenceKind.VICTIM_TRANSFERS, "hosts": hosts, "ranks": ranks, "steps": steps,
            "collectives": collectives, "note": note}


def not_compared(note: str) -> dict[str, Any]:
    """Transfers no comparison could judge (every group crosses the suspect hosts)."""
    return {"level": Level.L2, "kind": EvidenceKind.NOT_COMPARED, "note": note}


def kernels_normal(rank: int, note: str) -> dict[str, Any]:
    return {"level": Level.L3, "kind": EvidenceKind.KERNELS_NORMAL, "rank": rank, "note": note}


def w1_outlier(outlier: _HasJson) -> dict[str, Any]:
    return {"level": Level.L3, "kind": EvidenceKind.W1_OUTLIER, **outlier.to_json()}


def w1_matrix(kernel: str, stream: int, ranks: list[int], culprits: list[int], w1_ms: list) -> dict[str, Any]:
    return {"level": Level.L3, "kind": EvidenceKind.W1_MATRIX, "kernel": kernel, "stream": stream, "ranks": ranks,
            "culprits": culprits, "w1_ms": w1_ms}


def group_shift(shift: _HasJson) -> dict[str, Any]:
    return {"level": Level.L3, **shift.to_json(), "kind": EvidenceKind.GROUP_SHIFT}


def kernel_time(rank: int, ratio: float, note: str, peer: int | None = None,
                window: list[int] | None = None) -> dict[str, Any]:
    """A rank's compute-kernel time over a reference (its one peer's: ``peer``; in ``window``)."""
    return {"level": Level.L3, "kind": EvidenceKind.KERNEL_TIME, "rank": rank,
            **({"peer": peer} if peer is not None else {}), **({"window": window} if window is not None else {}),
            "ratio": ratio, "note": note}


def culprit_dismissed(incident: str, ranks: list[int], note: str) -> dict[str, Any]:
    return {"level": Level.L4, "kind": EvidenceKind.CULPRIT_DISMISSED, "incident": incident, "ranks": ranks,
            "note": note}


def stacks(rank: int, stack: _HasJson) -> dict[str, Any]:
    return {"level": Level.L5, "kind": EvidenceKind.STACKS, "rank": rank, **stack.to_json()}


def thermal_throttle(rank: int, max_temperature_c: float) -> dict[str, Any]:
    return {"level": Level.HW, "kind": EvidenceKind.THERMAL_THROTTLE, "rank": rank,
            "max_temperature_c": max_temperature_c}


def nic_port_down(ranks: list[int], note: str | None = None) -> dict[str, Any]:
    return {"level": Level.HW, "kind": EvidenceKind.NIC_PORT_DOWN, "ranks": ranks,
            **({"note": note} if note is not None else {})}


def pcie_degraded(rank: int, pcie_gen: float, pcie_width: float) -> dict[str, Any]:
    return {"level": Level.HW, "kind": EvidenceKind.PCIE_DEGRADED, "rank": rank, "pcie_gen": pcie_gen,
            "pcie_width": pcie_width}


def link_errors(hosts: list[str], errors: dict[str, int], note: str) -> dict[str, Any]:
    return {"level": Level.HW, "kind": EvidenceKind.LINK_ERRORS, "hosts": hosts, "errors": errors, "note": note}


def host_pressure(kind: EvidenceKind, hosts: list[str], pressure_pct: dict[str, float], others_pct: float,
                  note: str | None = None) -> dict[str, Any]:
    """``cpu_pressure`` or ``io_pressure``: the hosts' pressure standing out from the others'."""
    if kind not in (EvidenceKind.CPU_PRESSURE, EvidenceKind.IO_PRESSURE):
        raise ValueError(f"not a pressure kind: {kind!r}")
    return {"level": Level.HW, "kind": kind, "hosts": hosts, "pressure_pct": pressure_pct, "others_pct": others_pct,
            **({"note": note} if note is not None else {})}


__all__ += ["l1_window", "steps_never_finished", "blocked_in_collectives", "never_joined", "busy_outlier",
            "late_arrival", "transfer_shift", "victim_transfers", "not_compared", "kernels_normal", "w1_outlier", "w1_matrix",
            "group_shift", "kernel_time", "culprit_dismissed", "stacks", "thermal_throttle", "nic_port_down",
            "pcie_degraded", "link_errors", "host_pressure"]
