"""The attribution above ``FULL_REPLAY_RANKS``: it replays the suspects' model replicas and a few
healthy ones, and what it measures is what the replay of every rank measures."""

from __future__ import annotations

import numpy as np

import argus.analysis.attribution.subset as subset
from argus.analysis import DiagnoseConfig, diagnose
from argus.topology import Layout


def test_replay_ranks_are_the_suspects_replicas_and_a_few_healthy_ones():
    layout = Layout(tp=8, ep=8, dp=20, pp=8)  # the 10,240-rank benchmark's layout
    assert subset.replay_ranks(Layout(tp=8, dp=256), [3]) is None  # 2,048 ranks: every rank
    culprits = [5928, 5931]
    ranks = subset.replay_ranks(layout, culprits)
    assert ranks is not None
    dp = layout.coords(ranks)["dp"]
    replicas = np.unique(dp)
    assert layout.coords(culprits)["dp"][0] in replicas
    assert ranks.size == replicas.size * layout.world_size // layout.dp  # whole replicas only
    assert replicas.size == 1 + subset.MIN_HEALTHY_REPLICAS  # ep=8 already gives 8 peers per replica
    for c in culprits:  # pipeline neighbours, TP group and peers are all replayed
        for kind in ("pp", "tp", "ep"):
            assert set(layout.group_of(kind, c).tolist()) <= set(ranks.tolist())
        assert np.isin(layout.peer_set(c), ranks).sum() - 1 >= subset.REPLAY_PEERS
    # a layout without EP needs more replicas for the same number of peers
    thin = subset.replay_ranks(Layout(tp=8, dp=512, pp=4), [0])
    assert np.unique(Layout(tp=8, dp=512, pp=4).coords(thin)["dp"]).size == 1 + subset.REPLAY_PEERS


def test_replicas_replay_measures_what_the_whole_world_replay_measures(diagnosed):
    """The same 64-rank straggler diagnosed with every rank replayed and with 16 ranks counting as
    "large" (the culprits' replica and healthy ones): the same culprits, the same cost within 20%."""
    attempt, truth, full = diagnosed("compute_straggler", layout="tp=2,pp=2,dp=16")
    culprits = sorted({r for f in truth["faults"] for r in f["culprit_ranks"]})
    part = diagnose(attempt, DiagnoseConfig(store_incidents=False, exact_ranks=16))
    replayed = {o.attribution.ranks.size for o in part.attribution if o.attribution is not None}
    assert replayed and min(replayed) < attempt.layout.world_size  # replicas, not the world
    for d in (full, part):
        (inc,) = [i for i in d.incidents if i.severity != "info"]
        assert inc.culprit_ranks == culprits
        crit = next(e for e in inc.evidence if e["kind"] == "critical_path")
        assert crit["by_rank"][0]["rank"] in culprits  # the culprits hold the critical path
    a, b = ([i for i in d.incidents if i.severity != "info"][0].slowdown_pct for d in (full, part))
    assert a > 5 and abs(a - b) <= 0.2 * a
    # the replicas' replay joins the windows that replay the same ranks for the same candidates
    # inside the same L1 regression into one attribution of a few steps; every rank's replay
    # attributes each window, and the window before the fault stands alone in both
    fault = truth["faults"][0]["window"]
    assert [(o.lo, o.hi) for o in full.attribution] == [(0, 4), (5, 9), (10, 14), (15, 19)]
    assert fault == {"start_step": 5, "end_step": 19}
    assert [(o.lo, o.hi) for o in part.attribution] == [(0, 4), (5, 19)]
    joined = part.attribution[1].attribution
    assert joined is not None and len(joined.steps) == 3 and set(joined.steps) <= set(range(5, 20))


def test_a_large_window_replays_a_few_steps_the_candidates_own_first():
    from argus.analysis.attribution import sample_steps

    steps = [5, 6, 7, 8, 9]
    assert sample_steps(steps, set(), 3) == [5, 7, 9]  # spread over the window
    assert sample_steps(steps, {8}, 3) == [5, 8, 9]  # the candidate's step kept
    assert sample_steps(steps, {6, 7, 8, 9}, 3) == [6, 8, 9]  # only its own where it has enough
    assert sample_steps([5, 6], {6}, 3) == [5, 6]  # fewer than asked: all
