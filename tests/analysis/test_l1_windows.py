import numpy as np

from argus.analysis.l1_windows import detect_windows, pelt

rng = np.random.default_rng(3)


def test_pelt_finds_the_level_shifts_of_a_piecewise_constant_series():
    x = np.concatenate([rng.normal(0, 0.02, 40), rng.normal(0.4, 0.02, 30), rng.normal(0.1, 0.02, 30)])
    assert pelt(x, 3 * 0.02**2 * np.log(len(x))) == [40, 70]
    assert pelt(rng.normal(0, 0.02, 100), 3 * 0.02**2 * np.log(100)) == []


def _series(n=40, base=1.0, noise=0.01):
    return base * np.exp(rng.normal(0, noise, n))


def test_a_sustained_slowdown_is_a_regression_starting_at_its_onset():
    t = _series()
    t[25:] *= 1.4
    res = detect_windows(np.arange(40), t)
    reg = [w for w in res.faults if w.kind == "regression"]
    assert len(reg) == 1 and reg[0].start_step == 25 and reg[0].end_step == 39
    assert 1.3 < reg[0].magnitude < 1.5
    assert abs(res.baseline_s - 1.0) < 0.02


def test_isolated_spikes_are_jitter_not_levels():
    t = _series()
    t[[12, 30]] *= 4
    res = detect_windows(np.arange(40), t)
    assert [(w.kind, w.start_step) for w in res.faults] == [("jitter", 12), ("jitter", 30)]


def test_warmup_and_checkpoints_are_recognised_not_reported():
    t = _series()
    t[0], t[1] = 3.0, 1.6
    t[[10, 20, 30]] = 6.0
    res = detect_windows(np.arange(40), t)  # no phase info: checkpoints found by their period
    assert res.warmup_steps == [0, 1] and res.checkpoint_steps == [10, 20, 30]
    assert res.faults == []
    res = detect_windows(np.arange(40), t, checkpoint_steps={10, 20, 30})
    assert res.faults == []


def test_steps_that_never_finished_are_a_regression_to_infinity():
    t = _series(20)
    t[15:] = np.inf
    res = detect_windows(np.arange(20), t)
    assert res.hung_steps == [15, 16, 17, 18, 19]
    assert any(w.magnitude == np.inf for w in res.faults)


def test_when_most_steps_are_slowed_the_baseline_is_still_the_fast_level():
    t = _series()
    t[np.arange(5, 40, 3)] *= 1.0  # untouched
    slow = np.ones(40, bool)
    slow[np.arange(0, 40, 3)] = False
    t[slow] *= 1.8  # two thirds of the steps pause
    res = detect_windows(np.arange(40), t)
    assert abs(res.baseline_s - 1.0) < 0.05
