import numpy as np
import pytest

from argus.compress import CompressConfig, RefineConfig, summarize_durations

#: The KDE's mode finding alone: refinement (splitting for fidelity, tests/compress/test_refine.py) off.
KDE_ONLY = CompressConfig(refine=RefineConfig(max_w1_rel_mean=None))


def _modes(d):
    return summarize_durations(d, KDE_ONLY)

rng = np.random.default_rng(42)


def _check(cluster, values, tol50=0.02, tol99=0.05):
    v = np.sort(values)
    assert cluster.count == len(v)
    assert abs(cluster.p50 / np.quantile(v, 0.5) - 1) < tol50
    assert abs(cluster.p99 / np.quantile(v, 0.99) - 1) < tol99
    assert cluster.min == v[0] and cluster.max == v[-1]


def test_unimodal_is_one_cluster_with_right_quantiles():
    d = rng.lognormal(np.log(1e5), 0.05, 5000)
    (c,) = _modes(d)
    _check(c, d)


def test_bimodal_gives_two_clusters_split_between_the_modes():
    a, b = rng.lognormal(np.log(1e5), 0.03, 3000), rng.lognormal(np.log(3e5), 0.03, 2000)
    c1, c2 = _modes(np.concatenate([b, a]))
    _check(c1, a)
    _check(c2, b)


def test_close_modes_twenty_percent_apart_are_still_separated():
    a, b = rng.lognormal(np.log(1e5), 0.02, 3000), rng.lognormal(np.log(1.2e5), 0.02, 2000)
    clusters = _modes(np.concatenate([a, b]))
    assert [c.count for c in clusters] == [3000, 2000]


def test_trimodal():
    parts = [rng.lognormal(np.log(m), 0.05, 1000) for m in (1e4, 5e4, 4e5)]
    clusters = _modes(np.concatenate(parts))
    assert len(clusters) == 3
    for c, p in zip(clusters, parts):
        _check(c, p)


def test_long_tail_stays_one_cluster_and_its_p99_sees_the_tail():
    d = np.concatenate([rng.lognormal(np.log(1e5), 0.05, 5000), 1e5 * (1 + rng.pareto(2.5, 250))])
    (c,) = _modes(d)
    _check(c, d, tol99=0.08)
    assert c.p99 > 1.3 * c.p50


def test_a_rare_slow_mode_of_one_percent_is_kept_apart():
    body, rare = rng.lognormal(np.log(1e5), 0.03, 4950), rng.lognormal(np.log(1e6), 0.03, 50)
    c1, c2 = _modes(np.concatenate([body, rare]))
    _check(c1, body)
    _check(c2, rare)


def test_too_few_events_for_a_mode_is_not_a_mode():
    body, rare = rng.lognormal(np.log(1e5), 0.03, 4990), rng.lognormal(np.log(1e6), 0.03, 3)
    assert len(_modes(np.concatenate([body, rare]))) == 1


@pytest.mark.parametrize("trial", range(20))
def test_unimodal_noise_of_any_width_and_size_is_never_split(trial):
    r = np.random.default_rng(trial)
    d = r.lognormal(np.log(r.uniform(1e3, 1e7)), r.uniform(0.005, 0.3), int(r.integers(20, 20000)))
    assert len(_modes(d)) == 1


@pytest.mark.parametrize("values, expected", [
    ([5.0], [(1, 5.0, 5.0)]),
    ([7.0] * 100, [(100, 7.0, 7.0)]),
    ([0.0] * 10 + [5000.0] * 10, [(10, 0.0, 0.0), (10, 5000.0, 5000.0)]),
    ([0.0, 0.0, 0.0], [(3, 0.0, 0.0)]),
    ([np.nan, -1.0, 3.0, np.inf], [(1, 3.0, 3.0)]),
    ([], []),
    ([np.nan, -5.0], []),
])
def test_degenerate_inputs_neither_crash_nor_invent_data(values, expected):
    got = summarize_durations(np.array(values, dtype=float))
    assert [(c.count, c.min, c.max) for c in got] == expected
