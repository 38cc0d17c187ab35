"""Reading a per-op timeline (Parquet or CSV) into typed columns.

Required columns: ``stage`` (pipeline stage), ``dp_rank`` (data-parallel index), ``step``,
``optype`` (``forward-compute``, ``backward-recv``, ``grads-reduce-scatter``, …), ``start_ts``
and ``duration`` (seconds). Optional: ``rank`` (the global rank in the job, used to place ranks
on hosts), ``mb_id`` (microbatch; -1 or absent when not labelled). Times are the device's, on
one clock per step (the artifact starts every step at 0). Every problem names the file and
the column."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.errors import IngestError

__all__ = ["OpTrace", "read_ops", "read_meta", "REQUIRED"]

REQUIRED = ("stage", "dp_rank", "step", "optype", "start_ts", "duration")
#: Rows beyond this are refused: a timeline of a 10,000-GPU job's sampled steps is ~10⁷ rows.
MAX_ROWS = 50_000_000


@dataclass
class OpTrace:
    path: Path
    stage: np.ndarray  # int64
    dp_rank: np.ndarray  # int64
    step: np.ndarray  # int64
    optype: np.ndarray  # int32 codes into ``optypes``
    optypes: list[str]
    start_s: np.ndarray  # float64
    dur_s: np.ndarray  # float64
    rank: np.ndarray | None  # int64 global rank, when the trace has it
    mb: np.ndarray  # int64, -1 = not labelled

    @property
    def n(self) -> int:
        return len(self.step)


def read_ops(path: str | Path) -> OpTrace:
    """The timeline at ``path`` (``.parquet`` or ``.csv``); rows with a non-finite or negative
    time are refused with their count, not guessed at."""
    p = Path(path)
    if not p.is_file():
        raise IngestError(f"{p}: no such file")
    try:
        if p.suffix == ".csv":
            import pyarrow.csv as pcsv

            table = pcsv.read_csv(p)
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(p)
    except (pa.ArrowException, OSError) as exc:
        raise IngestError(f"{p}: not a Parquet or CSV table ({type(exc).__name__}: {exc})"[:400]) from None
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise IngestError(f"{p}: missing column(s) {', '.join(missing)}; a per-op timeline has "
                          f"{', '.join(REQUIRED)} (and optionally rank, mb_id)")
    if table.num_rows == 0:
        raise IngestError(f"{p}: no rows")
    if table.num_rows > MAX_ROWS:
        raise IngestError(f"{p}: {table.num_rows:,} rows, more than the {MAX_ROWS:,} one import takes")

    def ints(name: str) -> np.ndarray:
        col = table.column(name)
        try:
            arr = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise IngestError(f"{p}: column {name} must hold integers (got {col.type})") from None
        return arr

    def floats(name: str) -> np.ndarray:
        col = table.column(name)
        try:
            return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise IngestError(f"{p}: column {name} must hold numbers (got {col.type})") from None

    stage, dp_rank, step = ints("stage"), ints("dp_rank"), ints("step")
    start, dur = floats("start_ts"), floats("duration")
    bad = ~(np.isfinite(start) & np.isfinite(dur) & (dur >= 0))
    if bad.any():
        raise IngestError(f"{p}: {int(bad.sum()):,} row(s) with a missing, infinite or negative start_ts/duration")
    if (stage < 0).any() or (dp_rank < 0).any():
        raise IngestError(f"{p}: negative stage or dp_rank")
    op = pc.cast(table.column("optype"), pa.string())
    enc = pc.dictionary_encode(op.combine_chunks() if isinstance(op, pa.ChunkedArray) else op)
    if enc.null_count:
        raise IngestError(f"{p}: {enc.null_count:,} row(s) without an optype")
    rank = ints("rank") if "rank" in table.column_names else None
    mb = ints("mb_id") if "mb_id" in table.column_names else np.full(len(step), -1, np.int64)
    return OpTrace(p, stage, dp_rank, step, enc.indices.to_numpy().astype(np.int32),
                   [str(x) for x in enc.dictionary.to_pylist()], start, dur, rank, mb)


def read_meta(path: str | Path) -> dict[str, int]:
    """The job's sizes from the artifact's ``meta-*.yaml`` (flat ``key: value`` lines): pp, dp,
    tp and the data-sequence-parallel size."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise IngestError(f"{p}: cannot read ({exc.strerror or exc})") from None
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key.endswith("_size"):
            try:
                out[key[:-5]] = int(value)
            except ValueError:
                raise IngestError(f"{p}: {key} must be an integer (got {value!r})") from None
    if "pp" not in out and "dp" not in out:
        raise IngestError(f"{p}: no pp_size or dp_size")
    return out
