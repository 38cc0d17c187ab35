"""The sort-free grouping of a window's events against the ``np.unique`` it replaces."""

import numpy as np
import pytest

from argus.compress.summarize import _Distinct, _group_codes, _group_sorted


def _events(seed: int, n: int, rank_lo: int, stream_dtype, streams: list[int], n_labels: int):
    rng = np.random.default_rng(seed)
    rank = rng.integers(rank_lo, rank_lo + 40, n).astype(np.int32)
    stream = rng.choice(np.array(streams), n).astype(stream_dtype)
    label = rng.integers(0, n_labels, n).astype(np.int64)
    return rank, stream, label


@pytest.mark.parametrize("rank_lo, stream_dtype, streams, n_labels", [
    (0, np.int16, [7, 13, 33], 5),
    (1000, np.int32, [0, 1, 2, 3], 60),
    (3, np.int16, [-2, 5], 3),  # a negative stream keeps its low 16 bits, as in the key
    (0, np.int64, [70000, 7], 4),
    (0, np.int32, [7], 70000),  # too many labels for a dense code: np.unique
])
def test_group_codes_order_and_index_events_as_np_unique_does(rank_lo, stream_dtype, streams, n_labels):
    rank, stream, label = _events(1, 5000, rank_lo, stream_dtype, streams, n_labels)
    key = (rank.astype(np.int64) << 32) | ((stream.astype(np.int64) & 0xFFFF) << 16) | label
    want_keys, want_gid = np.unique(key, return_inverse=True)
    keys, code, code_of_group, n_codes = _group_codes(rank, stream, label, n_labels)
    assert keys.tolist() == want_keys.tolist()
    assert (np.diff(code_of_group) > 0).all() and code_of_group[-1] < n_codes
    assert np.searchsorted(code_of_group, code).tolist() == want_gid.tolist()


@pytest.mark.parametrize("codes", [np.array([5, 0, 5, 3, 3, 9]), np.array([-4, 7, -4, 2]), np.array([1 << 40, 3, 3])])
def test_distinct_codes_and_spread_values_as_np_unique_does(codes):
    values, inverse = np.unique(codes, return_inverse=True)
    distinct = _Distinct.of(codes)
    per_value = np.arange(len(values)) * 10
    assert distinct.values.tolist() == values.tolist()
    assert distinct.spread(per_value).tolist() == per_value[inverse].tolist()


@pytest.mark.parametrize("dur", [
    np.array([5, 3, -1, 0, 9, 3, 2**39, 7]),
    np.array([-1, -1]),
    np.array([2**41, 3, 5, -1, 4]),  # beyond the 40-bit slot: the general path
])
def test_integer_durations_sort_as_their_float_values(dur):
    gid = np.array([1, 0, 1, 1, 0, 0, 1, 0])[: len(dur)]
    codes = np.arange(2)
    got = _group_sorted(gid, dur, codes, 2)
    want = _group_sorted(gid, dur.astype(np.float64), codes, 2)
    assert got.dur.tobytes() == want.dur.tobytes() and got.invalid == want.invalid
    assert got.sizes.tolist() == want.sizes.tolist() and got.starts.tolist() == want.starts.tolist()
