"""Per-op timelines: one row per operation a rank ran (its step, type, start and duration) — the
shape of the traces the what-if analysis of *Understanding Stragglers in Large Model Training
Using What-if Analysis* (OSDI 2025) publishes — read and written into a run store.

``argus ingest ops TRACE --out S`` (docs/kineto.md, "Per-op timelines")."""

from argus.optrace.importer import OpsImport, import_ops
from argus.optrace.reader import OpTrace, read_meta, read_ops

__all__ = ["OpTrace", "OpsImport", "import_ops", "read_meta", "read_ops"]
