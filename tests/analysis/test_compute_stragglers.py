"""Compute stragglers from L2's busy findings: a pair's comparison names neither rank when each
was the slower one in turn."""

import numpy as np

from argus.analysis.l1_windows import L1Result
from argus.analysis.l2_stragglers import Finding, L2Result
from argus.analysis.rootcause import RootCauseConfig, WindowAnalysis, _Ctx
from argus.analysis.rootcause.compute import _compute
from argus.analysis.signals import HwSignals
from argus.topology import Topology, parse_layout

STEPS, STEP_S = 15, 0.2


def _ctx() -> _Ctx:
    """pp=2 × dp=2 (rank // 2 is the stage): each rank's only peer is the other rank of its stage."""
    layout = parse_layout("pp=2,dp=2")
    topo = Topology(layout, np.array(["vm"] * 4), np.zeros(4, int), np.array([f"gpu-{r}" for r in range(4)]))
    l1 = L1Result(np.arange(STEPS), np.full(STEPS, STEP_S), STEP_S, [])
    return _Ctx(None, topo, l1, HwSignals(), {s: STEP_S for s in range(STEPS)}, RootCauseConfig())


def _slower(rank: int, steps: list[int]) -> Finding:
    return Finding("busy", rank, "backward-compute", "compute", -1, steps, 1.5, 20.0, 0.01, "dp", True, [0.01] * len(steps))


def _windows(flags: dict[tuple[int, int], list[Finding]]) -> list[WindowAnalysis]:
    return [WindowAnalysis(lo, hi, L2Result(lo, hi, flags.get((lo, hi), [])), None)
            for lo, hi in ((0, 4), (5, 9), (10, 14))]


def test_both_ranks_of_a_pair_slower_in_turns_name_no_straggler():
    """The CI uneven-inputs job: rank 1 slower than rank 0 in steps 5, 7, 8, rank 0 than rank 1
    in 10, 12, 13 — each the other's reference: no compute straggler."""
    turns = _windows({(5, 9): [_slower(1, [5, 7, 8])], (10, 14): [_slower(0, [10, 12, 13])]})
    assert _compute(_ctx(), turns) == []
    alone = _windows({(5, 9): [_slower(1, [5, 6, 7, 8, 9])], (10, 14): [_slower(1, [10, 11, 12, 13, 14])]})
    (inc,) = _compute(_ctx(), alone)
    assert inc.culprit_ranks == [1]
