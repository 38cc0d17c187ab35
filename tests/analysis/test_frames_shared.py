"""The shared window frames: every level's phases come from one read per (window, rank), and a
view of them is exactly what reading the store for those steps and ranks would give."""

from __future__ import annotations

import numpy as np
import pytest

import argus.analysis.frames as frames_mod
from argus.analysis import DiagnoseConfig, diagnose
from argus.analysis.frames import PhaseFrame, WindowFrames, load_phases


def _rows(f: PhaseFrame) -> list[tuple]:
    """Every row with its strings resolved (ids differ between vocabularies), in frame order."""
    wait = f.wait if f.wait is not None else np.full(f.n, -1)
    return [(int(f.rank[i]), int(f.step[i]), int(f.mb[i]), f.names[f.name[i]], f.cats[f.cat[i]],
             f.groups[f.group[i]], int(f.start[i]), int(f.dur[i]),
             None if np.isnan(f.busy[i]) else float(f.busy[i]), int(wait[i])) for i in range(f.n)]


def _same_rows(a: PhaseFrame, b: PhaseFrame) -> None:
    # (rank, start, -dur) order is the contract; rows tied on all three may come in either order
    assert sorted(_rows(a)) == sorted(_rows(b))
    key = [(r[0], r[6], -r[7]) for r in _rows(a)]
    assert key == sorted(key)


def test_views_equal_reading_the_store(diagnosed):
    attempt, _, _ = diagnosed("pipeline_bubble")
    wf = WindowFrames(attempt, [(5, 9), (10, 14)])
    wf.phases(5, 9, ranks=[3, 1, 7])  # a subset first, as L2 reads above exact_ranks
    _same_rows(wf.phases(6, 6, ranks=[1, 2, 3, 40]), load_phases(attempt, 6, 6, ranks=np.array([1, 2, 3, 40])))
    _same_rows(wf.phases(7, 8), load_phases(attempt, 7, 8))  # every rank: the rest read once
    _same_rows(wf.of_steps([6, 12], ranks=[5, 9]),  # steps in two windows
               load_phases(attempt, 6, 12, ranks=np.array([5, 9])).take(
                   np.flatnonzero(np.isin(load_phases(attempt, 6, 12, ranks=np.array([5, 9])).step, [6, 12]))))
    assert wf.reads == 4  # (5–9: [1,3,7], then [2,40], then the rest), (10–14: [5,9])


def test_one_kept_connection_reads_like_fresh_ones(diagnosed):
    """The frames read through one DuckDB connection (views and the rank table replaced each
    read); a read after ``close`` opens another."""
    attempt, _, _ = diagnosed("pipeline_bubble")
    wf = WindowFrames(attempt, [(5, 9), (10, 14)])
    _same_rows(wf.sampled(10, 14, [10, 13], [2, 4]),
               load_phases(attempt, 10, 14, ranks=np.array([2, 4]), steps=[10, 13]))
    _same_rows(wf.phases(5, 9), load_phases(attempt, 5, 9))  # no rank table: every rank, not [2, 4]
    con = wf._con
    assert con is not None
    wf.close()
    _same_rows(wf.sampled(10, 14, [11], [0, 5]), load_phases(attempt, 10, 14, ranks=np.array([0, 5]), steps=[11]))
    assert wf._con is not None and wf._con is not con
    wf.close()


def test_a_window_is_read_once_for_every_level(diagnosed, monkeypatch):
    """One diagnosis with L4 replay and pipeline analysis: the store's phases are read once per
    window (the hung or out-of-window steps a level may add are their own entries)."""
    attempt, truth, _ = diagnosed("pipeline_bubble")
    calls: list[tuple[int, int]] = []
    real = frames_mod.load_phases

    def counting(att, lo, hi, ranks=None, connection=None):
        calls.append((lo, hi))
        return real(att, lo, hi, ranks=ranks, connection=connection)

    monkeypatch.setattr(frames_mod, "load_phases", counting)
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    kinds = {e.get("kind") for i in d.incidents for e in i.evidence}
    assert {"what_if", "pipeline"} <= kinds  # L4 ran on the shared frames
    assert any(set(i.culprit_ranks) & set(truth["faults"][0]["culprit_ranks"]) for i in d.incidents)
    windows = [c for c in calls if c[1] > c[0]]
    assert len(windows) == len(set(windows)), f"a window was read twice: {calls}"


def test_held_rows_are_bounded(diagnosed):
    attempt, _, _ = diagnosed("pipeline_bubble")
    one = load_phases(attempt, 5, 9).n
    wf = WindowFrames(attempt, [(5, 9), (10, 14), (15, 19)], max_rows=int(one * 1.5))
    for lo in (5, 10, 15):
        wf.phases(lo, lo + 4)
    assert sum(h.rows for h in wf._held.values()) <= int(one * 1.5)
    _same_rows(wf.phases(5, 9), load_phases(attempt, 5, 9))  # dropped, read again: still right
    assert wf.reads == 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_concat_restores_rank_start_order(seed):
    """Parts of disjoint ranks concatenated in any order come out as one (rank, start) sort."""
    rng = np.random.default_rng(seed)
    n = 200
    rank = rng.integers(0, 12, n)
    start = rng.integers(0, 1000, n)
    order = np.lexsort((start, rank))

    def frame(rows: np.ndarray, names: list[str]) -> PhaseFrame:
        k = rows.size
        return PhaseFrame(0, 0, rank[rows], np.zeros(k, np.int64), np.zeros(k, np.int64),
                          (rows % len(names)).astype(np.int32), np.zeros(k, np.int32), np.zeros(k, np.int32),
                          start[rows], np.ones(k, np.int64), np.zeros(k), names, ["compute"], ["dp"],
                          np.full(k, -1, np.int64))

    rows = order
    odd = rows[rank[rows] % 3 == 1]
    rest = rows[rank[rows] % 3 != 1]
    got = frames_mod._concat([frame(odd, ["a", "b"]), frame(rest, ["b", "c", "a"])])
    assert got.n == n
    assert list(zip(got.rank.tolist(), got.start.tolist())) == sorted(zip(rank.tolist(), start.tolist()))
    # names survive the vocabulary merge: each row keeps the name its part gave it
    want = {(int(rank[i]), int(start[i]), ["a", "b"][i % 2] if rank[i] % 3 == 1 else ["b", "c", "a"][i % 3])
            for i in range(n)}
    assert {(int(r), int(s), got.names[k]) for r, s, k in zip(got.rank, got.start, got.name)} == want


def test_a_few_sampled_steps_are_read_alone_unless_held(diagnosed):
    """A large job's attribution asks for 3 of a window's steps of its replayed replicas: read for
    those steps alone (not kept), or cut from what the window holds when it holds those ranks."""
    attempt, _, _ = diagnosed("pipeline_bubble")
    wf = WindowFrames(attempt, [(5, 9), (10, 14)])
    full = load_phases(attempt, 5, 9, ranks=np.array([2, 4, 6]))
    want = full.take(np.flatnonzero(np.isin(full.step, [5, 7, 9])))
    got = wf.sampled(5, 9, [5, 7, 9], [6, 2, 4])
    _same_rows(got, want)
    assert set(np.unique(got.step).tolist()) == {5, 7, 9}
    assert wf.reads == 1 and not wf._held  # read, not kept
    wf.phases(5, 9)  # the window held for every rank: served from it
    _same_rows(wf.sampled(5, 9, [5, 7, 9], [2, 4, 6]), want)
    assert wf.reads == 2
