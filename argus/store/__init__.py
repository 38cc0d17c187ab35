"""The embedded run store: Parquet tables per run attempt, a reader API and DuckDB views."""

from argus.store.attempt import FLIGHT_RECORDER_DIR, INGESTED_FLIGHT_RECORDER_DIR, Attempt, AttemptWriter, Damage, JoinedAttempt
from argus.store.commit import STALE_LEFTOVER_S, WindowUnit
from argus.store.root import MANIFEST, Store
from argus.store.schema import SCHEMA_VERSION, TABLES, TableSpec, conform
from argus.store.window import WINDOW_STEPS, KernelSummaries, WindowData, WindowStats, WindowWriter

__all__ = ["FLIGHT_RECORDER_DIR", "INGESTED_FLIGHT_RECORDER_DIR", "Attempt", "AttemptWriter", "Damage", "JoinedAttempt", "KernelSummaries", "MANIFEST", "STALE_LEFTOVER_S", "WindowUnit", "SCHEMA_VERSION", "Store", "TABLES", "TableSpec", "WINDOW_STEPS", "WindowData",
           "WindowStats", "WindowWriter", "conform"]
