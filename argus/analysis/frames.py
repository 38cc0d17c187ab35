"""Columnar views of a store that the detectors share, built once per window.

``StepFrame`` is every rank's step durations as a ``(steps, ranks)`` matrix. ``PhaseFrame``
is one window's phases as arrays sorted by (rank, start), with each compute or host phase's
**busy** time: its duration minus the communication phases nested inside it (time blocked
in a collective or a pipeline receive is waiting, not work). Nesting is found with one
``searchsorted`` over (rank, start) keys — no per-rank loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.store import Attempt
from argus.vocab import PhaseCategory
from argus.uniques import sorted_unique

__all__ = ["StepFrame", "PhaseFrame", "PhaseTotals", "WindowFrames", "load_steps", "load_phases",
           "step_phases", "step_phases_sql", "startup_rule", "encode"]


def encode(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """Strings → (int ids, vocabulary)."""
    d = pc.dictionary_encode(col)
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    return d.indices.to_numpy(zero_copy_only=False).astype(np.int32), d.dictionary.to_pylist()


def step_phases(attempt: Attempt, steps: tuple[int, int] | None = None, connection: Any = None) -> Any:
    """A DuckDB connection whose ``phases`` view holds only the phases inside their steps (and a
    ``steps`` view).

    Step 0 begins with the first forward, not when tracing starts, so what a rank does before it
    (imports, building the model and the data, a DDP broadcast) is recorded as step 0 but lies
    before the step's start: about a second of garbage collections a rank in a small CPU job.
    Read as step 0's work, the few tens of ms one rank's start-up collections took more than its
    peer's became a "host stall in gc" that "nearly doubled" a 0.15 s step (CI's healthy
    pipeline job). A phase that ended before its rank's step 0 began is start-up's; an unfinished
    one (``dur_ns < 0``) is kept, for the hang analysis. ``steps`` (inclusive): views over the
    files that may hold those steps only (:meth:`Attempt.duckdb`), for a window's query.
    ``connection``: a kept one to define the views in (replacing its earlier ones)."""
    if connection is not None:
        connection.execute("DROP VIEW IF EXISTS phases; DROP VIEW IF EXISTS _argus_phases_recorded")
    con = attempt.duckdb(connection, tables=["phases", "steps"], steps=steps)
    con.execute('ALTER VIEW phases RENAME TO _argus_phases_recorded')
    startup_rule(con)
    return con


def startup_rule(con: Any) -> None:
    """A ``phases`` view of ``_argus_phases_recorded`` without what ended before its rank's
    step 0 began (``steps``: the view of the steps table)."""
    con.execute("CREATE VIEW phases AS SELECT p.* FROM _argus_phases_recorded p LEFT JOIN "
                "(SELECT rank, min(start_ns) AS t0 FROM steps WHERE step = 0 GROUP BY rank) z "
                "ON p.step = 0 AND p.rank = z.rank "
                "WHERE z.t0 IS NULL OR p.dur_ns < 0 OR p.start_ns + p.dur_ns > z.t0")


def step_phases_sql(attempt: Attempt, query: str) -> pa.Table:
    """``query`` over :func:`step_phases`'s views, as an Arrow table."""
    con = step_phases(attempt)
    try:
        return con.sql(query).to_arrow_table()
    finally:
        con.close()


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
    wait: np.ndarray | None = None  # ns the producer measured blocked inside the phase; -1 = not measured

    @property
    def n(self) -> int:
        return len(self.rank)

    def cat_id(self, category: str) -> int:
        return self.cats.index(category) if category in self.cats else -1

    @property
    def is_comm(self) -> np.ndarray:
        return self.cat == self.cat_id(PhaseCategory.COMM)

    def name_id(self, name: str) -> int:
        return self.names.index(name) if name in self.names else -1

    def take(self, rows: np.ndarray) -> PhaseFrame:
        """The frame of ``rows`` (a mask or sorted indices: the (rank, start) order is kept),
        sharing the vocabularies."""
        wait = None if self.wait is None else self.wait[rows]
        return PhaseFrame(self.lo, self.hi, self.rank[rows], self.step[rows], self.mb[rows], self.name[rows],
                          self.cat[rows], self.group[rows], self.start[rows], self.dur[rows], self.busy[rows],
                          self.names, self.cats, self.groups, wait)


