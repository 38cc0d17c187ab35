"""Reconstructed duration distributions and Wasserstein-1 distances between them.

A KDE summary is rebuilt as a count-weighted mixture of log-normals, one per cluster:
μ = ln p50, σ = (ln p99 − ln p50)/2.326. Distributions are compared on one shared
log-spaced grid of durations, W₁ = ∫|F₁(x) − F₂(x)| dx in ns: both a shift of the bulk and a
rare long tail move it. Everything is vectorised over distributions (rows).
"""

from __future__ import annotations

import numpy as np

from argus.compress.sketch import LogSketch

__all__ = ["log_grid", "mixture_cdf", "empirical_cdf", "sketch_cdf", "w1", "w1_to_reference", "w1_matrix", "norm_cdf"]

_Z99 = 2.326347874


try:  # scipy's ndtr is ~5× faster than the series below on large arrays
    from scipy.special import ndtr as _ndtr
except ImportError:  # pragma: no cover - scipy is a dependency; the series is the fallback
    _ndtr = None


def norm_cdf(z: np.ndarray) -> np.ndarray:
    """Standard normal CDF."""
    if _ndtr is not None:
        return _ndtr(z)
    return _norm_cdf_series(z)


def _norm_cdf_series(z: np.ndarray) -> np.ndarray:
    """Erfc series of Numerical Recipes (|error| < 1.2e-7), for when scipy is absent."""
    x = np.abs(z) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * x)
    poly = (-x * x - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
    erfc = t * np.exp(poly)
    return np.where(z >= 0, 1.0 - 0.5 * erfc, 0.5 * erfc)


def log_grid(lo_ns: float, hi_ns: float, points: int = 512) -> np.ndarray:
    """Durations from ``lo_ns`` to ``hi_ns``, evenly spaced in log."""
    lo = max(float(lo_ns), 1.0)
    hi = max(float(hi_ns), lo * 1.001)
    return np.geomspace(lo, hi, points)


def mixture_cdf(grid: np.ndarray, dist: np.ndarray, counts: np.ndarray, p50: np.ndarray, p99: np.ndarray,
                n_dist: int | None = None, lo: np.ndarray | None = None, hi: np.ndarray | None = None,
                dtype: type = np.float64) -> np.ndarray:
    """CDFs ``(n_dist, len(grid))`` of the log-normal mixtures given by clusters: cluster ``i``
    belongs to distribution ``dist[i]`` with weight ``counts[i]``. With the clusters' observed
    ``lo``/``hi`` (min/max), each component is truncated to that range: a log-normal fitted to
    a wide p50→p99 spread otherwise puts mass far beyond anything observed."""
    dist = np.asarray(dist, np.int64)
    n_dist = int(dist.max()) + 1 if n_dist is None else n_dist
    if lo is not None and hi is not None:
        return _truncated_mixture_cdf(grid, dist, counts, p50, p99, n_dist, lo, hi, dtype)
    order = np.argsort(dist, kind="stable")  # rows grouped by distribution, for one reduceat
    dist = dist[order]
    p50, p99 = np.asarray(p50, np.float64)[order], np.asarray(p99, np.float64)[order]
    counts = np.asarray(counts, np.float64)[order]
    mu = np.log(np.maximum(p50, 1.0))
    sigma = np.maximum((np.log(np.maximum(p99, 1.0)) - mu) / _Z99, 1e-4)  # all-equal: a (nearly) sharp step
    lg = np.log(grid).astype(dtype)
    # one (clusters, grid) array, updated in place: at 10k ranks × 96 points the temporaries
    # of the plain expression cost more than the CDFs themselves
    comp = np.subtract(lg[None, :], mu.astype(dtype)[:, None])
    comp /= sigma.astype(dtype)[:, None]
    comp = norm_cdf(comp).astype(dtype, copy=False)
    comp *= counts.astype(dtype)[:, None]
    out: np.ndarray = np.zeros((n_dist, len(grid)), dtype)
    starts = np.flatnonzero(np.r_[True, dist[1:] != dist[:-1]]) if dist.size else np.empty(0, np.int64)
    if starts.size:
        out[dist[starts]] = np.add.reduceat(comp, starts, axis=0)
    total: np.ndarray = np.bincount(dist, weights=counts, minlength=n_dist)[:, None].astype(dtype)
    return np.divide(out, total, out=np.full_like(out, np.nan), where=total > 0)


def _truncated_mixture_cdf(grid: np.ndarray, dist: np.ndarray, counts: np.ndarray, p50: np.ndarray,
                           p99: np.ndarray, n_dist: int, lo: np.ndarray, hi: np.ndarray, dtype: type) -> np.ndarray:
    """:func:`mixture_cdf` of components truncated to [lo, hi]: a component is 0 below its lo
    and 1 from its hi on, so only the grid points inside its range need a normal CDF. Refined
    summaries have many narrow clusters (a few grid points each, where a dense (clusters, grid)
    array evaluates all of them); a cluster's full weight from its hi on is one scatter and a
    cumulative sum per distribution."""
    g = len(grid)
    counts = np.asarray(counts, np.float64)
    mu = np.log(np.maximum(np.asarray(p50, np.float64), 1.0))
    sigma = np.maximum((np.log(np.maximum(np.asarray(p99, np.float64), 1.0)) - mu) / _Z99, 1e-4)
    log_lo = np.log(np.maximum(np.asarray(lo, np.float64), 1.0))
    log_hi = np.log(np.maximum(np.asarray(hi, np.float64), 1.0))
    a = norm_cdf((log_lo - mu) / sigma)
    span = norm_cdf((log_hi - mu) / sigma) - a
    ok = span > 1e-12  # else a degenerate range: a step at its hi
    lg = np.log(np.asarray(grid, np.float64))
    first_in = np.searchsorted(lg, log_lo, side="left")  # grid points below lo: 0
    first_full = np.searchsorted(lg, log_hi, side="left")  # from hi on: the whole weight
    steps = np.bincount(dist * (g + 1) + first_full, weights=counts, minlength=n_dist * (g + 1))
    out = np.cumsum(steps.reshape(n_dist, g + 1)[:, :g], axis=1)
    width = np.where(ok, first_full - first_in, 0)
    inside = np.flatnonzero(width > 0)
    if inside.size:
        w = width[inside]
        row = np.repeat(inside, w)
        col = first_in[row] + (np.arange(int(w.sum())) - np.repeat(np.cumsum(w) - w, w))
        val = (norm_cdf((lg[col] - mu[row]) / sigma[row]) - a[row]) / span[row]
        np.clip(val, 0.0, 1.0, out=val)
        out += np.bincount(dist[row] * g + col, weights=val * counts[row], minlength=n_dist * g).reshape(n_dist, g)
    total = np.bincount(dist, weights=counts, minlength=n_dist)[:, None]
    res: np.ndarray = np.divide(out, total, out=np.full(out.shape, np.nan), where=total > 0)
    return res.astype(dtype, copy=False)


def empirical_cdf(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Fraction of ``values`` ≤ each grid point (the raw data's CDF)."""
    v = np.sort(np.asarray(values, np.float64))
    return np.searchsorted(v, grid, side="right") / max(len(v), 1)


def sketch_cdf(sketch: LogSketch, grid: np.ndarray) -> np.ndarray:
    return sketch.cdf(grid)


def w1(cdf_a: np.ndarray, cdf_b: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """∫|F_a − F_b| dx (trapezoid on the grid), in the grid's unit; rows broadcast."""
    diff = np.abs(np.asarray(cdf_a) - np.asarray(cdf_b))
    dx = np.diff(grid)
    return (0.5 * (diff[..., 1:] + diff[..., :-1]) * dx).sum(axis=-1)


def w1_to_reference(cdfs: np.ndarray, reference: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Each row's distance to one reference CDF (e.g. the peer median): O(n), for detection."""
    return w1(cdfs, reference[None, :], grid)


def w1_matrix(cdfs: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """All pairwise distances, O(n²): only for the kernels and groups on display."""
    n = len(cdfs)
    out = np.zeros((n, n))
    for i in range(n):
        out[i, i + 1:] = w1(cdfs[i + 1:], cdfs[i][None, :], grid)
    return out + out.T
