"""Mode finding for many duration distributions at once: Gaussian KDE on log-durations, cut
at density valleys, with guards against spurious valleys.

Input is every event of a window sorted by (group, duration); output is cluster boundaries
(indices into that sorted array). The density of each group is a histogram on its own log
grid smoothed by a Gaussian of Silverman's bandwidth, computed for all groups together with
one FFT per grid size (numpy; no per-event Python). Valleys are then checked for all groups
at once, in rounds that drop each group's weakest failing valley (``_kept_valleys``; the
per-group loop ``_merge_valleys`` is its tested reference): a valley is a cut only if it is
deep, has enough events on each side, and separates modes that are far enough apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.errors import ConfigError
from argus.uniques import sorted_unique

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
    for g_size in sorted_unique(grid[candidates]):
        rows = np.flatnonzero(candidates & (grid == g_size))
        _cut_rows(logd, starts, sizes, rows, lo, span, h, min_side, int(g_size), config, cuts)
    return cuts


def _cut_rows(logd, starts, sizes, rows, lo, span, h, min_side, G, config, cuts) -> None:  # noqa: N803 - G: the number of groups, as in the formulas
    r_start, r_size = starts[rows], sizes[rows]
    grid_lo = lo[rows] - 3 * h[rows]
    dx = span[rows] / G
    # The events of these groups, binned on their own row's grid (in place: these are most events).
    total = int(r_size.sum())
    at = np.arange(total)
    at += np.repeat(r_start - (np.cumsum(r_size) - r_size), r_size)
    x = logd.take(at)
    x -= np.repeat(grid_lo, r_size)
    x /= np.repeat(dx, r_size)
    bins = x.astype(np.int64)
    np.clip(bins, 0, G - 1, out=bins)
    bins += np.repeat(np.arange(len(rows)) * G, r_size)
    hist = np.bincount(bins, minlength=len(rows) * G).reshape(len(rows), G).astype(np.float64)
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
    has_min = np.flatnonzero(is_min.any(axis=1))
    if has_min.size == 0:
        return
    g_min = rows[has_min]
    min_sep = np.maximum(config.min_separation, h[g_min])
    window_bins = np.ceil(3 * h[g_min] / dx[has_min]).astype(np.int64)
    kept_row, kept_bin = _kept_valleys(dens[has_min], cum[has_min], is_min[has_min], dx[has_min], min_sep,
                                       min_side[g_min], config.valley_ratio, config.min_significance, window_bins)
    if kept_row.size == 0:
        return
    r = has_min[kept_row]
    g = rows[r]
    at = _searchsorted_runs(logd, starts[g], sizes[g], grid_lo[r] + kept_bin * dx[r])
    fresh = np.r_[True, (g[1:] != g[:-1]) | (at[1:] != at[:-1])]  # ascending per group: duplicates are neighbours
    fresh &= (at > 0) & (at < sizes[g])
    g, at = g[fresh], at[fresh]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    for group, group_cuts in zip(g[first], np.split(at, first[1:])):
        cuts[group] = group_cuts


def _searchsorted_runs(values: np.ndarray, start: np.ndarray, size: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``np.searchsorted(values[start[k]:start[k] + size[k]], x[k], side="left")`` for every k at
    once: a bisection over all runs together (log₂ of the longest run steps)."""
    lo = np.zeros(len(x), np.int64)
    hi = np.asarray(size, np.int64).copy()
    for _ in range(int(hi.max()).bit_length() if hi.size else 0):
        mid = (lo + hi) // 2
        below = values[np.minimum(start + mid, len(values) - 1)] < x
        active = lo < hi
        lo = np.where(active & below, mid + 1, lo)
        hi = np.where(active & ~below, mid, hi)
    return lo