def load_phases(attempt: Attempt, lo: int, hi: int, ranks: np.ndarray | None = None,
                steps: list[int] | None = None, connection: Any = None) -> PhaseFrame:
    """Phases of steps ``lo..hi`` (of ``ranks`` and ``steps`` only, if given) sorted by (rank,
    start), with busy times. ``connection``: a kept DuckDB connection to query in (left open)."""
    con = step_phases(attempt, steps=(int(lo), int(hi)), connection=connection)
    try:
        where = f"step BETWEEN {int(lo)} AND {int(hi)}"
        if steps is not None:
            where += f" AND step IN ({', '.join(str(int(s)) for s in steps) or 'NULL'})"
        if ranks is not None:
            con.register("_argus_ranks", pa.table({"r": pa.array(np.asarray(ranks, np.int64), pa.int32())}))
            where += " AND rank IN (SELECT r FROM _argus_ranks)"
        wait = "wait_ns" if "wait_ns" in con.sql("SELECT * FROM phases LIMIT 0").columns else "-1 AS wait_ns"
        t = con.sql(f"SELECT rank, step, microbatch, name, category, group_kind, start_ns, dur_ns, {wait} "
                    f"FROM phases WHERE {where} ORDER BY rank, start_ns, dur_ns DESC").to_arrow_table()
    finally:
        if connection is None:
            con.close()
        elif ranks is not None:
            con.unregister("_argus_ranks")
    name, names = encode(t.column("name"))
    cat, cats = encode(t.column("category"))
    grp, groups = encode(t.column("group_kind"))
    f = PhaseFrame(lo, hi, t.column("rank").to_numpy().astype(np.int64), t.column("step").to_numpy(),
                   t.column("microbatch").to_numpy(), name, cat, grp, t.column("start_ns").to_numpy(),
                   t.column("dur_ns").to_numpy(), np.empty(0), names, cats, groups,
                   t.column("wait_ns").fill_null(-1).to_numpy())
    f.busy = _busy(f, f.wait)
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


def _remap(ids: np.ndarray, vocab: list[str], into: list[str]) -> np.ndarray:
    """``ids`` into ``vocab`` as ids into ``into`` (extended in place with the new words)."""
    index = {w: i for i, w in enumerate(into)}
    for w in vocab:
        if w not in index:
            index[w] = len(into)
            into.append(w)
    table = np.array([index[w] for w in vocab], np.int32)
    return table[ids] if ids.size else ids.astype(np.int32)


def _concat(parts: list[PhaseFrame]) -> PhaseFrame:
    """One frame of the rows of ``parts``, each in (rank, start) order, either of disjoint ranks
    or of the same ranks in successive steps: a stable sort by rank alone then restores the
    (rank, start) order without comparing starts. Busy times are per rank, so they stay valid."""
    parts = [p for p in parts if p.n] or parts[:1]
    if len(parts) == 1:
        return parts[0]
    a = parts[0]
    names, cats, groups = list(a.names), list(a.cats), list(a.groups)
    name = np.concatenate([_remap(p.name, p.names, names) for p in parts])
    cat = np.concatenate([_remap(p.cat, p.cats, cats) for p in parts])
    group = np.concatenate([_remap(p.group, p.groups, groups) for p in parts])
    wait = np.concatenate([p.wait if p.wait is not None else np.full(p.n, -1, np.int64) for p in parts])

    def cat_(col: str) -> np.ndarray:
        return np.concatenate([getattr(p, col) for p in parts])

    f = PhaseFrame(min(p.lo for p in parts), max(p.hi for p in parts), cat_("rank"), cat_("step"), cat_("mb"),
                   name, cat, group, cat_("start"), cat_("dur"), cat_("busy"), names, cats, groups, wait)
    return f.take(np.argsort(f.rank, kind="stable"))


#: Phase rows the shared frames keep across windows (about 70 bytes each: ~0.6 GB). A diagnosis
#: visits every window before L4/L5 return to the few an incident covers; past this, the least
#: recently used windows are dropped and read again if a level asks for them.
MAX_SHARED_ROWS = 8_000_000


@dataclass
class _Held:
    parts: list[PhaseFrame]  # reads of the window, of disjoint ranks, in the order they were read
    ranks: np.ndarray | None  # sorted ranks read, None = every rank

    @property
    def rows(self) -> int:
        return sum(p.n for p in self.parts)


