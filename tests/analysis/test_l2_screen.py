"""L2's screen at scale: which ranks get the exact analysis when only some can."""

import numpy as np

from argus.analysis.frames import PhaseTotals
from argus.analysis.l2_stragglers import screen_candidates
from argus.topology import Layout


def _totals(layout: Layout, comm_s: np.ndarray, work_s: np.ndarray) -> PhaseTotals:
    """Steps 0–4, every rank one collective and one forward a step (seconds per (step, rank))."""
    steps, world = comm_s.shape
    step, rank = (a.ravel() for a in np.meshgrid(np.arange(steps), np.arange(world), indexing="ij"))
    n = step.size
    return PhaseTotals(0, steps - 1, np.r_[rank, rank], np.r_[step, step], np.full(2 * n, -1),
                       np.r_[np.zeros(n, np.int32), np.ones(n, np.int32)],
                       np.r_[np.zeros(n, np.int32), np.ones(n, np.int32)], np.zeros(2 * n, np.int32),
                       np.r_[comm_s.ravel(), work_s.ravel()] * 1e9, np.r_[comm_s.ravel(), work_s.ravel()] * 1e9,
                       np.ones(2 * n, np.int64), ["dp-allreduce", "forward-compute"], ["comm", "compute"], ["dp"])


def test_a_rank_far_slower_in_its_work_is_screened_in_though_many_ranks_wait_less():
    """Chance puts many ranks of a large job below their peers in communication time; the place
    for a rank whose forward took a pause long is not taken by all of them first (4,096 ranks:
    a 600 ms collection pause was screened out in two of four windows, then misclassified)."""
    layout = Layout(dp=64, pp=2)
    rng = np.random.default_rng(0)
    steps, world = 5, layout.world_size
    comm = np.full((steps, world), 0.2) + rng.normal(0, 0.001, (steps, world))
    low = rng.choice(world, 40, replace=False)
    low = low[low != 77]
    comm[2, low] = 0.1  # waited less than their peers in one step: 39 ranks past z = 3
    work = np.full((steps, world), 0.5) + rng.normal(0, 0.001, (steps, world))
    work[3, 77] = 1.1  # rank 77: a 600 ms pause inside its forward
    step_s = {s: 1.0 for s in range(steps)}
    chosen = screen_candidates(_totals(layout, comm, work), layout, step_s, max_candidates=8,
                               peers_per_candidate=4)
    assert 77 in chosen
    assert np.isin(low, chosen).sum() >= 4  # the waiting list keeps its share


def test_the_screen_stops_at_its_rank_budget_with_the_strongest_of_both_lists():
    layout = Layout(dp=64, pp=2)
    rng = np.random.default_rng(1)
    steps, world = 5, layout.world_size
    comm = np.full((steps, world), 0.2) + rng.normal(0, 0.001, (steps, world))
    comm[2, rng.choice(np.r_[0:77, 78:world], 40, replace=False)] = 0.1
    work = np.full((steps, world), 0.5) + rng.normal(0, 0.001, (steps, world))
    work[3, 77] = 1.1
    chosen = screen_candidates(_totals(layout, comm, work), layout, {s: 1.0 for s in range(steps)},
                               peers_per_candidate=4, max_ranks=20)
    assert 77 in chosen and 20 <= len(chosen) < 20 + 4 + 1  # one candidate's peers past the budget at most
