"""Refine KDE clusters where the stored rows lose a distribution's shape, bounded in W₁.

The KDE cut finds modes; a mode is then stored as count, p50, p99, min and max and read back
as a log-normal truncated to [min, max]. That is faithful for a compute kernel's tight jitter,
not for a waiting-dominated collective: a handful of waits spread over decades, or a
continuous skew with a long tail, is no log-normal. Because clusters are contiguous runs of
the sorted durations and each reconstruction is truncated to its own range, the mixture's
quantile function on cluster ``c``'s share of the probability is exactly that cluster's own,
so the reconstruction's W₁ to the raw data is, exactly up to a midpoint rule,

    W₁ = Σ_c Σ_{i ∈ c} |x_(i) − Q̂_c((i + ½) / n_c)| / N

— computed for every cluster at once (one ``ndtri`` per event). Groups above the bound
(``max_w1_rel_mean`` × their mean) have their worst cluster split where the error drops most
(the largest gap in ns, in log-ns, or the middle), again and again until the bound or
``max_clusters`` is met. Only those groups — few, mostly collectives — cost Python work.
The stored form is unchanged: more rows for the groups that need them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from argus.errors import ConfigError

__all__ = ["RefineConfig", "cluster_w1_sums", "quantile_sorted", "refine_clusters"]

_Z99 = 2.326347874  # as in argus.compress.distance: σ = (ln p99 − ln p50) / z₀.₉₉
_MIN_SIGMA = 1e-4  # as mixture_cdf: all-equal clusters are (nearly) a step
_MIN_SPAN = 1e-12  # as mixture_cdf: a degenerate truncation range is a step at its max


@dataclass(frozen=True, slots=True)
class RefineConfig:
    #: W₁ bound per (rank, stream, kernel), over its mean duration. Half of the 1% goal: readers
    #: integrate the CDFs on finite grids, which adds a little error of their own.
    max_w1_rel_mean: float | None = 0.005
    #: Rows per distribution at most (25 B each): the bound gives way to the byte budget here.
    max_clusters: int = 16

    def __post_init__(self) -> None:
        if self.max_clusters < 1 or (self.max_w1_rel_mean is not None and self.max_w1_rel_mean <= 0):
            raise ConfigError(f"bad cluster refinement: {self}")


def quantile_sorted(sorted_vals: np.ndarray, start: np.ndarray, n: np.ndarray, q: float) -> np.ndarray:
    """Linear-interpolated quantile ``q`` of each run ``sorted_vals[start:start+n]`` (ascending)."""
    pos = (n - 1) * q
    lo = np.floor(pos).astype(np.int64)
    frac = pos - lo
    hi = np.minimum(lo + 1, n - 1)
    return sorted_vals[start + lo] * (1 - frac) + sorted_vals[start + hi] * frac


def cluster_w1_sums(dur: np.ndarray, c_start: np.ndarray, c_size: np.ndarray) -> np.ndarray:
    """Per cluster: Σ |x_(i) − Q̂(u_i)| over its events, Q̂ the truncated log-normal the stored
    row is read back as (``mixture_cdf`` with lo/hi). Divide by the group's count for its W₁."""
    c_start, c_size = np.asarray(c_start, np.int64), np.asarray(c_size, np.int64)
    out = np.zeros(len(c_start))
    spread = dur[c_start + c_size - 1] > dur[c_start]
    if not spread.any():
        return out
    cs, cn = c_start[spread], c_size[spread]
    lo, hi = dur[cs], dur[cs + cn - 1]
    mu = np.log(np.maximum(quantile_sorted(dur, cs, cn, 0.5), 1.0))
    sigma = np.maximum((np.log(np.maximum(quantile_sorted(dur, cs, cn, 0.99), 1.0)) - mu) / _Z99, _MIN_SIGMA)
    a = ndtr((np.log(np.maximum(lo, 1.0)) - mu) / sigma)
    b = ndtr((np.log(np.maximum(hi, 1.0)) - mu) / sigma)
    total = int(cn.sum())
    owner = np.repeat(np.arange(len(cs)), cn)
    i = np.arange(total) - np.repeat(np.cumsum(cn) - cn, cn)
    x = dur[np.repeat(cs, cn) + i]
    span = (b - a)[owner]
    u = a[owner] + span * (i + 0.5) / cn[owner]
    rec = np.exp(mu[owner] + sigma[owner] * ndtri(np.clip(u, 1e-300, 1 - 1e-16)))
    rec = np.clip(rec, lo[owner], hi[owner])
    rec = np.where(span > _MIN_SPAN, rec, hi[owner])
    out[spread] = np.bincount(owner, weights=np.abs(x - rec), minlength=len(cs))
    return out


