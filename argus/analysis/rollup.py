"""Every rank's per (step, phase) aggregates over the whole run, from one scan of its phases.

A diagnosis asks the phases the same few aggregate questions many times: each window's
per-(rank, step, phase) totals (L2's screen, the link rule), each host phase's whole-run
seconds per rank (L2), the per-step host time and collective time of the observations, the
collectives' call rates (L3), the checkpoint steps (L1). Each was a scan of every phase row —
at 10,240 ranks × 20 steps, 89 M rows and about a second a scan, 12 s in all. Here one
grouped scan (and one of the forward/backward blocks) answers them all; the windows, ranks
and names are then numpy selections of a table a twentieth of the size.

The start-up rule of :func:`~argus.analysis.frames.step_phases` holds: what a rank did before
its step 0 began is not step 0's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.analysis.frames import PhaseTotals, startup_rule
from argus.store import TABLES, Attempt, conform
from argus.store.phase_totals import totals_query
from argus.uniques import sorted_unique
from argus.vocab import PhaseCategory

__all__ = ["PhaseRollup", "load_rollup"]

#: The blocks (phases run once per microbatch) are told on the phases of ranks below this.
BLOCK_SAMPLE_RANKS = 64


@dataclass
class _Blocks:
    """Per (rank, step, microbatch, name) aggregates of the block phases."""

    rank: np.ndarray
    step: np.ndarray
    microbatch: np.ndarray
    name: np.ndarray  # ids into the rollup's names
    work_ns: np.ndarray
    min_ns: np.ndarray
    count: np.ndarray


@dataclass
class PhaseRollup:
    """Per (rank, step, name) over every step of the run. ``work_ns``: finished durations less
    the waiting the producer measured inside them; ``pos_ns``: finished durations;
    ``pos_nomb_ns``: the same over the rows outside any microbatch (nan where there were none)."""

    rank: np.ndarray
    step: np.ndarray
    name: np.ndarray  # ids into names
    count: np.ndarray
    work_ns: np.ndarray
    min_ns: np.ndarray  # shortest finished duration (nan if none)
    pos_ns: np.ndarray
    pos_nomb_ns: np.ndarray
    names: list[str]
    category: list[str]  # per name
    group_kind: list[str]  # per name
    block_max: dict[int, dict[str, int]]  # step → name → most rows of one (rank, microbatch) on the sampled ranks
    blocks: _Blocks

    def _names_of(self, category: str) -> np.ndarray:
        return np.array([i for i, c in enumerate(self.category) if c == category], np.int64)

    def holds(self, lo: int, hi: int) -> bool:
        """Whether any phase of steps ``lo..hi`` is in the rollup: a window without one is skipped
        before L3 (a window of microbatch rows only may still give :meth:`totals` no row)."""
        return bool(((self.step >= lo) & (self.step <= hi)).any() or
                    ((self.blocks.step >= lo) & (self.blocks.step <= hi)).any())

    def totals(self, lo: int, hi: int) -> PhaseTotals:
        """Steps ``lo..hi`` as :class:`PhaseTotals`: per (rank, step, name), plus per microbatch
        for the phases that occur once per microbatch in those steps (on the sampled ranks)."""
        sel = (self.step >= lo) & (self.step <= hi)
        most: dict[str, int] = {}
        for s, per_name in self.block_max.items():
            if lo <= s <= hi:
                for n, v in per_name.items():
                    most[n] = max(most.get(n, 0), v)
        block_ids = [self.names.index(n) for n, v in most.items() if v == 1]
        b = self.blocks
        bsel = (b.step >= lo) & (b.step <= hi) & np.isin(b.name, block_ids)
        cats = sorted(set(self.category))
        groups = sorted(set(self.group_kind))
        cat_of = np.array([cats.index(c) for c in self.category], np.int32)
        group_of = np.array([groups.index(g) for g in self.group_kind], np.int32)
        name = np.concatenate([self.name[sel], b.name[bsel]]).astype(np.int32)
        return PhaseTotals(lo, hi, np.concatenate([self.rank[sel], b.rank[bsel]]),
                           np.concatenate([self.step[sel], b.step[bsel]]),
                           np.concatenate([np.full(int(sel.sum()), -1, np.int64), b.microbatch[bsel]]),
                           name, cat_of[name] if name.size else name, group_of[name] if name.size else name,
                           np.concatenate([self.work_ns[sel], b.work_ns[bsel]]),
                           np.concatenate([self.min_ns[sel], b.min_ns[bsel]]),
                           np.concatenate([self.count[sel], b.count[bsel]]), list(self.names), cats, groups)

    def host_totals(self, world: int, seen: np.ndarray) -> dict[str, np.ndarray]:
        """Each host phase's whole-run seconds per rank (``(world,)``; 0 for a rank in ``seen``
        that never ran it, nan for one never seen)."""
        empty = np.where(np.isin(np.arange(world), seen), 0.0, np.nan)
        ok = (self.rank >= 0) & (self.rank < world)
        out: dict[str, np.ndarray] = {}
        for k in self._names_of(PhaseCategory.HOST):
            sel = ok & (self.name == k)
            if not sel.any():
                continue
            v = empty.copy()
            v[self.rank[sel]] = 0.0
            np.add.at(v, self.rank[sel], self.pos_ns[sel] / 1e9)
            out[self.names[k]] = v
        return out

    def outside_microbatches(self, category: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rank, step, name id, ns) of ``category``'s phases outside any microbatch, per (rank, step, name)."""
        sel = np.isin(self.name, self._names_of(category)) & ~np.isnan(self.pos_nomb_ns)
        return self.rank[sel], self.step[sel], self.name[sel], self.pos_nomb_ns[sel]

    def calls_per_rank_step(self, rank_steps: int) -> tuple[list[str], list[str], list[float]]:
        """Each collective's (name, group kind, calls per rank and step)."""
        names, groups, rates = [], [], []
        for k in self._names_of(PhaseCategory.COMM):
            n = int(self.count[self.name == k].sum())
            if n:
                names.append(self.names[k])
                groups.append(self.group_kind[k])
                rates.append(n / rank_steps if rank_steps else float("nan"))
        return names, groups, rates

    def steps_all_ran(self, world: int, words: tuple[str, ...]) -> set[int]:
        """Steps in which at least 90% of the ranks ran a host phase whose name holds one of ``words``."""
        ids = [i for i in self._names_of(PhaseCategory.HOST) if any(w in self.names[i].lower() for w in words)]
        sel = np.isin(self.name, ids)
        if not sel.any():
            return set()
        pairs = np.unique(np.stack([self.step[sel], self.rank[sel]]), axis=1)
        steps, n = np.unique(pairs[0], return_counts=True)
        return {int(s) for s, c in zip(steps, n) if c >= 0.9 * world}


