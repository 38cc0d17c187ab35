import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtr, ndtri

from argus.compress import REFINED_W1_BOUND, Cluster, CompressConfig, RefineConfig, empirical_cdf, log_grid, mixture_cdf, summarize_durations, w1
from argus.compress.refine import SCORE_POINTS, cluster_w1_sums
from argus.errors import ConfigError

KDE_ONLY = CompressConfig(refine=RefineConfig(max_w1_rel_mean=None))
REFINED = CompressConfig(refine=RefineConfig(max_w1_rel_mean=REFINED_W1_BOUND))


def _w1_rel_mean(values, clusters) -> float:
    """W₁ of the rows as L3 reads them (truncated log-normal mixture) to the raw values, over their mean."""
    d = np.sort(np.asarray(values, float))
    grid = log_grid(d[0] / 2, d[-1] * 2, 4096)
    rec = mixture_cdf(grid, np.zeros(len(clusters), np.int64), [c.count for c in clusters], [c.p50 for c in clusters],
                      [c.p99 for c in clusters], n_dist=1, lo=[c.min for c in clusters], hi=[c.max for c in clusters])[0]
    return float(w1(rec, empirical_cdf(d, grid), grid)) / float(d.mean())


def _loop_w1_sum(x: np.ndarray) -> float:
    """The same sum, one event at a time: |x_(i) − Q̂((i+½)/n)| for the row's truncated log-normal."""
    n, mu = len(x), np.log(np.quantile(x, 0.5))
    sigma = max((np.log(np.quantile(x, 0.99)) - mu) / 2.326347874, 1e-4)
    a, b = ndtr((np.log(x[0]) - mu) / sigma), ndtr((np.log(x[-1]) - mu) / sigma)
    return sum(abs(x[i] - np.clip(np.exp(mu + sigma * ndtri(a + (b - a) * (i + 0.5) / n)), x[0], x[-1]))
               for i in range(n))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e3, 1e8), min_size=2, max_size=SCORE_POINTS), st.integers(0, 10))
def test_cluster_error_matches_a_loop_over_the_events(values, pad):
    x = np.sort(np.array(values))
    dur = np.concatenate([np.full(pad, 1.0), x])  # the cluster at an offset, as in a window
    got = cluster_w1_sums(dur, np.array([pad]), np.array([len(x)]))[0]
    want = _loop_w1_sum(x) if x[-1] > x[0] else 0.0
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_cluster_error_is_the_w1_of_what_l3_reads(seed):
    r = np.random.default_rng(seed)
    x = np.sort(np.concatenate([r.lognormal(np.log(5e4), 0.3, 300), r.exponential(2e5, 30) + 5e4]))
    est = cluster_w1_sums(x, np.array([0]), np.array([len(x)]))[0] / x.sum()  # scored on strata: n > SCORE_POINTS
    one_row = [Cluster(len(x), float(np.quantile(x, 0.5)), float(np.quantile(x, 0.99)), x[0], x[-1])]
    assert est == pytest.approx(_w1_rel_mean(x, one_row), rel=0.1)


def _waiting_collective(r: np.random.Generator) -> np.ndarray:
    """A pipeline receive: a short transfer plus waits — most short, a few for the 1F1B bubble."""
    transfer = r.lognormal(np.log(140e3), 0.05, 160)
    waits = r.exponential(30e3, 160) + np.where(np.arange(160) % 16 < 2, r.lognormal(np.log(16e6), 0.1, 160), 0.0)
    return transfer + waits


@pytest.mark.parametrize("seed", range(4))
def test_a_waiting_dominated_collective_is_kept_within_one_percent_of_its_mean(seed):
    d = _waiting_collective(np.random.default_rng(seed))
    before, after = summarize_durations(d, KDE_ONLY), summarize_durations(d, REFINED)
    assert _w1_rel_mean(d, before) > 0.01  # what the KDE rows alone lose
    assert _w1_rel_mean(d, after) <= 0.01 and len(after) <= RefineConfig().max_clusters


def test_tight_compute_noise_is_not_split():
    d = np.random.default_rng(0).lognormal(np.log(3e5), 0.02, 5000)
    assert len(summarize_durations(d, REFINED)) == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(20, 400))
def test_refinement_only_splits_the_kde_modes_and_loses_no_event(seed, modes, n):
    r = np.random.default_rng(seed)
    d = np.round(np.concatenate([r.lognormal(np.log(1e4 * 3 ** m), r.uniform(0.01, 0.5), n) + r.exponential(2e3, n)
                                 for m in range(modes)]))  # whole ns, as CUPTI reports (the sort key is whole ns)
    kde, refined = summarize_durations(d, KDE_ONLY), summarize_durations(d, REFINED)
    assert sum(c.count for c in refined) == len(d) == sum(c.count for c in kde)
    assert all(a.max <= b.min for a, b in zip(refined, refined[1:]))  # contiguous, ascending
    kde_starts = {c.min for c in kde}
    assert kde_starts <= {c.min for c in refined}  # every KDE cut is still a cut
    assert len(refined) <= max(len(kde), RefineConfig().max_clusters)


def test_where_the_bound_is_out_of_reach_the_kde_rows_can_be_kept():
    d = _waiting_collective(np.random.default_rng(1))
    kde = summarize_durations(d, KDE_ONLY)
    strict = CompressConfig(refine=RefineConfig(max_w1_rel_mean=1e-9, max_clusters=len(kde) + 1, keep_unreached=False))
    closest = CompressConfig(refine=RefineConfig(max_w1_rel_mean=1e-9, max_clusters=len(kde) + 1))
    assert summarize_durations(d, strict) == kde
    assert len(summarize_durations(d, closest)) == len(kde) + 1


@pytest.mark.parametrize("kwargs", [{"max_clusters": 0}, {"max_w1_rel_mean": 0.0}, {"max_w1_rel_mean": -1.0}])
def test_bad_refinement_settings_are_refused(kwargs):
    with pytest.raises(ConfigError):
        RefineConfig(**kwargs)
