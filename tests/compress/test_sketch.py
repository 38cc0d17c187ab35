import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argus.compress import LogSketch, relative_error
from argus.errors import ConfigError

durations = st.lists(st.one_of(st.floats(0.5, 1e10, allow_nan=False), st.just(0.0)), min_size=0, max_size=300)


def _same(a: LogSketch, b: LogSketch) -> None:
    assert (a.schema, a.count, a.zero_count) == (b.schema, b.count, b.zero_count)
    assert a.buckets.tolist() == b.buckets.tolist() and a.counts.tolist() == b.counts.tolist()
    if a.count:
        assert (a.min, a.max) == (b.min, b.max)
        assert a.sum == pytest.approx(b.sum, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(durations, durations)
def test_merge_of_sketches_equals_sketch_of_the_union(a, b):
    _same(LogSketch.from_values(np.array(a)).merge(LogSketch.from_values(np.array(b))),
          LogSketch.from_values(np.array(a + b)))


@settings(max_examples=100, deadline=None)
@given(durations, durations, durations)
def test_merge_is_associative_and_commutative(a, b, c):
    sa, sb, sc = (LogSketch.from_values(np.array(x)) for x in (a, b, c))
    _same(sa.merge(sb).merge(sc), sc.merge(sa.merge(sb)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1.0, 1e12, allow_nan=False), min_size=1, max_size=500), st.floats(0, 1))
def test_quantiles_are_within_the_relative_error(values, q):
    sk = LogSketch.from_values(np.array(values))
    truth = np.sort(values)[int(np.floor(q * (len(values) - 1)))]
    assert abs(sk.quantile(q) - truth) <= relative_error(sk.schema) * truth * (1 + 1e-9)
    assert relative_error(5) <= 0.02


def test_downscaled_sketches_merge_at_the_coarser_schema():
    v = np.random.default_rng(0).lognormal(10, 1, 1000)
    fine, coarse = LogSketch.from_values(v[:500], schema=5), LogSketch.from_values(v[500:], schema=3)
    _same(fine.merge(coarse), LogSketch.from_values(v, schema=3))
    with pytest.raises(ConfigError):
        coarse.downscale(5)


def test_cdf_is_exact_at_bucket_bounds_and_invalid_values_are_not_data():
    sk = LogSketch.from_values(np.array([0.0, 1.0, 10.0, 10.0, np.nan, -3.0, np.inf]))
    assert (sk.count, sk.zero_count) == (4, 1)
    assert sk.cdf(np.array([0.0, 1.0, 1e6])).tolist() == [0.25, 0.5, 1.0]
    empty = LogSketch.from_values(np.array([np.nan]))
    assert empty.count == 0 and np.isnan(empty.quantile(0.5))
