"""Columnar views of a store that the detectors share, built once per window.

``StepFrame`` is every rank's step durations as a ``(steps, ranks)`` matrix. ``PhaseFrame``
is one window's phases as arrays sorted by (rank, start), with each compute or host phase's
**busy** time: its duration minus the communication phases nested inside it (time blocked
in a collective or a pipeline receive is waiting, not work). Nesting is found with one
``searchsorted`` over (rank, start) keys — no per-rank loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.store import Attempt

__all__ = ["StepFrame", "PhaseFrame", "PhaseTotals", "load_steps", "load_phases", "load_phase_totals", "load_host_totals", "encode"]


def encode(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """Strings → (int ids, vocabulary)."""
    d = pc.dictionary_encode(col)
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    return d.indices.to_numpy(zero_copy_only=False).astype(np.int32), d.dictionary.to_pylist()


@dataclass
class StepFrame:
    steps: np.ndarray  # sorted step numbers
    dur_s: np.ndarray  # (n_steps, world): seconds; nan = no record, inf = never finished
    world: int

    @property
    def job_step_time(self) -> np.ndarray:
        """Median over ranks with a record (inf if any rank never finished the step)."""
        out = np.full(len(self.steps), np.nan)
        for i, row in enumerate(self.dur_s):
            have = row[~np.isnan(row)]
            if have.size:
                out[i] = np.inf if np.isinf(have).any() else float(np.median(have))
        return out


def load_steps(attempt: Attempt) -> StepFrame:
    t = attempt.read("steps", columns=["rank", "step", "start_ns", "end_ns"])
    world = attempt.layout.world_size
    if t.num_rows == 0:
        return StepFrame(np.empty(0, np.int64), np.empty((0, world)), world)
    rank = t.column("rank").to_numpy()
    step = t.column("step").to_numpy()
    start, end = t.column("start_ns").to_numpy(), t.column("end_ns").to_numpy()
    steps, idx = np.unique(step, return_inverse=True)
    dur = np.full((len(steps), world), np.nan)
    dur[idx, rank] = np.where(end >= 0, (end - start) / 1e9, np.inf)
    return StepFrame(steps, dur, world)


@dataclass
class PhaseFrame:
    lo: int
    hi: int
    rank: np.ndarray
    step: np.ndarray
    mb: np.ndarray
    name: np.ndarray  # ids into names
    cat: np.ndarray  # ids into cats
    group: np.ndarray  # ids into groups
    start: np.ndarray  # ns, host clock
    dur: np.ndarray  # ns; -1 = never finished
    busy: np.ndarray  # ns for compute/host phases (dur minus nested comm); nan for comm
    names: list[str]
    cats: list[str]
    groups: list[str]

    @property
    def n(self) -> int:
        return len(self.rank)

    def cat_id(self, category: str) -> int:
        return self.cats.index(category) if category in self.cats else -1

    @property
    def is_comm(self) -> np.ndarray:
        return self.cat == self.cat_id("comm")

    def name_id(self, name: str) -> int:
        return self.names.index(name) if name in self.names else -1


def load_phases(attempt: Attempt, lo: int, hi: int, ranks: np.ndarray | None = None) -> PhaseFrame:
    """Phases of steps ``lo..hi`` (of ``ranks`` only, if given) sorted by (rank, start), with
    busy times."""
    con = attempt.duckdb()
    try:
        where = f"step BETWEEN {int(lo)} AND {int(hi)}"
        if ranks is not None:
            con.register("_argus_ranks", pa.table({"r": pa.array(np.asarray(ranks, np.int64), pa.int32())}))
            where += " AND rank IN (SELECT r FROM _argus_ranks)"
        wait = "wait_ns" if "wait_ns" in con.sql("SELECT * FROM phases LIMIT 0").columns else "-1 AS wait_ns"
        t = con.sql(f"SELECT rank, step, microbatch, name, category, group_kind, start_ns, dur_ns, {wait} "
                    f"FROM phases WHERE {where} ORDER BY rank, start_ns, dur_ns DESC").to_arrow_table()
    finally:
        con.close()
    name, names = encode(t.column("name"))
    cat, cats = encode(t.column("category"))
    grp, groups = encode(t.column("group_kind"))
    f = PhaseFrame(lo, hi, t.column("rank").to_numpy().astype(np.int64), t.column("step").to_numpy(),
                   t.column("microbatch").to_numpy(), name, cat, grp, t.column("start_ns").to_numpy(),
                   t.column("dur_ns").to_numpy(), np.empty(0), names, cats, groups)
    f.busy = _busy(f, t.column("wait_ns").fill_null(-1).to_numpy())
    return f


def _busy(f: PhaseFrame, wait: np.ndarray | None = None) -> np.ndarray:
    """dur − the waiting the producer measured inside it (``wait_ns``), or where it did not,
    dur − Σ dur of finished comm phases that start inside it (same rank)."""
    busy = np.full(f.n, np.nan)
    if f.n == 0:
        return busy
    comm = f.is_comm
    base = int(f.start.min())
    rel = f.start - base
    # (rank, relative start) in one int64: ranks < 2^17, windows < 2^46 ns (19.5 hours).
    key = (f.rank << 46) | rel
    c = np.flatnonzero(comm)
    ckey = key[c]  # sorted: the frame is sorted by (rank, start)
    cdur = np.where(f.dur[c] > 0, f.dur[c], 0).astype(np.float64)
    cum = np.concatenate([[0.0], np.cumsum(cdur)])
    work = np.flatnonzero(~comm)
    end = rel[work] + np.maximum(f.dur[work], 0)
    lo_i = np.searchsorted(ckey, key[work], side="left")
    hi_i = np.searchsorted(ckey, (f.rank[work] << 46) | end, side="left")
    waited = cum[hi_i] - cum[lo_i]
    d = f.dur[work].astype(np.float64)
    if wait is not None:
        w = wait[work].astype(np.float64)
        waited = np.where(w >= 0, w, waited)
    busy[work] = np.where(d >= 0, np.maximum(d - waited, 0.0), np.nan)
    return busy


@dataclass
class PhaseTotals:
    """Per (rank, step, phase) aggregates of a window, over every rank: cheap to compute for
    10,000 ranks (one parallel hash aggregation, no sort), enough to screen for candidates
    and to compare transfer times."""

    lo: int
    hi: int
    rank: np.ndarray
    step: np.ndarray
    microbatch: np.ndarray  # -1: all microbatches together
    name: np.ndarray
    cat: np.ndarray
    group: np.ndarray
    total_ns: np.ndarray  # sum of finished durations
    min_ns: np.ndarray  # shortest finished duration (nan if none)
    count: np.ndarray
    names: list[str]
    cats: list[str]
    groups: list[str]


def load_phase_totals(attempt: Attempt, lo: int, hi: int) -> PhaseTotals:
    """Per (rank, step, name) totals, plus per (rank, step, microbatch, name) for phases that
    occur once per microbatch (forward/backward blocks, found on a sample of ranks first)."""
    con = attempt.duckdb()
    try:
        where = f"step BETWEEN {int(lo)} AND {int(hi)}"
        blocks = [r[0] for r in con.sql(
            f"SELECT name FROM (SELECT rank, step, microbatch, name, count(*) AS n FROM phases WHERE {where} "
            f"AND microbatch >= 0 AND category != 'comm' AND rank < 64 GROUP BY ALL) GROUP BY name "
            f"HAVING max(n) = 1").fetchall()]
        has_wait = "wait_ns" in con.sql("SELECT * FROM phases LIMIT 0").columns
        work = "dur_ns - greatest(coalesce(wait_ns, -1), 0)" if has_wait else "dur_ns"
        agg = ("any_value(category) AS category, any_value(group_kind) AS group_kind, "
               f"sum(CASE WHEN dur_ns >= 0 THEN {work} ELSE 0 END) AS total, "
               "min(CASE WHEN dur_ns >= 0 THEN dur_ns END) AS mn, count(*) AS n")
        per_step = con.sql(f"SELECT rank, step, -1 AS microbatch, name, {agg} FROM phases WHERE {where} "
                           f"GROUP BY rank, step, name").to_arrow_table()
        parts = [per_step]
        if blocks:
            con.register("_argus_blocks", pa.table({"b": pa.array(blocks, pa.string())}))
            parts.append(con.sql(f"SELECT rank, step, microbatch, name, {agg} FROM phases WHERE {where} AND "
                                 f"microbatch >= 0 AND name IN (SELECT b FROM _argus_blocks) "
                                 f"GROUP BY rank, step, microbatch, name").to_arrow_table().cast(per_step.schema))
    finally:
        con.close()
    t = pa.concat_tables(parts)
    name, names = encode(t.column("name"))
    cat, cats = encode(t.column("category"))
    grp, groups = encode(t.column("group_kind"))
    mn = t.column("mn").to_numpy(zero_copy_only=False).astype(np.float64)
    return PhaseTotals(lo, hi, t.column("rank").to_numpy().astype(np.int64), t.column("step").to_numpy(),
                       t.column("microbatch").to_numpy().astype(np.int64), name, cat, grp,
                       t.column("total").to_numpy().astype(np.float64), mn, t.column("n").to_numpy(),
                       names, cats, groups)


def load_host_totals(attempt: Attempt, world: int) -> dict[str, np.ndarray]:
    """Each host phase's whole-run seconds per rank (``(world,)``; 0 for a rank that reported
    steps but never ran it). A pause every rank takes once, at a step of its own (a full
    garbage collection crossing its threshold, a checkpoint), is symmetric here."""
    t = attempt.sql("SELECT rank, name, sum(greatest(dur_ns, 0))::DOUBLE / 1e9 AS total FROM phases "
                    "WHERE category = 'host' GROUP BY rank, name")
    seen = attempt.sql("SELECT DISTINCT rank FROM steps").column("rank").to_numpy()
    empty = np.where(np.isin(np.arange(world), seen), 0.0, np.nan)
    rank = t.column("rank").to_numpy().astype(np.int64)
    total = t.column("total").to_numpy()
    name, names = encode(t.column("name"))
    out: dict[str, np.ndarray] = {}
    for k, n in enumerate(names):
        sel = (name == k) & (rank >= 0) & (rank < world)
        out[n] = empty.copy()
        out[n][rank[sel]] = total[sel]
    return out
