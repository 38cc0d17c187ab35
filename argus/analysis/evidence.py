"""The evidence contract: which records an incident's ``evidence`` list holds, and the fields
its readers (the CLI's deep lines, the HTML report, the web UI) rely on.

Evidence records stay JSON objects — they are stored as JSON in the incidents table, shown
verbatim in the report and served to the UI — but every kind is named here, with the level
that produces it and the fields a reader takes from it. ``check_evidence`` validates a list;
the golden tests run it over every scenario, so renaming a field in a producer breaks a
test, not a page.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Iterable, Mapping

__all__ = ["Level", "EvidenceKind", "REQUIRED_FIELDS", "check_evidence"]


class Level(StrEnum):
    L1 = "L1"  # step times: anomalous windows, impact estimates
    L2 = "L2"  # stragglers: busy time, arrival, per-step transfers
    L3 = "L3"  # kernels: distribution distances, communicator floors
    L4 = "L4"  # traces: replay, critical path, pipeline, device gaps
    L5 = "L5"  # stacks and host phases
    HW = "hw"  # hardware telemetry and the host's own counters
    LOG = "log"  # the job's own output (argus run's logs table)
    FLIGHT_RECORDER = "flight_recorder"  # PyTorch's Flight Recorder dumps (argus/flight_recorder)
    SDC = "sdc"  # the correctness sensors: replicas' digests (argus/analysis/sdc.py)


class EvidenceKind(StrEnum):
    # L1
    REGRESSION = "regression"
    JITTER = "jitter"
    IMPACT_ESTIMATE = "impact_estimate"
    NO_PROGRESS = "no_progress"
    STEPS_NEVER_FINISHED = "steps_never_finished"
    # L2
    BUSY_OUTLIER = "busy_outlier"
    LATE_ARRIVAL = "late_arrival"
    KERNELS_NORMAL = "kernels_normal"
    TRANSFER_SHIFT = "transfer_shift"
    COMPUTE_CULPRIT_ON_HOSTS = "compute_culprit_on_hosts"
    VICTIM_TRANSFERS = "victim_transfers"  # slow-looking transfers a compute culprit explains
    BLOCKED_IN_COLLECTIVES = "blocked_in_collectives"
    NEVER_JOINED = "never_joined"
    RANK_DIED = "rank_died"
    NOT_REPORTED = "not_reported"
    # L3
    W1_OUTLIER = "w1_outlier"
    W1_MATRIX = "w1_matrix"
    GROUP_SHIFT = "group_shift"
    KERNEL_TIME = "kernel_time"
    # L4
    WHAT_IF = "what_if"
    WHAT_IF_SKIPPED = "what_if_skipped"
    CRITICAL_PATH = "critical_path"
    PIPELINE = "pipeline"
    GPU_IDLE = "gpu_idle"
    AGREEMENT = "agreement"
    DISAGREEMENT = "disagreement"
    CULPRIT_DISMISSED = "culprit_dismissed"  # a link put back: the culprit it was blamed on costs nothing
    # L5
    STACKS = "stacks"
    STACK = "stack"
    HOST_PHASES = "host_phases"
    # hardware
    PCIE_DEGRADED = "pcie_degraded"
    NIC_PORT_DOWN = "nic_port_down"
    THERMAL_THROTTLE = "thermal_throttle"
    LINK_ERRORS = "link_errors"  # InfiniBand port / NVLink error counters rose
    CPU_PRESSURE = "cpu_pressure"  # the host's CPUs contended, standing out from the other hosts'
    IO_PRESSURE = "io_pressure"  # the host's storage stalled, standing out from the other hosts'
    LOG_LINES = "log_lines"  # the job's log lines that bear on the incident
    # Flight Recorder
    STUCK_COLLECTIVE = "stuck_collective"
    CONSEQUENCE = "consequence"  # a stuck collective that only waits for ranks waiting elsewhere
    UNREADABLE_DUMP = "unreadable_dump"
    # correctness
    REPLICA_DISAGREEMENT = "replica_disagreement"  # replicas' digests of one check differ
    EXPOSURE = "exposure"  # from which step the state may be wrong, and the checkpoints that follow
    NONFINITE_OUTLIER = "nonfinite_outlier"  # NaN/Inf on a minority of replicas: a heuristic
    GEMM_VIOLATION = "gemm_violation"  # a sampled GEMM's output off its inputs, and what its re-run said


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
