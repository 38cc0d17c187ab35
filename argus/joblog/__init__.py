"""The job's own output as evidence: ``argus run`` passes each stream through unchanged and turns
known lines (NCCL warnings, watchdog timeouts, CUDA errors, out-of-memory, Xid, DataLoader
failures, uncaught exceptions, ranks killed or failed) into timed events with ranks, kept in the
store's ``logs`` table, with what the host's kernel log says meanwhile (GPU Xids, the OOM killer,
NIC links down: ``kernel.py``); the diagnosis puts them next to its incidents."""

from argus.joblog.kernel import KMSG, KernelLog, parse_kernel_line
from argus.joblog.launch import local_rank_offset
from argus.joblog.record import JobLog, events_table
from argus.joblog.scanner import LogEvent, LogScanner
from argus.joblog.signatures import FAIL_STOP_KINDS, KERNEL_SIGNATURES, SIGNATURES, LogKind, Signature
from argus.joblog.tee import Tee, job_streams

__all__ = ["JobLog", "events_table", "LogEvent", "LogScanner", "FAIL_STOP_KINDS", "SIGNATURES", "KERNEL_SIGNATURES",
           "LogKind", "Signature", "Tee", "job_streams", "KMSG", "KernelLog", "parse_kernel_line",
           "local_rank_offset"]