def load_rollup(attempt: Attempt) -> PhaseRollup:
    """The run's rollup: the ``phase_totals`` twins of its phases files, and what has no twin
    (a phases file written without one; the step 0 of a rank the start-up rule cuts, which
    needs its rows) aggregated from its phase rows by the same query.

    The twins are converted one file at a time into the rollup's arrays: concatenated first, the
    40 M twin rows of 102,400 ranks × 10 steps held 4 GB of Arrow beside the arrays (peak 7.6 GB)
    and the conversion ran at a third of its speed on memory the page cache had to give back."""
    twins = {(f.parent.name, f.name): f for f in attempt.files("phase_totals")}
    files = attempt.files("phases")
    # files that may share a (rank, step) (a step's late rows written with the next window) are
    # aggregated together from their rows: their twins cannot say how many rows one microbatch had
    shared = _overlapping([_span(f) for f in files])
    paired = [(f, twins.get((f.parent.name, f.name)) if i not in shared else None) for i, f in enumerate(files)]
    raw = [f for f, twin in paired if twin is None]
    at0 = set(attempt.files("phases", steps=(0, 0)))
    step0 = [twin for f, twin in paired if twin is not None and f in at0]
    first = _step0_rows(step0)
    if step0 and first is None:  # a step-0 twin that cannot be read: those files from their rows
        raw += [f for f, twin in paired if twin is not None and f in at0]
        paired = [(f, None if f in at0 else twin) for f, twin in paired]
    cut = _startup_cut(attempt, first) if first is not None else None
    out = _Converter(attempt.layout.world_size, sum(_rows(twin) for _, twin in paired if twin is not None))
    for f, twin in paired:
        t = _read_twin(twin) if twin is not None else None
        if t is None:
            if twin is not None:
                raw.append(f)
            continue
        if f in at0 and (cut is None or cut.size):  # their step 0 comes from its rows, under the start-up rule
            drop = t.column("step").to_numpy(zero_copy_only=False) == 0
            if cut is not None:
                drop &= np.isin(t.column("rank").to_numpy(zero_copy_only=False), cut)
            if drop.any():
                t = t.filter(pa.array(~drop))
        out.add(t)
        del t
    covered_step0 = [f for f in sorted(at0) if f not in raw]
    recorded = []
    if raw:
        recorded.append(f"SELECT * FROM read_parquet({_paths(sorted(set(raw), key=files.index))}, union_by_name = true)")
    if covered_step0 and (cut is None or cut.size):
        only = "" if cut is None else " AND rank IN (SELECT r FROM _argus_cut)"
        recorded.append(f"SELECT * FROM read_parquet({_paths([f for f in files if f in covered_step0])}, "
                        "union_by_name = true) WHERE step = 0" + only)
    if recorded:
        con = attempt.duckdb(tables=["steps"])
        try:
            if cut is not None:
                con.register("_argus_cut", pa.table({"r": pa.array(cut, pa.int32())}))
            con.execute("CREATE VIEW _argus_phases_recorded AS " + " UNION ALL BY NAME ".join(recorded))
            startup_rule(con)
            has_wait = "wait_ns" in con.sql("SELECT * FROM phases LIMIT 0").columns
            out.add(_dictionaries(conform("phase_totals", con.sql(totals_query("phases", has_wait)).to_arrow_table())))
        finally:
            con.close()
    return out.rollup()


