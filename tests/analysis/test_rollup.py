"""The run's phase aggregates (``phase_totals``, written beside each phases file) say what the
phases say: a diagnosis reads the same totals from them as from the phase rows — the
per-window totals, the host totals, the rows outside microbatches — whether the twins exist,
are missing (a store written before them), damaged, or split a step across two files."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from argus.analysis.frames import PhaseTotals, encode, step_phases, step_phases_sql
from argus.analysis.rollup import _startup_cut, load_rollup
from argus.store import TABLES, Attempt, Store
from argus.store.phase_totals import backfill
from argus.topology import RunIdentity, Topology, parse_layout

RANKS, STEPS, MBS = 8, 6, 3
STEP_NS = 1_000_000



# -- the reference: the totals aggregated from the phase rows themselves, as the diagnosis did before
def load_phase_totals(attempt: Attempt, lo: int, hi: int) -> PhaseTotals:
    """Per (rank, step, name) totals, plus per (rank, step, microbatch, name) for phases that
    occur once per microbatch (forward/backward blocks, found on a sample of ranks first)."""
    con = step_phases(attempt, steps=(int(lo), int(hi)))
    try:
        where = f"step BETWEEN {int(lo)} AND {int(hi)}"
        blocks = [r[0] for r in con.sql(
            f"SELECT name FROM (SELECT rank, step, microbatch, name, count(*) AS n FROM phases WHERE {where} "
            f"AND microbatch >= 0 AND category != 'comm' AND rank < 64 GROUP BY ALL) GROUP BY name "
            f"HAVING max(n) = 1").fetchall()]
        has_wait = "wait_ns" in con.sql("SELECT * FROM phases LIMIT 0").columns
        work = "dur_ns - greatest(coalesce(wait_ns, -1), 0)" if has_wait else "dur_ns"
        # a phase name has one category and group kind: looked up once per name, not carried
        # through the group-by of millions of rows (a fifth of this read's time at 10k ranks)
        kinds = con.sql(f"SELECT name, any_value(category) AS category, any_value(group_kind) AS group_kind "
                        f"FROM phases WHERE {where} GROUP BY name").to_arrow_table()
        # summed as DOUBLE: exact for integers below 2⁵³ ns (104 days), where an integer sum is
        # a HUGEINT that reaches Arrow as decimal128 (a third of a second per million rows to numpy)
        agg = (f"sum(CAST(CASE WHEN dur_ns >= 0 THEN {work} ELSE 0 END AS DOUBLE)) AS total, "
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
    row_of = {n: i for i, n in enumerate(kinds.column("name").to_pylist())}
    at = np.array([row_of[n] for n in names], np.int64)
    cat_k, cats = encode(kinds.column("category"))
    grp_k, groups = encode(kinds.column("group_kind"))
    cat, grp = cat_k[at][name], grp_k[at][name]
    mn = t.column("mn").to_numpy(zero_copy_only=False).astype(np.float64)
    return PhaseTotals(lo, hi, t.column("rank").to_numpy().astype(np.int64), t.column("step").to_numpy(),
                       t.column("microbatch").to_numpy().astype(np.int64), name, cat, grp,
                       t.column("total").to_numpy().astype(np.float64), mn, t.column("n").to_numpy(),
                       names, cats, groups)


def load_host_totals(attempt: Attempt, world: int) -> dict[str, np.ndarray]:
    """Each host phase's whole-run seconds per rank (``(world,)``; 0 for a rank that reported
    steps but never ran it). A pause every rank takes once, at a step of its own (a full
    garbage collection crossing its threshold, a checkpoint), is symmetric here."""
    t = step_phases_sql(attempt, "SELECT rank, name, sum(greatest(dur_ns, 0))::DOUBLE / 1e9 AS total FROM phases "
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


def _step_rows(rng, rank: int, step: int) -> list[tuple]:
    """(rank, step, mb, name, category, group, start, dur, wait) of one rank's step."""
    t = step * STEP_NS + 10_000
    rows = [(rank, step, -1, "dataloader", "host", "", t, int(rng.integers(1000, 9000)), -1)]
    t += 10_000
    for mb in range(MBS):
        rows.append((rank, step, mb, "forward-compute", "compute", "", t, int(rng.integers(20_000, 30_000)),
                     int(rng.integers(-1, 2000))))
        for k in range(2):  # a module phase twice per microbatch: not a block
            rows.append((rank, step, mb, "mlp", "compute", "", t + 100 * k, int(rng.integers(1000, 2000)), -1))
        rows.append((rank, step, mb, "tp-allreduce", "comm", "tp", t + 500, int(rng.integers(500, 900)), -1))
        t += 40_000
    dur = -1 if (rank == 3 and step == STEPS - 1) else int(rng.integers(5000, 7000))  # one never finished
    rows.append((rank, step, -1, "dp-allreduce", "comm", "dp", t, dur, -1))
    rows.append((rank, step, -1, "optimizer", "compute", "", t + 10_000, int(rng.integers(3000, 4000)), -1))
    if rank % 2 and step == 2:
        rows.append((rank, step, -1, "checkpoint-save", "host", "", t + 20_000, 50_000, -1))
    return rows


