"""A stall that recurs keeps its occurrences; a small hiccup far from them is not one of them
(a real job's 11 ms hiccup in step 1 joined a stall from step 9 on, and its incident began at 1)."""

import numpy as np

from argus.analysis.l1_windows import L1Result
from argus.analysis.rootcause import RootCauseConfig, _Ctx
from argus.analysis.rootcause.stalls import STRAY_GAPS, STRAY_SIZE, _without_strays
from argus.analysis.signals import HwSignals
from argus.topology import Topology, parse_layout

STEP_S = 0.07


def _ctx(steps: int = 40) -> _Ctx:
    layout = parse_layout("dp=4")
    topo = Topology(layout, np.array(["h0"] * 4), np.zeros(4, int), np.array([f"gpu-{r}" for r in range(4)]))
    times = np.full(steps, STEP_S)
    return _Ctx(None, topo, L1Result(np.arange(steps), times, STEP_S, []), HwSignals(),
                {s: float(t) for s, t in enumerate(times)}, RootCauseConfig())


def test_a_small_hiccup_long_before_a_stall_every_step_is_not_the_stall():
    steps = [1, *range(9, 20)]
    excess = {1: 0.011, **{s: 0.06 for s in range(9, 20)}}
    assert _without_strays(_ctx(), steps, excess) == list(range(9, 20))


def test_a_large_one_far_away_stays():
    """Half a step or more is reported on its own merit, near the others or not."""
    steps = [1, *range(9, 20)]
    excess = {1: 0.5 * STEP_S, **{s: 0.06 for s in range(9, 20)}}
    assert _without_strays(_ctx(), steps, excess) == steps


def test_the_same_pause_again_far_away_stays():
    """A collection pause nine steps after the last of five, of their size (the simulated
    pauses of 600 ms in ~1 s steps: each below half its own, lengthened step)."""
    steps = [3, 4, 6, 7, 8, 17]
    excess = {s: 0.6 for s in steps}
    ctx = _ctx()
    ctx.step_time.update({s: 1.6 for s in steps})
    assert _without_strays(ctx, steps, excess) == steps
    excess[17] = 0.6 * STRAY_SIZE * 0.9  # much smaller than the pauses: a hiccup
    assert _without_strays(ctx, steps, excess) == steps[:-1]


def test_a_stall_every_seventh_step_keeps_every_occurrence():
    steps = [3, 10, 17, 24, 31]
    excess = {s: 0.01 for s in steps}
    assert _without_strays(_ctx(), steps, excess) == steps


def test_strays_are_judged_by_the_usual_interval():
    """Every third step, then one occurrence ``STRAY_GAPS`` intervals later (kept) and one beyond (dropped)."""
    regular = [3, 6, 9, 12]
    at_bound = regular[-1] + STRAY_GAPS * 3
    far = regular + [regular[-1] + STRAY_GAPS * 3 + 1]
    excess = {s: 0.01 for s in regular} | {at_bound: 0.004, far[-1]: 0.004}  # smaller than the stall's
    assert _without_strays(_ctx(), [*regular, at_bound], excess) == [*regular, at_bound]
    assert _without_strays(_ctx(), far, excess) == regular


def test_two_steps_are_left_alone():
    assert _without_strays(_ctx(), [1, 30], {1: 0.01, 30: 0.01}) == [1, 30]