class WindowFrames:
    """Each analysis window's phases, read from the store once and shared by every level.

    L2, the L4 replay, the L4 pipeline and GPU-idle analyses all ask for phases of steps and
    ranks inside a window; each (window, rank) is read at most once, the first time a level
    needs it (L2 reads every rank up to ``exact_ranks``, its screened candidates above; L4 adds
    the replicas it replays), and every later request is a view of what is held. A request
    outside every window is its own entry. Safe to share between threads: one request at a time
    reads or selects (the diagnosis reads the next window, or two attributions' ranks, in workers)."""

    def __init__(self, attempt: Attempt, spans: list[tuple[int, int]], max_rows: int = MAX_SHARED_ROWS) -> None:
        self.attempt = attempt
        self.spans = sorted(spans)
        self.max_rows = max_rows
        self.reads = 0  # store reads so far (tests: a window is read once)
        self._held: dict[tuple[int, int], _Held] = {}
        # one DuckDB instance for every read: a fresh one a read gave its memory back and faulted
        # it in again (69,000 → 28,000–39,000 page faults a 1.1 M-row read at 10,240 ranks)
        self._con: Any = None
        self._lock = threading.RLock()

    def _connection(self) -> Any:
        if self._con is None:
            import duckdb

            self._con = duckdb.connect()
        return self._con

    def close(self) -> None:
        """Close the kept connection (the frames read no more; a later read opens another)."""
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        for a, b in self.spans:
            if a <= lo and hi <= b:
                return a, b
        return lo, hi

    def _read(self, lo: int, hi: int, ranks: np.ndarray | None) -> PhaseFrame:
        self.reads += 1
        return load_phases(self.attempt, lo, hi, ranks=ranks, connection=self._connection())

    def phases(self, lo: int, hi: int, ranks: np.ndarray | list[int] | None = None) -> PhaseFrame:
        """Phases of steps ``lo..hi`` (of ``ranks`` only, if given), as :func:`load_phases` returns them."""
        with self._lock:
            key = self._span(lo, hi)
            want = None if ranks is None else sorted_unique(np.asarray(ranks, np.int64))
            held = self._held.pop(key, None)  # re-inserted below: most recently used last
            if held is None:
                held = _Held([self._read(*key, want)], want)
            elif held.ranks is not None:
                if want is None:  # every rank: read the ones not held yet
                    missing, have = np.setdiff1d(np.arange(self.attempt.layout.world_size), held.ranks), None
                else:
                    missing = np.setdiff1d(want, held.ranks)
                    have = np.union1d(held.ranks, missing)
                if missing.size:
                    held = _Held([*held.parts, self._read(*key, missing)], have)
            self._held[key] = held
            self._evict()
            whole_steps = key == (lo, hi)
            views = []
            for part in held.parts:
                sel = np.ones(part.n, bool) if whole_steps else (part.step >= lo) & (part.step <= hi)
                if want is not None:
                    sel &= np.isin(part.rank, want)
                views.append(part if sel.all() else part.take(np.flatnonzero(sel)))
            return _concat(views)

    def sampled(self, lo: int, hi: int, steps: list[int], ranks: np.ndarray | list[int]) -> PhaseFrame:
        """Phases of a few ``steps`` of window ``lo..hi`` for ``ranks``: from what is held where it
        holds them all, else read for those steps alone and not kept (a large job's attribution
        reads 3 of a window's steps of its replayed replicas once)."""
        with self._lock:
            want = sorted_unique(np.asarray(ranks, np.int64))
            held = self._held.get(self._span(lo, hi))
            if held is not None and (held.ranks is None or not np.setdiff1d(want, held.ranks).size):
                f = self.phases(lo, hi, want)
                return f.take(np.flatnonzero(np.isin(f.step, steps)))
            self.reads += 1
            return load_phases(self.attempt, lo, hi, ranks=want, steps=steps, connection=self._connection())

    def of_steps(self, steps: list[int], ranks: np.ndarray | list[int] | None = None) -> PhaseFrame:
        """Phases of ``steps`` (which may lie in several windows), each window's from what it holds."""
        with self._lock:
            by_span: dict[tuple[int, int], list[int]] = {}
            for s in sorted(set(int(x) for x in steps)):
                by_span.setdefault(self._span(s, s), []).append(s)
            views = []
            for (lo, hi), ss in by_span.items():  # successive windows: _concat keeps the time order
                f = self.phases(lo, hi, ranks)
                views.append(f.take(np.flatnonzero(np.isin(f.step, ss))))
            return _concat(views) if views else self.phases(0, -1, ranks)

    def _evict(self) -> None:
        while len(self._held) > 1 and sum(h.rows for h in self._held.values()) > self.max_rows:
            del self._held[next(iter(self._held))]