def _kept_valleys(dens: np.ndarray, cum: np.ndarray, is_min: np.ndarray, dx: np.ndarray, min_sep: np.ndarray,
                  min_side: np.ndarray, ratio: float, z: float, window_bins: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_merge_valleys` for every row at once, in rounds: each round checks every valley
    left (segment maxima over each row's valleys), keeps the rows whose valleys all pass and
    drops each other row's weakest failing valley. ``is_min`` flags inner bins (bin − 1), the
    other arguments are per row. Returns (row, bin) of the valleys kept, ordered by row and bin."""
    n_bins = dens.shape[1]
    row, v0 = np.nonzero(is_min)
    v: np.ndarray = v0.astype(np.int64) + 1
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    while row.size:
        live, local = np.unique(row, return_inverse=True)
        d, c = dens[live], cum[live]
        first = np.r_[True, row[1:] != row[:-1]]
        last = np.r_[row[1:] != row[:-1], True]
        left: np.ndarray = np.where(first, 0, np.r_[0, v[:-1]])
        right = np.r_[v[1:], 0]
        right[last] = n_bins
        # Each row's valleys cut it into segments; valley i's left peak is in segment i and its
        # right peak in segment i + 1 (one extra segment per row: from the last valley on).
        seg_start = np.sort(np.concatenate([local * n_bins + left, (local * n_bins + v)[last]]))
        flat = d.ravel()
        seg_max = np.maximum.reduceat(flat, seg_start)
        hit = np.flatnonzero(flat == np.repeat(seg_max, np.diff(np.append(seg_start, flat.size))))
        peak = hit[np.searchsorted(hit, seg_start)] - np.repeat(np.arange(len(live)) * n_bins, 
                                                                 np.bincount(local, minlength=len(live)) + 1)
        left_seg = np.arange(len(row)) + local
        pl, pr = peak[left_seg], peak[left_seg + 1]
        d_pl, d_pr, d_v = d[local, pl], d[local, pr], d[local, v]
        low_peak = np.minimum(d_pl, d_pr)
        depth = np.divide(d_v, low_peak, out=np.full(len(row), np.inf), where=low_peak > 0)
        c_v = c[local, v - 1]
        n_left = c_v - np.where(left > 0, c[local, left - 1], 0.0)
        n_right = c[local, right - 1] - c_v
        p_low = np.where(d_pl <= d_pr, pl, pr)
        half = np.maximum(1, np.minimum(window_bins[row], np.abs(p_low - v) // 2))  # windows must not overlap
        n_peak = _window_counts(c, local, p_low, half)
        n_valley = _window_counts(c, local, v, half)
        significant = n_peak - n_valley >= z * np.sqrt(np.maximum(n_peak + n_valley, 1e-12))
        ok = ((depth <= ratio) & significant & ((pr - pl) * dx[row] >= min_sep[row])
              & (np.minimum(n_left, n_right) >= min_side[row]))
        score = np.where(ok, -1.0, depth)  # a failing valley's depth is ≥ 0
        row_first = np.flatnonzero(first)
        worst = np.maximum.reduceat(score, row_first)
        done = worst < 0
        done_ev = done[local]
        kept.append((row[done_ev], v[done_ev]))
        # Drop each other row's first valley of the worst score; check the rest again.
        at_worst = np.flatnonzero(~done_ev & (score == worst[local]))
        drop = at_worst[np.r_[True, local[at_worst][1:] != local[at_worst][:-1]]] if at_worst.size else at_worst
        stay = ~done_ev
        stay[drop] = False
        row, v = row[stay], v[stay]
    kept_row = np.concatenate([k[0] for k in kept]) if kept else np.empty(0, np.int64)
    kept_bin = np.concatenate([k[1] for k in kept]) if kept else np.empty(0, np.int64)
    order = np.lexsort((kept_bin, kept_row))
    return kept_row[order], kept_bin[order]


def _window_counts(cum: np.ndarray, row: np.ndarray, center: np.ndarray, half: np.ndarray) -> np.ndarray:
    """:func:`_window_count` per (row, center, half)."""
    hi = np.minimum(center + half, cum.shape[1] - 1)
    lo = center - half - 1
    return cum[row, hi] - np.where(lo >= 0, cum[row, np.maximum(lo, 0)], 0.0)


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
