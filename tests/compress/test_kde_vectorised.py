"""The vectorised valley check (all rows at once) against the per-row loop it replaces."""

import numpy as np
import pytest

from argus.compress.kde import _kept_valleys, _merge_valleys, _searchsorted_runs


def _rows(seed: int, n_rows: int, n_bins: int):
    """Noisy multimodal densities with plateaus (ties for the peaks) and zero stretches."""
    rng = np.random.default_rng(seed)
    hist = rng.poisson(rng.uniform(0.2, 20, (n_rows, 1)) * (1 + np.sin(np.arange(n_bins) / rng.uniform(1, 9, (n_rows, 1)))),
                       (n_rows, n_bins)).astype(np.float64)
    hist[rng.random((n_rows, n_bins)) < 0.1] = 0.0
    dens = np.round(hist + np.roll(hist, 1, axis=1) + np.roll(hist, -1, axis=1), 0) / 3  # rounding makes ties
    dens[:, :2] = 0.0
    inner = dens[:, 1:-1]
    is_min = (inner < dens[:, :-2]) & (inner <= dens[:, 2:])
    keep = is_min.any(axis=1)
    dx = rng.uniform(0.001, 0.05, n_rows)
    params = (dx, rng.uniform(0.01, 0.2, n_rows), rng.integers(1, 30, n_rows), rng.integers(1, 12, n_rows))
    return dens[keep], np.cumsum(hist, axis=1)[keep], is_min[keep], *(p[keep] for p in params)


@pytest.mark.parametrize("seed, n_bins", [(0, 64), (1, 64), (2, 128), (3, 256)])
@pytest.mark.parametrize("ratio, z", [(0.6, 3.0), (0.95, 0.5)])
def test_all_rows_at_once_keep_the_valleys_the_loop_keeps(seed, n_bins, ratio, z):
    dens, cum, is_min, dx, min_sep, min_side, window_bins = _rows(seed, 120, n_bins)
    kept_row, kept_bin = _kept_valleys(dens, cum, is_min, dx, min_sep, min_side, ratio, z, window_bins)
    got = [kept_bin[kept_row == r].tolist() for r in range(len(dens))]
    want = [_merge_valleys(dens[r], cum[r], np.flatnonzero(is_min[r]) + 1, dx[r], min_sep[r], int(min_side[r]),
                           ratio, z, int(window_bins[r])) for r in range(len(dens))]
    assert got == want
    assert sum(map(len, want)) > 0 and sum(len(np.flatnonzero(m)) for m in is_min) > sum(map(len, want))


def test_searching_every_run_at_once_is_searchsorted_per_run():
    rng = np.random.default_rng(5)
    size = rng.integers(1, 300, 200)
    start = np.cumsum(size) - size
    values = np.concatenate([np.sort(np.round(rng.normal(0, 3, n), 1)) for n in size])  # ties included
    run = rng.integers(0, len(size), 2000)
    x = np.round(rng.normal(0, 4, run.size), 1)
    got = _searchsorted_runs(values, start[run], size[run], x)
    want = [np.searchsorted(values[start[k]:start[k] + size[k]], v, side="left") for k, v in zip(run, x)]
    assert got.tolist() == want