def _rows(path: Path) -> int:
    """Rows a twin holds, from its footer (0 where it cannot be read: it is then aggregated)."""
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path).num_rows)
    except (pa.ArrowException, OSError):
        return 0


def _step0_rows(twins: list[Path]) -> pa.Table | None:
    """The step-0 rows of ``twins`` (the columns the start-up cut reads); None where one of them
    cannot be read."""
    import pyarrow.parquet as pq

    parts = []
    for path in twins:
        try:
            have = set(pq.read_schema(path).names)
            t = pq.read_table(path, columns=[c for c in ("rank", "step", "min_ns", "end_min_ns") if c in have],
                              filters=[("step", "=", 0)])
        except (pa.ArrowException, OSError, ValueError):
            return None
        cols = {}
        for c in ("rank", "step", "min_ns", "end_min_ns"):
            typ = TABLES["phase_totals"].schema.field(c).type
            cols[c] = t.column(c).cast(typ) if c in t.column_names else pa.nulls(t.num_rows, typ)
        parts.append(pa.table(cols))
    if not parts:
        return None
    return pa.concat_tables(parts)


def _startup_cut(attempt: Attempt, t: pa.Table) -> np.ndarray | None:
    """The ranks whose step 0 in the twins ``t`` may hold start-up's rows (a row that ended
    before the rank's step 0 began, :func:`~argus.analysis.frames.startup_rule`), sorted; None
    where no twin row of step 0 can tell (older twins without ``end_min_ns``: all of them)."""
    step = t.column("step").to_numpy(zero_copy_only=False)
    at0 = np.flatnonzero(step == 0)
    if not at0.size:
        return np.empty(0, np.int64)
    t0 = t.select(["rank", "min_ns", "end_min_ns"]).take(pa.array(at0))  # not the 13 columns of every row
    end = t0.column("end_min_ns")
    if end.null_count == t0.num_rows and t0.column("min_ns").null_count < t0.num_rows:
        return None  # written before the twins said when their rows ended
    never = np.iinfo(np.int64).max
    rank = t0.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    end_ns = pc.fill_null(end, never).to_numpy(zero_copy_only=False)
    unsure = end.is_null().to_numpy(zero_copy_only=False) & t0.column("min_ns").is_valid().to_numpy(
        zero_copy_only=False)  # a finished row whose end the twin does not say
    world = attempt.layout.world_size
    steps = attempt.read("steps", columns=["rank", "start_ns"], filter=pc.field("step") == 0)  # ranks of the layout
    begun = np.full(world + 1, never, np.int64)  # no step 0 record (or a rank past the world): nothing cut
    np.minimum.at(begun, steps.column("rank").to_numpy(), steps.column("start_ns").to_numpy())
    early = (end_ns <= begun[np.where((rank >= 0) & (rank < world), rank, world)]) & (end_ns != never)
    return sorted_unique(rank[unsure | early])


