import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from argus.compress import (LogSketch, empirical_cdf, log_grid, mixture_cdf, summarize_durations, w1, w1_matrix,
                            w1_to_reference)

rng = np.random.default_rng(7)
GRID = log_grid(1e3, 1e8, 1024)


def _cdf(values):
    cl = summarize_durations(values)
    return mixture_cdf(GRID, np.zeros(len(cl)), [c.count for c in cl], [c.p50 for c in cl], [c.p99 for c in cl])[0]


def test_identical_inputs_have_zero_distance_and_distance_grows_with_a_shift():
    d = rng.lognormal(np.log(1e5), 0.05, 4000)
    base = _cdf(d)
    assert w1(base, _cdf(d.copy()), GRID) == 0.0
    dists = [w1(base, _cdf(d * s), GRID) for s in (1.01, 1.05, 1.2, 2.0, 5.0)]
    assert all(b > a for a, b in zip(dists, dists[1:]))
    assert abs(dists[0] / (0.01 * np.mean(d)) - 1) < 0.05  # a 1% shift moves W₁ by 1% of the mean


def test_a_rare_long_tail_moves_the_distance():
    d = rng.lognormal(np.log(1e5), 0.03, 5000)
    tail = np.concatenate([d[:4900], rng.lognormal(np.log(2e6), 0.03, 100)])
    assert w1(_cdf(d), _cdf(tail), GRID) > 0.1 * np.median(d)


def test_reconstruction_is_close_to_the_raw_distribution():
    d = np.concatenate([rng.lognormal(np.log(1e5), 0.04, 3000), rng.lognormal(np.log(4e5), 0.04, 1000)])
    emp = empirical_cdf(d, GRID)
    assert w1(_cdf(d), emp, GRID) < 0.02 * np.median(d)
    assert w1(LogSketch.from_values(d).cdf(GRID), emp, GRID) < 0.01 * np.median(d)


def test_mixture_cdfs_are_monotone_probabilities_and_vectorise_over_distributions():
    cdf = mixture_cdf(GRID, [0, 0, 1], [10, 30, 5], [1e4, 1e5, 1e6], [1.2e4, 1.5e5, 1e6])
    assert cdf.shape == (2, len(GRID))
    assert (np.diff(cdf, axis=1) >= -1e-12).all() and cdf.min() >= 0 and cdf.max() <= 1 + 1e-12
    assert cdf[1, 0] < 1e-6 and cdf[1, -1] > 1 - 1e-6  # the all-equal cluster is a step at 1e6


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(1e4, 1e7), st.floats(1.0, 3.0)), min_size=3, max_size=3))
def test_w1_is_a_metric(params):
    cdfs = mixture_cdf(GRID, [0, 1, 2], [1, 1, 1], [p for p, _ in params], [p * r for p, r in params])
    m = w1_matrix(cdfs, GRID)
    assert np.allclose(np.diag(m), 0) and np.allclose(m, m.T) and (m >= 0).all()
    assert m[0, 2] <= m[0, 1] + m[1, 2] + 1e-6 * max(m.max(), 1)
    assert np.allclose(w1_to_reference(cdfs, cdfs[1], GRID), m[:, 1])


def test_truncated_mixture_cdf_is_each_components_truncated_log_normal():
    """The sparse evaluation (a normal CDF only inside each cluster's [min, max]) against each
    component's truncated log-normal CDF computed whole, with a degenerate cluster as a step."""
    from scipy.stats import norm

    rng = np.random.default_rng(7)
    n, n_dist = 400, 9
    dist = rng.integers(0, n_dist - 1, n)  # the last distribution has no cluster: NaN
    p50 = np.exp(rng.normal(9, 1.5, n))
    p99 = p50 * np.exp(np.abs(rng.normal(0, 0.5, n)))
    lo = p50 * np.exp(-np.abs(rng.normal(0, 0.3, n)))
    hi = p99 * np.exp(np.abs(rng.normal(0, 0.2, n)))
    lo[:20] = hi[:20] = p50[:20] = p99[:20]
    counts = rng.integers(1, 50, n)
    grid = log_grid(lo.min() * 0.9, hi.max() * 1.1, 64)
    got = mixture_cdf(grid, dist, counts, p50, p99, n_dist=n_dist, lo=lo, hi=hi)

    mu = np.log(p50)
    sigma = np.maximum((np.log(p99) - mu) / 2.326347874, 1e-4)
    a, b = norm.cdf((np.log(lo) - mu) / sigma), norm.cdf((np.log(hi) - mu) / sigma)
    comp = (norm.cdf((np.log(grid)[None, :] - mu[:, None]) / sigma[:, None]) - a[:, None]) / np.maximum(b - a, 1e-300)[:, None]
    comp = np.clip(comp, 0, 1)
    step = (b - a) <= 1e-12
    comp[step] = grid[None, :] >= hi[step, None]
    want = np.full((n_dist, len(grid)), np.nan)
    for d in range(n_dist - 1):
        m = dist == d
        want[d] = (counts[m, None] * comp[m]).sum(axis=0) / counts[m].sum()
    assert np.isnan(got[-1]).all()
    np.testing.assert_allclose(got[:-1], want[:-1], atol=1e-12)
