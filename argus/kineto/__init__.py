"""PyTorch Profiler (Kineto) traces in and out: ``argus ingest kineto`` and ``argus export kineto``.

Import: per-rank Chrome-trace JSON → a run store (steps, phases, raw kernels and their
summaries), through the same window writer as the live processor. Export: a store → per-rank
Chrome-trace JSON that Perfetto, TensorBoard and Holistic Trace Analysis open.
"""

from argus.kineto.exporter import ExportResult, export_kineto
from argus.kineto.importer import (
    Failure,
    FileReport,
    ImportResult,
    find_trace_files,
    group_kind_of,
    import_kineto,
    import_traces,
    read_traces,
)
from argus.kineto.names import PhaseName, phase_name, rank_from_filename
from argus.kineto.reader import RankTrace, read_trace

__all__ = [
    "ExportResult",
    "Failure",
    "FileReport",
    "ImportResult",
    "PhaseName",
    "RankTrace",
    "export_kineto",
    "find_trace_files",
    "group_kind_of",
    "import_kineto",
    "import_traces",
    "phase_name",
    "rank_from_filename",
    "read_trace",
    "read_traces",
]