def _table(rows: list[tuple]) -> dict:
    cols = list(zip(*rows))
    return {"rank": np.array(cols[0]), "step": np.array(cols[1]), "microbatch": np.array(cols[2]),
            "name": list(cols[3]), "category": list(cols[4]), "group_kind": list(cols[5]),
            "start_ns": np.array(cols[6]), "dur_ns": np.array(cols[7]), "wait_ns": np.array(cols[8])}


@pytest.fixture()
def attempt(tmp_path):
    """Two writers (ranks 0–3, 4–7); writer a's step 3 split over two files; start-up work of
    step 0 before the step began."""
    return _attempt(tmp_path)


def _attempt(tmp_path, startup: tuple[int, ...] = tuple(range(RANKS))) -> Attempt:
    """The fixture's store, with start-up work before step 0 on the ranks ``startup``."""
    rng = np.random.default_rng(7)
    store = Store.create(tmp_path / "s")
    a = store.create_attempt(RunIdentity("run-r"), Topology.uniform(parse_layout(f"tp=2,pp=1,dp={RANKS // 2}"),
                                                                     gpus_per_host=4), source="test")
    for writer, ranks in (("a", range(0, 4)), ("b", range(4, 8))):
        w = a.writer(writer)
        steps = {"rank": [], "step": [], "start_ns": [], "end_ns": []}
        for r in ranks:
            for s in range(STEPS):
                steps["rank"].append(r)
                steps["step"].append(s)
                steps["start_ns"].append(s * STEP_NS)
                steps["end_ns"].append((s + 1) * STEP_NS - 1)
        w.write("steps", {k: np.array(v) for k, v in steps.items()}, window=0)
        windows = [[0, 1, 2], [3, 4, 5]]
        for wi, win in enumerate(windows):
            rows = [row for r in ranks for s in win for row in _step_rows(rng, r, s)]
            if wi == 0:  # before step 0 began: the start-up's, not step 0's
                rows += [(r, 0, -1, "dataloader", "host", "", -500_000, 40_000, -1) for r in ranks if r in startup]
            if writer == "a" and wi == 1:  # step 3's optimizer and each microbatch's second mlp came in the next file
                late = [row for row in rows if row[1] == 3 and (row[3] == "optimizer" or
                                                                (row[3] == "mlp" and row[6] % 1000 == 100))]
                rows = [row for row in rows if row not in late]
                w.write("phases", _table(late), window=9)
            w.write("phases", _table(rows), window=wi)
    return a


def _canon(r) -> dict:
    """The rollup as sorted rows, ids replaced by names."""
    key = np.lexsort((np.array([r.names[i] for i in r.name]), r.step, r.rank))
    whole = [(int(r.rank[i]), int(r.step[i]), r.names[r.name[i]], int(r.count[i]), float(r.work_ns[i]),
              float(np.nan_to_num(r.min_ns[i], nan=-7)), float(r.pos_ns[i]), float(np.nan_to_num(r.pos_nomb_ns[i], nan=-7)))
             for i in key]
    b = r.blocks
    bkey = np.lexsort((np.array([r.names[i] for i in b.name]), b.microbatch, b.step, b.rank))
    blocks = [(int(b.rank[i]), int(b.step[i]), int(b.microbatch[i]), r.names[b.name[i]], int(b.count[i]),
               float(b.work_ns[i])) for i in bkey]
    kinds = {n: (r.category[i], r.group_kind[i]) for i, n in enumerate(r.names)}
    return {"whole": whole, "blocks": blocks, "kinds": kinds, "block_max": r.block_max}


