"""Mode finding for many duration distributions at once: Gaussian KDE on log-durations, cut
at density valleys, with guards against spurious valleys.

Input is every event of a window sorted by (group, duration); output is cluster boundaries
(indices into that sorted array). The density of each group is a histogram on its own log
grid smoothed by a Gaussian of Silverman's bandwidth, computed for all groups together with
one FFT per grid size (numpy; no per-event Python). Valleys are then checked per candidate
(there are few): a valley is a cut only if it is deep, has enough events on each side, and
separates modes that are far enough apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.errors import ConfigError

__all__ = ["KdeConfig", "cluster_bounds", "silverman_bandwidth"]


@dataclass(frozen=True, slots=True)
class KdeConfig:
    """Guards against spurious valleys; defaults keep noise unimodal and real modes apart."""

    min_side: int = 5  # events required on each side of a cut …
    min_side_frac: float = 0.01  # … and this share of the group's events
    valley_ratio: float = 0.6  # density at the cut ≤ this × the lower of the two peaks
    min_separation: float = 0.05  # peaks at least this far apart in ln-duration (≈ 5%) …
    min_bandwidth: float = 0.005  # KDE bandwidth floor in ln-duration (timer resolution)
    min_significance: float = 3.0  # peak minus valley, in Poisson σ of the events within ±3h
    max_grid: int = 2048

    def __post_init__(self) -> None:
        if self.min_side < 1 or not 0 <= self.min_side_frac < 0.5 or not 0 < self.valley_ratio < 1:
            raise ConfigError(f"bad KDE guards: {self}")


def silverman_bandwidth(std: np.ndarray, iqr: np.ndarray, n: np.ndarray, floor: float) -> np.ndarray:
    """0.9·min(σ, IQR/1.34)·n^(-1/5), falling back to σ when the IQR is 0; at least ``floor``."""
    spread = np.minimum(std, iqr / 1.34)
    spread = np.where(spread > 0, spread, std)
    return np.maximum(0.9 * spread * np.power(np.maximum(n, 1), -0.2), floor)


def cluster_bounds(logd: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                   config: KdeConfig = KdeConfig()) -> list[np.ndarray]:
    """For each group (``logd[starts[g]:starts[g]+sizes[g]]``, ascending), the sorted indices
    (relative to the group) where a new cluster begins — empty for a unimodal group."""
    n_groups = len(starts)
    cuts: list[np.ndarray] = [np.empty(0, np.int64)] * n_groups
    if n_groups == 0:
        return cuts
    ends = starts + sizes
    lo, hi = logd[starts], logd[ends - 1]
    q1 = logd[starts + ((sizes - 1) * 0.25).astype(np.int64)]
    q3 = logd[starts + ((sizes - 1) * 0.75).astype(np.int64)]
    sums = np.add.reduceat(logd, starts) if len(logd) else np.zeros(n_groups)
    sq = np.add.reduceat(logd * logd, starts) if len(logd) else np.zeros(n_groups)
    mean = sums / sizes
    std = np.sqrt(np.maximum(sq / sizes - mean * mean, 0.0))
    h = silverman_bandwidth(std, q3 - q1, sizes, config.min_bandwidth)
    min_side = np.maximum(config.min_side, np.ceil(config.min_side_frac * sizes)).astype(np.int64)
    candidates = (sizes >= 2 * min_side) & (hi - lo > max(config.min_separation, 0.0))
    if not candidates.any():
        return cuts
    # Grid size per group: bins of at most h/2 over [lo - 3h, hi + 3h].
    span = (hi - lo) + 6 * h
    need = np.clip(np.ceil(span / (h / 2)), 64, config.max_grid)
    grid = (2 ** np.ceil(np.log2(need))).astype(np.int64)
    for g_size in np.unique(grid[candidates]):
        rows = np.flatnonzero(candidates & (grid == g_size))
        _cut_rows(logd, starts, sizes, rows, lo, span, h, min_side, int(g_size), config, cuts)
    return cuts


def _cut_rows(logd, starts, sizes, rows, lo, span, h, min_side, G, config, cuts) -> None:  # noqa: N803 - G: the number of groups, as in the formulas
    r_start, r_size = starts[rows], sizes[rows]
    grid_lo = lo[rows] - 3 * h[rows]
    dx = span[rows] / G
    # Event indices of these groups, and the row each belongs to.
    total = int(r_size.sum())
    row_of = np.repeat(np.arange(len(rows)), r_size)
    offsets = np.arange(total) - np.repeat(np.cumsum(r_size) - r_size, r_size)
    idx = np.repeat(r_start, r_size) + offsets
    bins = np.clip(((logd[idx] - grid_lo[row_of]) / dx[row_of]).astype(np.int64), 0, G - 1)
    hist = np.bincount(row_of * G + bins, minlength=len(rows) * G).reshape(len(rows), G).astype(np.float64)
    # Gaussian smoothing in the Fourier domain, zero-padded so nothing wraps around.
    spec = np.fft.rfft(hist, n=2 * G, axis=1)
    freq = np.fft.rfftfreq(2 * G)
    sigma_bins = (h[rows] / dx)[:, None]
    dens = np.fft.irfft(spec * np.exp(-2.0 * (np.pi * freq[None, :] * sigma_bins) ** 2), n=2 * G, axis=1)[:, :G]
    # FFT round-off leaves ±1e-10 ripples where the density is zero; each would be a "valley".
    dens[dens < 1e-7 * dens.max(axis=1, keepdims=True)] = 0.0
    inner = dens[:, 1:-1]
    is_min = (inner < dens[:, :-2]) & (inner <= dens[:, 2:])
    cum = np.cumsum(hist, axis=1)
    for r in np.flatnonzero(is_min.any(axis=1)):
        g = rows[r]
        accepted = _merge_valleys(dens[r], cum[r], np.flatnonzero(is_min[r]) + 1, dx[r],
                                  max(config.min_separation, h[g]), int(min_side[g]), config.valley_ratio,
                                  config.min_significance, int(np.ceil(3 * h[g] / dx[r])))
        if accepted:
            cut_x = grid_lo[r] + np.asarray(accepted) * dx[r]
            seg = logd[starts[g]:starts[g] + sizes[g]]
            at = np.unique(np.searchsorted(seg, cut_x, side="left"))
            cuts[g] = at[(at > 0) & (at < len(seg))]


def _merge_valleys(d: np.ndarray, cum: np.ndarray, cand: np.ndarray, dx: float, min_sep: float,
                   min_side: int, ratio: float, z: float, window_bins: int) -> list[int]:
    """Drop the weakest failing valley and re-check the rest until every valley left is deep
    (relatively, and statistically: events within ±3h of the lower peak exceed those around the
    valley by ``z`` Poisson σ, windows shrunk so they do not overlap — sparse tails ripple), has ``min_side`` events on each side and
    separates peaks ``min_sep`` apart."""
    cuts = [int(v) for v in cand]
    G = len(d)
    while cuts:
        bounds = [0, *cuts, G]
        worst, worst_score = -1, -1.0
        for i, v in enumerate(cuts):
            left, right = bounds[i], bounds[i + 2]
            pl = left + int(np.argmax(d[left:v]))
            pr = v + int(np.argmax(d[v:right]))
            low_peak = min(d[pl], d[pr])
            depth = d[v] / low_peak if low_peak > 0 else np.inf
            n_left = cum[v - 1] - (cum[left - 1] if left > 0 else 0)
            n_right = cum[right - 1] - cum[v - 1]
            p_low = pl if d[pl] <= d[pr] else pr
            half = max(1, min(window_bins, abs(p_low - v) // 2))  # windows must not overlap
            n_peak, n_valley = _window_count(cum, p_low, half), _window_count(cum, v, half)
            significant = n_peak - n_valley >= z * np.sqrt(max(n_peak + n_valley, 1e-12))
            ok = (depth <= ratio and significant and (pr - pl) * dx >= min_sep
                  and min(n_left, n_right) >= min_side)
            if not ok and depth > worst_score:
                worst, worst_score = i, depth
        if worst < 0:
            return cuts
        del cuts[worst]
    return cuts


def _window_count(cum: np.ndarray, center: int, half: int) -> float:
    hi = min(center + half, len(cum) - 1)
    lo = center - half - 1
    return float(cum[hi] - (cum[lo] if lo >= 0 else 0.0))
