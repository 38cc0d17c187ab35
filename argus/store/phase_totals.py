"""``phase_totals``: each phases file's per (rank, step, phase) aggregates, written beside it.

A diagnosis asks every window for per-rank totals, and the run for host and collective time
per rank; over raw phases each is a scan of every row (at 10,240 ranks × 20 steps, 89 M rows
and about a second a scan). Aggregated once, as the rows are written, they are a few percent
of the size. The same query aggregates a phases file without its twin (an older store, a
crash between the two writes) when it is read, so both give the same rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["TWIN_OF", "TotalsWriter", "totals_query", "phase_totals_of", "backfill"]

#: The table whose files get a ``phase_totals`` twin of the same name.
TWIN_OF = "phases"


def totals_query(source: str, has_wait: bool = True) -> str:
    """SQL over ``source`` (a relation with the phases columns) that yields ``phase_totals`` rows."""
    work = "dur_ns - greatest(coalesce(wait_ns, -1), 0)" if has_wait else "dur_ns"
    # summed as DOUBLE: exact for integers below 2⁵³ ns (104 days), where an integer sum is a
    # HUGEINT that reaches Arrow as decimal128 (a third of a second per million rows to numpy)
    return (
        "WITH per_mb AS (SELECT rank, step, microbatch, name, any_value(category) AS category, "
        "any_value(group_kind) AS group_kind, count(*) AS n, "
        f"sum(CAST(CASE WHEN dur_ns >= 0 THEN {work} ELSE 0 END AS DOUBLE)) AS work, "
        "CAST(min(CASE WHEN dur_ns >= 0 THEN dur_ns END) AS DOUBLE) AS mn, "
        "CAST(sum(greatest(dur_ns, 0)) AS DOUBLE) AS pos, "
        f"min(CASE WHEN dur_ns >= 0 THEN start_ns + dur_ns END) AS em FROM {source} GROUP BY rank, step, microbatch, name) "
        "SELECT rank, step, -1 AS microbatch, name, any_value(category) AS category, "
        "any_value(group_kind) AS group_kind, CAST(sum(n) AS BIGINT) AS count, sum(work) AS work_ns, min(mn) AS min_ns, "
        "sum(pos) AS pos_ns, sum(pos) FILTER (WHERE microbatch < 0) AS pos_nomb_ns, "
        "CAST(coalesce(max(n) FILTER (WHERE microbatch >= 0 AND category != 'comm'), 0) AS BIGINT) AS mb_most, "
        "min(em) AS end_min_ns "
        "FROM per_mb GROUP BY rank, step, name "
        "UNION ALL SELECT rank, step, microbatch, name, category, group_kind, n, work, mn, pos, NULL, n, em "
        "FROM per_mb WHERE microbatch >= 0 AND n = 1 AND category != 'comm'")


class TotalsWriter:
    """Derives ``phase_totals`` for one writer, on one single-threaded DuckDB connection held for
    its life: a connection costs ~20 ms, more than aggregating a small window (a processor closes
    one every few seconds). Not for concurrent use: one per writer, as the writers are."""

    def __init__(self) -> None:
        self._con: Any = None

    def __call__(self, phases: pa.Table) -> pa.Table:
        if self._con is None:
            self._con = _connect()
        return phase_totals_of(phases, self._con)


def _connect() -> Any:
    """A connection on one thread: the writer runs beside the training ranks, and a query
    spreading over every core at each window's close takes them from the job (the observer must
    not change the observed); a window's aggregation is small."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads TO 1")
    return con


def phase_totals_of(phases: pa.Table, con: Any = None) -> pa.Table:
    """The ``phase_totals`` rows of one conformed ``phases`` table (on ``con``, else a connection
    of its own)."""
    from argus.store.schema import conform

    own = con is None
    con = _connect() if own else con
    try:
        con.register("_argus_phases", phases)
        try:
            t = con.sql(totals_query("_argus_phases", "wait_ns" in phases.column_names)).to_arrow_table()
        finally:
            con.unregister("_argus_phases")
    finally:
        if own:
            con.close()
    return conform("phase_totals", t)


def backfill(attempt: Any) -> int:  # an Attempt (whose module imports this one)
    """Write the missing ``phase_totals`` twin of every readable phases file of ``attempt``
    (a store written before they existed); returns how many were written."""
    import pyarrow.parquet as pq

    from argus.store.files import write_parquet_atomic
    from argus.store.schema import TABLES, conform

    have = {(f.parent.name, f.name) for f in attempt.files("phase_totals")}
    derive = TotalsWriter()
    written = 0
    for f in attempt.files(TWIN_OF):
        if (f.parent.name, f.name) in have:
            continue
        twin = attempt.path / "phase_totals" / f.parent.name / f.name
        if twin.exists():  # present but unreadable: left for the operator to look at
            continue
        phases = conform(TWIN_OF, pq.read_table(f, schema=TABLES[TWIN_OF].schema))
        write_parquet_atomic(twin, derive(phases), "phase_totals", f.parent.name)
        written += 1
    return written
