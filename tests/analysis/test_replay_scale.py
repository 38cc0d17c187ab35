"""The L4 replay above ``FULL_REPLAY_RANKS``: it runs on the culprits' model replicas and a few
healthy ones, and what it measures is what the replay of every rank measures."""

from __future__ import annotations

import numpy as np

import argus.analysis.l4_replay as l4
from argus.analysis.frames import WindowFrames, load_steps
from argus.topology import Layout


def test_replay_ranks_are_the_culprits_replicas_and_a_few_healthy_ones(monkeypatch):
    layout = Layout(tp=8, ep=8, dp=20, pp=8)  # the 10,240-rank benchmark's layout
    assert l4.replay_ranks(Layout(tp=8, dp=256), [3]) is None  # 2,048 ranks: every rank
    culprits = [5928, 5931]
    ranks = l4.replay_ranks(layout, culprits)
    assert ranks is not None
    dp = layout.coords(ranks)["dp"]
    replicas = np.unique(dp)
    assert layout.coords(culprits)["dp"][0] in replicas
    assert ranks.size == replicas.size * layout.world_size // layout.dp  # whole replicas only
    assert replicas.size == 1 + l4.MIN_HEALTHY_REPLICAS  # ep=8 already gives 8 peers per replica
    for c in culprits:  # pipeline neighbours, TP group and peers are all replayed
        for kind in ("pp", "tp", "ep"):
            assert set(layout.group_of(kind, c).tolist()) <= set(ranks.tolist())
        assert np.isin(layout.peer_set(c), ranks).sum() - 1 >= l4.REPLAY_PEERS
    # a layout without EP needs more replicas for the same number of peers
    thin = l4.replay_ranks(Layout(tp=8, dp=512, pp=4), [0])
    assert np.unique(Layout(tp=8, dp=512, pp=4).coords(thin)["dp"]).size == 1 + l4.REPLAY_PEERS


def test_replicas_replay_measures_what_the_whole_world_replay_measures(diagnosed, monkeypatch):
    attempt, truth, _ = diagnosed("compute_straggler", layout="tp=2,pp=2,dp=16")
    culprits = sorted({r for f in truth["faults"] for r in f["culprit_ranks"]})
    sf = load_steps(attempt)
    st = {int(s): float(t) for s, t in zip(sf.steps, sf.job_step_time)}
    steps = [s for s in range(8, 14) if np.isfinite(st[s])]
    hosts = attempt.topology().hosts
    full = l4.what_if(attempt, steps, culprits, hosts, st, 2)
    monkeypatch.setattr(l4, "FULL_REPLAY_RANKS", 16)  # 64 ranks is now "large"
    frames = WindowFrames(attempt, [(5, 9), (10, 14)])
    part = l4.what_if(attempt, steps, culprits, hosts, st, 2, frames=frames)
    assert full is not None and part is not None
    read = [h.ranks for h in frames._held.values()]
    assert read and all(r is not None and r.size == 4 * (1 + l4.REPLAY_PEERS) for r in read)  # 2×2 per replica
    assert full.slowdown_pct > 5 and part.slowdown_pct > 5
    assert abs(part.slowdown_pct - full.slowdown_pct) <= 0.2 * full.slowdown_pct
    for w in (full, part):
        assert all(abs(r.fidelity_pct) <= 10 for r in w.replays)
        assert max(w.critical, key=lambda k: w.critical[k]) in culprits  # the culprits hold the critical path
