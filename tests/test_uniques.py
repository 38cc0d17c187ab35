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