def refine_clusters(dur: np.ndarray, g_start: np.ndarray, g_size: np.ndarray, c_group: np.ndarray,
                    c_start: np.ndarray, c_size: np.ndarray, config: RefineConfig = RefineConfig()
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split clusters of the groups whose reconstruction is off by more than the bound.

    ``dur`` sorted within groups; ``g_start``/``g_size`` per group; clusters ascending within
    their group. Returns (group, index within group, start, size) of the refined clusters."""
    c_index = _index_within(c_group)
    if config.max_w1_rel_mean is None or len(c_group) == 0:
        return c_group, c_index, c_start, c_size
    err = cluster_w1_sums(dur, c_start, c_size)
    n_groups = len(g_start)
    g_err = np.bincount(c_group, weights=err, minlength=n_groups)
    g_sum = np.bincount(c_group, weights=np.add.reduceat(dur, c_start) if len(dur) else np.zeros(0),
                        minlength=n_groups)
    bound = config.max_w1_rel_mean * g_sum  # W₁ ≤ r·mean  ⇔  Σ|…| ≤ r·Σx
    bad = np.flatnonzero((g_err > bound) & (g_size > 1))
    if bad.size == 0:
        return c_group, c_index, c_start, c_size
    replaced: dict[int, list[tuple[int, int]]] = {}
    first = np.searchsorted(c_group, bad, side="left")
    last = np.searchsorted(c_group, bad, side="right")
    for g, f, e in zip(bad, first, last):
        clusters = [(int(c_start[j]), int(c_size[j]), float(err[j])) for j in range(f, e)]
        replaced[int(g)] = _split_until(dur, clusters, float(bound[g]), config.max_clusters)
    keep = ~np.isin(c_group, bad)
    groups = [c_group[keep]]
    starts = [c_start[keep]]
    lengths = [c_size[keep]]
    for g, parts in replaced.items():
        groups.append(np.full(len(parts), g, np.int64))
        starts.append(np.array([s for s, _ in parts], np.int64))
        lengths.append(np.array([n for _, n in parts], np.int64))
    new_group = np.concatenate(groups)
    new_start = np.concatenate(starts)
    order = np.lexsort((new_start, new_group))
    new_group, new_start, new_size = new_group[order], new_start[order], np.concatenate(lengths)[order]
    return new_group, _index_within(new_group), new_start, new_size


def _index_within(c_group: np.ndarray) -> np.ndarray:
    """0, 1, … within each run of equal (sorted) group ids."""
    if len(c_group) == 0:
        return np.empty(0, np.int64)
    first = np.flatnonzero(np.r_[True, c_group[1:] != c_group[:-1]])
    run = np.diff(np.r_[first, len(c_group)])
    return np.arange(len(c_group)) - np.repeat(first, run)


def _split_until(dur: np.ndarray, clusters: list[tuple[int, int, float]], bound: float,
                 max_clusters: int) -> list[tuple[int, int]]:
    """Split the cluster with the largest error at its best cut until the group is within bound."""
    while len(clusters) < max_clusters and sum(c[2] for c in clusters) > bound:
        worst = max(range(len(clusters)), key=lambda j: clusters[j][2])
        start, size, err = clusters[worst]
        if size < 2 or err <= 0:
            break
        x = dur[start:start + size]
        cand = {int(np.argmax(np.diff(x))) + 1, int(np.argmax(np.diff(np.log(np.maximum(x, 1.0))))) + 1, size // 2}
        cand = sorted(c for c in cand if 0 < c < size)
        lefts = cluster_w1_sums(dur, np.full(len(cand), start), np.array(cand))
        rights = cluster_w1_sums(dur, start + np.array(cand), size - np.array(cand))
        best = int(np.argmin(lefts + rights))
        if lefts[best] + rights[best] >= err:  # no cut helps (cannot happen for n ≥ 2, but never loop)
            break
        cut = cand[best]
        clusters[worst:worst + 1] = [(start, cut, float(lefts[best])), (start + cut, size - cut, float(rights[best]))]
    return [(s, n) for s, n, _ in clusters]