def test_twins_are_written_and_read_like_the_phases_themselves(attempt):
    assert len(attempt.files("phase_totals")) == len(attempt.files("phases")) == 5
    with_twins = _canon(load_rollup(attempt))
    for f in attempt.files("phase_totals"):
        f.unlink()
    without = _canon(load_rollup(Store.open(attempt.path.parents[2]).attempt()))
    assert with_twins == without
    assert backfill(Store.open(attempt.path.parents[2]).attempt()) == 5
    again = Store.open(attempt.path.parents[2]).attempt()
    assert len(again.files("phase_totals")) == 5 and _canon(load_rollup(again)) == with_twins


def test_a_damaged_twin_is_read_from_its_phases(attempt):
    reference = _canon(load_rollup(attempt))
    twin = attempt.files("phase_totals")[0]
    twin.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    assert _canon(load_rollup(Store.open(attempt.path.parents[2]).attempt())) == reference


def test_window_totals_and_host_totals_match_the_phase_rows(attempt):
    rollup = load_rollup(attempt)
    for lo, hi in ((0, 2), (3, 5), (0, 5)):
        got, want = rollup.totals(lo, hi), load_phase_totals(attempt, lo, hi)

        def rows(t):
            return sorted((int(r), int(s), int(m), t.names[n], t.cats[c], t.groups[g], float(v),
                           float(np.nan_to_num(x, nan=-7)), int(k))
                          for r, s, m, n, c, g, v, x, k in zip(t.rank, t.step, t.microbatch, t.name, t.cat, t.group,
                                                                t.total_ns, t.min_ns, t.count))

        assert rows(got) == rows(want)
        assert any(m >= 0 for _, _, m, *_ in rows(got))  # forward-compute per microbatch
    seen = np.arange(RANKS)
    want = load_host_totals(attempt, RANKS)
    got = rollup.host_totals(RANKS, seen)
    assert sorted(got) == sorted(want) == ["checkpoint-save", "dataloader"]
    for name in want:
        np.testing.assert_allclose(got[name], want[name])
    # the start-up's dataloader (before step 0 began) is nobody's step 0
    step0 = (rollup.step == 0) & (rollup.name == rollup.names.index("dataloader"))
    assert (rollup.pos_ns[step0] < 10_000).all()
    # every odd rank saved in step 2: not 90% of the ranks
    assert rollup.steps_all_ran(RANKS, ("checkpoint", "save")) == set()
    assert rollup.steps_all_ran(RANKS // 2, ("checkpoint", "save")) == {2}
    # the one unfinished collective is counted, not timed
    names, groups, rates = rollup.calls_per_rank_step(RANKS * STEPS)
    assert dict(zip(names, rates)) == {"tp-allreduce": MBS, "dp-allreduce": 1}


def test_step_0_is_aggregated_again_only_for_the_ranks_with_start_up_work(tmp_path):
    """The twins say when their rows ended: a rank whose step 0 holds nothing from before the
    step began keeps its twin's rows (10,240 ranks: step 0 aggregated again from 4.5 M rows on
    every diagnosis); the ranks that do are aggregated from their rows, and the totals are the
    phases' own either way, with twins written before they said so too."""
    a = _attempt(tmp_path, startup=(2, 5))
    assert _startup_cut(a, pa.concat_tables([pq.read_table(f) for f in a.files("phase_totals")])).tolist() == [2, 5]
    rollup = load_rollup(a)
    with_twins = _canon(rollup)
    step0 = (rollup.step == 0) & (rollup.name == rollup.names.index("dataloader"))
    assert (rollup.pos_ns[step0] < 10_000).all()  # ranks 2 and 5's start-up is not step 0's
    for f in a.files("phase_totals"):  # twins as written before the column existed
        pq.write_table(pq.read_table(f).drop_columns(["end_min_ns"]), f)
    b = Store.open(a.path.parents[2]).attempt()
    assert _startup_cut(b, pa.concat_tables([pq.read_table(f, schema=TABLES["phase_totals"].schema)
                                             for f in b.files("phase_totals")])) is None
    assert _canon(load_rollup(b)) == with_twins
    for f in b.files("phase_totals"):
        f.unlink()
    assert _canon(load_rollup(Store.open(a.path.parents[2]).attempt())) == with_twins