_STRINGS = ("name", "category", "group_kind")


def _read_twin(path: Path) -> pa.Table | None:
    """A twin's rows, its strings as dictionaries (never materialised as millions of
    Python-visible strings); None where it cannot be read (its phases are then aggregated)."""
    import pyarrow.parquet as pq

    try:
        t = pq.read_table(path, read_dictionary=list(_STRINGS))  # a schema to read by costs strings (≈ 2×)
        cols = []
        for f in TABLES["phase_totals"].schema:
            if f.name in _STRINGS:
                f = pa.field(f.name, pa.dictionary(pa.int32(), pa.string()))
            if f.name not in t.column_names:  # written before the column was
                cols.append(pa.nulls(t.num_rows, f.type))
            else:
                c = t.column(f.name)
                cols.append(c if c.type == f.type else c.cast(f.type))
        return pa.table(cols, names=TABLES["phase_totals"].schema.names)
    except (pa.ArrowException, OSError, ValueError):
        return None


def _dictionaries(t: pa.Table) -> pa.Table:
    """``t`` with its string columns dictionary-encoded (int32 indices), as the twins are read."""
    for c in _STRINGS:
        col = t.column(c)
        if not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col)
        t = t.set_column(t.column_names.index(c), c, col.cast(pa.dictionary(pa.int32(), pa.string())))
    return t


def _span(path: Path) -> tuple[int, int, int, int]:
    """(first step, last step, least rank, greatest rank) from ``path``'s footer (the widest span
    where a row group lacks statistics)."""
    import pyarrow.parquet as pq

    wide = (-(1 << 62), 1 << 62, -(1 << 62), 1 << 62)
    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowException, OSError):
        return wide
    names = meta.schema.names
    out = [1 << 62, -(1 << 62), 1 << 62, -(1 << 62)]
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for col, (lo_i, hi_i) in (("step", (0, 1)), ("rank", (2, 3))):
            stats = rg.column(names.index(col)).statistics if col in names else None
            if stats is None or not stats.has_min_max:
                return wide
            out[lo_i] = min(out[lo_i], int(stats.min))
            out[hi_i] = max(out[hi_i], int(stats.max))
    return (out[0], out[1], out[2], out[3])


def _overlapping(spans: list[tuple[int, int, int, int]]) -> set[int]:
    """Indices of the files that may hold rows of the same (rank, step) as another file."""
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    out: set[int] = set()
    for k, i in enumerate(order):
        a = spans[i]
        for j in order[k + 1:]:
            b = spans[j]
            if b[0] > a[1]:
                break
            if b[2] <= a[3] and a[2] <= b[3]:
                out.update((i, j))
    return out


def _paths(files: list[Path]) -> str:
    return "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"


#: The rollup's parts, each field in its stored type (``_rollup`` widens rank and microbatch at the end).
_WHOLE = (("rank", np.int32), ("step", np.int64), ("name", np.int32), ("count", np.int64), ("work_ns", np.float64),
          ("min_ns", np.float64), ("pos_ns", np.float64), ("pos_nomb_ns", np.float64), ("mb_most", np.int64))
_BLOCK = (("rank", np.int32), ("step", np.int64), ("microbatch", np.int32), ("name", np.int32),
          ("work_ns", np.float64), ("min_ns", np.float64), ("count", np.int64))


