"""Argus's shared vocabulary: the small closed sets of names every package speaks.

Each set is a ``StrEnum`` whose values are the strings stored in Parquet, carried in JSON and
shown to people, so a member compares equal to its string and works as a dict key; a typo in
a member is an ``AttributeError`` at import, not a silent miss at run time. Where a set also
travels as a byte code on the wire (``argus.wire.protocol``), the members' declaration order
*is* the code table: reordering them changes the wire, and a golden test pins it.

A leaf module: it imports only the standard library, so the producer, the wire and the
analysis can all import it cheaply.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["GroupKind", "PhaseCategory", "KernelKind", "Sensor", "Rerun", "Level", "EvidenceKind", "kernel_in_group",
           "kernel_group", "split_kernel_group"]


class GroupKind(StrEnum):
    """Process-group kinds of a parallel layout (``argus.topology.layout`` says which axes each
    varies). Wire code = 1 + declaration index; code 0 means "no group"."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    EDP = "edp"
    PP = "pp"
    WORLD = "world"


class PhaseCategory(StrEnum):
    """What a phase spends its time on: the GPU's work, waiting on a collective, or the host
    alone (data loading, checkpointing, gc). Wire code = declaration index."""

    COMPUTE = "compute"
    COMM = "comm"
    HOST = "host"


class KernelKind(StrEnum):
    """What a device activity record is (CUPTI's and Kineto's record kinds, and the CPU ops a
    trace has instead when there is no GPU). Wire code = declaration index."""

    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    CPU_OP = "cpu_op"


class Sensor(StrEnum):
    """What a correctness check (a CHECKS record) looks at: the gradients the optimizer is about
    to apply, the parameters it has just written (digests replicas compare), or a sampled GEMM's
    output against its inputs. Wire code = declaration index."""

    GRADS = "grads"
    PARAMS = "params"
    GEMM = "gemm"


class Rerun(StrEnum):
    """A GEMM check's re-run after a violation: not re-run; correct on the device this time (a
    transient upset); wrong again with the same bits and a float64 host reference disagrees (the
    device computes it wrong); the reference agrees with the first result. Wire code =
    declaration index."""

    NONE = "none"
    PASSED = "passed"
    REPRODUCED = "reproduced"
    REFERENCE_AGREES = "reference_agrees"


class Level(StrEnum):
    """Which analysis level (or outside source) produced an evidence record."""

    L1 = "L1"  # step times: anomalous windows, impact estimates
    L2 = "L2"  # stragglers: busy time, arrival, per-step transfers
    L3 = "L3"  # kernels: distribution distances, communicator floors
    L4 = "L4"  # traces: replay, critical path, pipeline, device gaps
    L5 = "L5"  # stacks and host phases
    HW = "hw"  # hardware telemetry and the host's own counters
    LOG = "log"  # the job's own output (argus run's logs table)
    FLIGHT_RECORDER = "flight_recorder"  # PyTorch's Flight Recorder dumps (argus/flight_recorder)
    SDC = "sdc"  # the correctness sensors: replicas' digests (argus/analysis/sdc.py)
    ACTIVE = "active"  # an active check run on the suspects: argus verify (analysis/verification.py)


class EvidenceKind(StrEnum):
    """The kinds of record an incident's ``evidence`` list holds (``argus.analysis.evidence``
    names the fields each one's readers rely on)."""

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
    ATTRIBUTION = "attribution"  # the what-if attribution that explains the slowdown: the group, its share, the parts
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
    # L2 links, and active checks
    NOT_COMPARED = "not_compared"  # transfers that had no like group to be compared with
    VERIFICATION = "verification"  # argus verify's outcome for the incident's suspects


#: A collective kernel's name with its communicator's kind appended (``… [group dp]``): NCCL
#: names a kernel alike in every process group, and kernels are compared by name.
_GROUP_TAG = " [group "


def kernel_in_group(name: str, kind: str) -> str:
    """``name`` tagged with the kind of the process group it ran in (no tag for an empty kind)."""
    return f"{name}{_GROUP_TAG}{kind}]" if kind else name


def split_kernel_group(name: str) -> tuple[str, str | None]:
    """A tagged kernel name → (the kernel's own name, its group kind); untagged → (name, None)."""
    i = name.rfind(_GROUP_TAG)
    if i < 0 or not name.endswith("]") or i + len(_GROUP_TAG) >= len(name) - 1:
        return name, None
    return name[:i], name[i + len(_GROUP_TAG):-1]


def kernel_group(name: str) -> str | None:
    """The group kind a tagged kernel name carries, else None."""
    return split_kernel_group(name)[1]
