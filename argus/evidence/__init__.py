"""Evidence: full-fidelity Perfetto traces of recent windows, with bounded retention."""

from argus.evidence.perfetto import UNFINISHED, build_perfetto_trace, write_perfetto_trace
from argus.evidence.retention import RetentionPolicy, enforce_retention

__all__ = ["RetentionPolicy", "UNFINISHED", "build_perfetto_trace", "enforce_retention", "write_perfetto_trace"]