class _Converter:
    """Tables of twin rows into the rollup's arrays, one record batch at a time, each value
    copied once into its part (whole steps or blocks), allocated beforehand for ``rows`` (grown
    if more come). Converting whole columns of the 8 M twin rows of 10,240 ranks × 20 steps first
    and then selecting copied each value three times; selecting per batch into fresh arrays
    faulted in 130,000 pages. Names get ids in the order their dictionaries first list them."""

    def __init__(self, world: int, rows: int) -> None:
        self.world = world
        self.names: list[str] = []
        self.at: dict[str, int] = {}  # name → id
        self.category: list[str] = []
        self.group_kind: list[str] = []
        self.have = np.zeros(0, bool)  # names whose category and group kind are known (from their first row)
        # both parts sized for every row: pages never written are never touched
        self.whole: dict[str, np.ndarray] = {c: np.empty(rows, dt) for c, dt in _WHOLE}
        self.block: dict[str, np.ndarray] = {c: np.empty(rows, dt) for c, dt in _BLOCK}
        self.n = {"whole": 0, "block": 0}

    def add(self, t: pa.Table) -> None:
        for rb in t.to_batches():
            if rb.num_rows:
                self._batch(rb)

    def _batch(self, rb: pa.RecordBatch) -> None:
        names, at = self.names, self.at
        name_col, lut = _codes(rb.column(rb.schema.get_field_index("name")))
        for v in lut:
            if v not in at:
                at[v] = len(names)
                names.append(v)
                self.category.append("")
                self.group_kind.append("")
        name = np.array([at[v] for v in lut], np.int32)[name_col] if lut else name_col.astype(np.int32)
        if self.have.size < len(names):
            self.have = np.r_[self.have, np.zeros(len(names) - self.have.size, bool)]
        rank = _num(rb, "rank", np.int32)
        ok = (rank >= 0) & (rank < self.world)
        seen = np.zeros(len(names), bool)
        seen[name[ok]] = True
        if (seen & ~self.have).any():  # a name's first row: its category and group kind
            first = np.full(len(names), -1, np.int64)
            idx = np.flatnonzero(ok)[::-1]
            first[name[idx]] = idx  # written last to first: the first row of each name stays
            cat_codes, cats = _codes(rb.column(rb.schema.get_field_index("category")))
            grp_codes, grps = _codes(rb.column(rb.schema.get_field_index("group_kind")))
            for k in np.flatnonzero(seen & ~self.have).tolist():
                self.category[k] = cats[cat_codes[first[k]]]
                self.group_kind[k] = grps[grp_codes[first[k]]]
            self.have |= seen
        mb = _num(rb, "microbatch", np.int32)
        for key, part, fields, sel in (("whole", self.whole, _WHOLE, ok & (mb < 0)),
                                       ("block", self.block, _BLOCK, ok & (mb >= 0))):
            idx = np.flatnonzero(sel)
            k, n = idx.size, self.n[key]
            if not k:
                continue
            if n + k > part["rank"].size:  # more rows than the footers said (the aggregated ones)
                for col, arr in part.items():
                    part[col] = np.concatenate([arr[:n], np.empty(max(n + k, 2 * arr.size) - n, arr.dtype)])
            for c, dt in fields:
                src = name if c == "name" else rank if c == "rank" else mb if c == "microbatch" else _num(rb, c, dt)
                np.take(src, idx, out=part[c][n:n + k])
            self.n[key] = n + k

    def rollup(self) -> PhaseRollup:
        names = self.names
        W = {c: v[:self.n["whole"]] for c, v in self.whole.items()}
        B = {c: v[:self.n["block"]] for c, v in self.block.items()}
        rank, step, name, most = W["rank"], W["step"], W["name"], W["mb_most"]
        sampled = (rank < BLOCK_SAMPLE_RANKS) & (most > 0)
        block_max: dict[int, dict[str, int]] = {}
        for s_, n_, m_ in zip(step[sampled].tolist(), name[sampled].tolist(), most[sampled].tolist()):
            per = block_max.setdefault(int(s_), {})
            per[names[n_]] = max(per.get(names[n_], 0), int(m_))
        return PhaseRollup(rank.astype(np.int64), step, name, W["count"], W["work_ns"], W["min_ns"], W["pos_ns"],
                           W["pos_nomb_ns"], names, self.category, self.group_kind, block_max,
                           _Blocks(B["rank"].astype(np.int64), B["step"], B["microbatch"].astype(np.int64), B["name"],
                                   B["work_ns"], B["min_ns"], B["count"]))


def _codes(col: pa.Array) -> tuple[np.ndarray, list[str]]:
    """A string column as (codes, values): a dictionary's own, or one made for it."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    return (np.asarray(col.indices.to_numpy(zero_copy_only=False), np.int64),
            [str(v) for v in col.dictionary.to_pylist()])


def _num(rb: pa.RecordBatch, c: str, dtype: type) -> np.ndarray:
    """Column ``c`` of ``rb`` as ``dtype`` (a view where the type allows; nulls as nan)."""
    return np.asarray(rb.column(rb.schema.get_field_index(c)).to_numpy(zero_copy_only=False), dtype)
