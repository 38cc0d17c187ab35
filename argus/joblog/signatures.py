"""The one table of what a job's log lines mean: a kind, a severity, whether the job stopped.

Add a signature here (a kind and a regular expression over one line, the rank prefix already
taken off) and every reader — the scanner, the store, the diagnosis, the report — knows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["LogKind", "Signature", "SIGNATURES", "KERNEL_SIGNATURES", "FAIL_STOP_KINDS", "QUIET_KINDS"]


class LogKind(StrEnum):
    NCCL_WARN = "nccl_warn"
    NCCL_CONNECT = "nccl_connect"  # NCCL (WARN or INFO) could not connect to a peer: refused, timed out, failed
    NCCL_ERROR = "nccl_error"
    PEER_LOST = "peer_lost"  # a collective failed because a peer went away: a victim's error
    WATCHDOG_TIMEOUT = "watchdog_timeout"
    CUDA_ERROR = "cuda_error"
    OOM = "oom"
    XID = "xid"
    DATALOADER = "dataloader"
    EXCEPTION = "exception"  # an uncaught traceback's last line, with its innermost frame (the scanner's)
    KILLED = "killed"  # a rank ended by a signal (the launcher's report)
    WORKER_FAILED = "worker_failed"  # a rank exited with an error code (the launcher's report)
    STOPPED = "stopped"  # a rank the launcher stopped (SIGTERM/SIGINT) after another failed: a victim
    NIC_DOWN = "nic_down"  # the kernel says a network port lost its link (the host's kernel log)
    CHECKPOINT = "checkpoint"  # the job says it saved (or is saving) a checkpoint, and where: ``path`` group
    #: PyTorch's desync report names the ranks that caused a collective timeout (one event per
    #: rank it names, whichever rank printed it: the scanner's ``DESYNC``)
    DESYNC = "desync"
    #: NCCL's RAS report has this rank behind on a communicator's collective count (``ras.py``)
    RAS_BEHIND = "ras_behind"
    #: PyTorch's Flight Recorder analyzer (``torchfrtrace``) lists this rank missing from a collective
    FR_MISSING = "fr_missing"
    #: torchrun's agent could not meet the other nodes' agents at its exit barrier after its own
    #: workers finished (the agent serving the store exited first): the launcher's teardown, not the job's
    LAUNCHER_EXIT = "launcher_exit"
    OTHER = "other"  # lines no signature matched: kept only as counts


@dataclass(frozen=True)
class Signature:
    kind: LogKind
    severity: str  # "info" | "warning" | "error"
    pattern: re.Pattern


#: First match wins. Lines are matched after the rank prefix is taken off. A line is up to 64 KiB:
#: a pattern with a wildcard between two words starts with ``^(?>.*?first word)`` (atomic), so a
#: line of nothing but the first word costs one pass instead of one per occurrence.
SIGNATURES: tuple[Signature, ...] = (
    # before NCCL WARN: "NCCL WARN NET/Socket : Connect to 10.0.0.2<43411> failed : Connection refused" says
    # more than a warning; NCCL INFO's "Call to connect returned Connection refused, retrying" too
    Signature(LogKind.NCCL_CONNECT, "warning", re.compile(
        # atomic: the first NCCL word only, so a 64 KiB line of them costs one pass, not one per word
        r"^(?>.*?(?:\bNCCL (?:WARN|INFO)\b|\bNET/(?:Socket|IB)\b|\bsocket(?:Start|Finalize|Poll)?Connect\b)).*?"
        r"(?:\b[Cc]onnect(?:ion)? to .{1,160}? failed\b|\bCall to connect returned\b|"
        r"\b[Cc]onnect(?:ion)? (?:refused|timed out)\b)")),
    Signature(LogKind.NCCL_WARN, "warning", re.compile(r"\bNCCL WARN\b")),
    Signature(LogKind.PEER_LOST, "warning", re.compile(
        r"Connection (?:reset|closed) by peer|pair closure|Broken pipe|ncclRemoteError|"
        r"remote process exited or there was a network error")),
    Signature(LogKind.NCCL_ERROR, "error", re.compile(
        r"\bNCCL (?:error|Error)\b|nccl(?:SystemError|InternalError|UnhandledCudaError|InvalidUsage)")),
    Signature(LogKind.WATCHDOG_TIMEOUT, "error", re.compile(
        r"Watchdog caught collective operation timeout|collective operation timeout|"
        r"Timed out waiting \d+ ?ms for|Application timeout caused pair closure|^(?>.*?ProcessGroupGloo).*[Tt]imed out")),
    Signature(LogKind.OOM, "error", re.compile(r"CUDA out of memory|OutOfMemoryError|\bCannot allocate memory\b")),
    Signature(LogKind.CUDA_ERROR, "error", re.compile(
        r"CUDA error:|cudaError\w+|an illegal memory access was encountered|device-side assert triggered")),
    Signature(LogKind.XID, "error", re.compile(r"NVRM: Xid \([^)]{0,64}\): \d+")),
    # what trainers print when they save: HF Trainer "Saving model checkpoint to DIR", Megatron
    # "saving checkpoint at iteration N to DIR", DeepSpeed "Saving model checkpoint: FILE",
    # Lightning "saving model to 'FILE'", and the plain "saved checkpoint to FILE"; the path is
    # what the correctness plane names (checkpoints saved after a corruption are suspect)
    Signature(LogKind.CHECKPOINT, "info", re.compile(
        r"^(?>.*?\b(?:[Ss]av(?:ing|ed)|[Ww]r(?:ote|iting))\b)(?:.{0,48}?\bcheckpoint\b.{0,64}?(?:\bto\b|:)|"
        r" model to) ?'?(?P<path>[^\s',]{1,400})")),
    Signature(LogKind.DATALOADER, "warning", re.compile(
        r"DataLoader worker \(pid\(?s?\)?[ \d,]*\) (?:is killed|exited unexpectedly)|DataLoader timed out|"
        r"Unexpected (?:bus error|segmentation fault|floating-point exception) encountered in worker")),
)

#: The host's kernel log (``kernel.py``), read while the job runs: what the driver or the OS did to
#: a rank's device or process. A ``pid`` group names the process (its rank, where it is one).
KERNEL_SIGNATURES: tuple[Signature, ...] = (
    Signature(LogKind.XID, "error", re.compile(r"NVRM: Xid \([^)]{0,64}\): \d+(?:, pid=(?P<pid>\d+))?")),
    Signature(LogKind.OOM, "error", re.compile(
        r"Out of memory: Killed process (?P<pid>\d+)|^(?>.*?oom-kill:).*?\bpid=(?P<pid2>\d+)|Memory cgroup out of memory: "
        r"Killed process (?P<pid3>\d+)")),
    Signature(LogKind.NIC_DOWN, "warning", re.compile(
        r"\b[Ll]ink (?:is )?[Dd]own\b|\bNIC Link is Down\b|port \d+ (?:state|link) (?:changed to )?DOWN")),
)

#: Kinds that mean a rank stopped: the diagnosis makes a fail-stop of them
FAIL_STOP_KINDS = frozenset({LogKind.EXCEPTION, LogKind.KILLED, LogKind.WORKER_FAILED, LogKind.CUDA_ERROR,
                             LogKind.OOM, LogKind.XID})

#: Kinds kept in the store but not said at ``argus run``'s end: they tell nothing about the job
QUIET_KINDS = frozenset({LogKind.OTHER, LogKind.LAUNCHER_EXIT})
