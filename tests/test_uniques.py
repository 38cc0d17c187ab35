"""sorted_unique says what np.unique says, for every dtype the code hands it."""

import numpy as np
import pytest

from argus.uniques import sorted_unique


@pytest.mark.parametrize("values", [
    np.array([5, 3, 5, -1, 3, 9], np.int64), np.array([2, 2, 2], np.int32), np.array([], np.int64),
    np.array([True, False, True]), np.array(["b", "a", "b", ""]), np.array([[3, 1], [1, 2]], np.uint8),
    np.array([1.5, np.nan, 1.5, np.nan, -0.0, 0.0]), np.array(["x", "a", "x"], dtype=object), [3, 1, 3],
])
def test_the_same_distinct_values_as_numpy(values):
    want, got = np.unique(values), sorted_unique(values)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("offset", [0, 7, -3])
def test_small_unique_inverse_says_what_np_unique_says(dtype, offset):
    from argus.uniques import small_unique_inverse

    if np.dtype(dtype).kind == "u" and offset < 0:
        pytest.skip("unsigned")
    values = (np.random.default_rng(abs(offset)).integers(0, 50, 2000) + offset).astype(dtype)
    values[::7] = values[0]
    want, want_inv = np.unique(values, return_inverse=True)
    got, got_inv = small_unique_inverse(values)
    assert got.dtype == want.dtype and np.array_equal(got, want) and np.array_equal(got_inv, want_inv)


def test_small_unique_inverse_of_a_wide_span_or_floats_is_np_unique():
    from argus.uniques import small_unique_inverse

    for values in (np.array([0, 1 << 40, 5, 5]), np.array([2.5, np.nan, 1.0]), np.array([], np.int32)):
        want, want_inv = np.unique(values, return_inverse=True)
        got, got_inv = small_unique_inverse(values)
        assert np.array_equal(got, want, equal_nan=True) and np.array_equal(got_inv, want_inv)
