"""Refine KDE clusters where the stored rows lose a distribution's shape, bounded in W₁.

The KDE cut finds modes; a mode is then stored as count, p50, p99, min and max and read back
as a log-normal truncated to [min, max]. That is faithful for a compute kernel's tight jitter,
not for a waiting-dominated collective: a handful of waits spread over decades, or a
continuous skew with a long tail, is no log-normal. Because clusters are contiguous runs of
the sorted durations and each reconstruction is truncated to its own range, the mixture's
quantile function on cluster ``c``'s share of the probability is exactly that cluster's own,
so the reconstruction's W₁ to the raw data is, exactly up to a midpoint rule,

    W₁ = Σ_c Σ_{i ∈ c} |x_(i) − Q̂_c((i + ½) / n_c)| / N

— computed for every cluster at once (one ``ndtri`` per scored point). Groups above the bound
(``max_w1_rel_mean`` × their mean) have their worst cluster split where the error drops most
(the largest gap in ns or in log-ns, or one of a few quantiles), again and again until the
bound or ``max_clusters`` is met or no split helps. All groups are refined together, in rounds
of array operations (segment reductions over clusters sorted by group): no Python per group.
The stored form is unchanged: more rows for the groups that need them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from argus.errors import ConfigError

__all__ = ["REFINED_W1_BOUND", "RefineConfig", "cluster_w1_sums", "quantile_sorted", "refine_clusters"]

_Z99 = 2.326347874  # as in argus.compress.distance: σ = (ln p99 − ln p50) / z₀.₉₉
_MIN_SIGMA = 1e-4  # as mixture_cdf: all-equal clusters are (nearly) a step
_MIN_SPAN = 1e-12  # as mixture_cdf: a degenerate truncation range is a step at its max
#: Where a cluster may be cut besides its largest gaps: a truncated log-normal fits a whole mode
#: well and a half of one badly (a half has its density peak at an edge), so splits that peel
#: off a tail are often the ones that help; the middle is one candidate among them.
SPLIT_QUANTILES = (0.02, 0.2, 0.5, 0.8, 0.98)
#: Clusters larger than ``SCORE_POINTS`` are scored on their ``SCORE_TAIL`` lowest and highest
#: events exactly and the rest on evenly spaced order statistics (the midpoint rule over
#: quantile strata): far less work on a compute kernel's thousands of launches, exact for the
#: small (collective) ones. 64/12 instead of 96/16: the same bytes and p95 fidelity on the
#: production workload, a third fewer points. The tails are exact because a long tail is where one point per
#: stratum misjudges most (strata alone: 14% low on a log-normal with an exponential tail).
SCORE_POINTS = 64
SCORE_TAIL = 12
#: Candidate cuts are ranked on a coarser scoring (the chosen pieces are then scored as above):
#: ranking needs less precision than the bound, and candidates outnumber clusters ~10 to 1.
#: Scoring is the refinement's cost (≈ 80% of it); 16 points instead of 32, five quantiles
#: instead of seven and every cut only below 24 events: ~2.5× fewer points, production p95
#: unchanged (0.78% / 0.89%, 845 B instead of 878 B per rank-step at 10-step windows).
CANDIDATE_POINTS = 16
CANDIDATE_TAIL = 4
#: Clusters this small (a collective's few long waits) are tried at every cut: cheap, and the
#: few fixed candidates miss the one cut that helps often enough to leave such groups 30% off.
EVERY_CUT_BELOW = 24
#: A cluster no single cut improves is tried at every pair of at most this many of its
#: candidates (evenly spaced): all pairs of a 47-event cluster were 1,081 pieces to score; 24
#: still finds the pair a waiting collective needs (12 did not: tests/compress/test_refine.py).
PAIR_CANDIDATES = 24
#: Rounds at most: each splits or closes at least one cluster of every group still above its
#: bound, so ``max_clusters`` splits and as many closes fit well within.
MAX_ROUNDS = 64
#: Clusters of one group tried in one round at most: the worst, and the next worst while the
#: group would stay above its bound even were every worse one's error gone (worst first would
#: get to them too). Fewer rounds, the same rows.
MAX_PICKS = 16
#: Low mantissa bits of a gap's key that hold its position (``_gap_keys``).
_POS_BITS = 24
_POS_MASK = np.int64((1 << _POS_BITS) - 1)


#: The bound where refinement is on: the 1% goal less a margin for what the estimate leaves out
#: (scoring large clusters on strata; readers' finite grids). On the production workload 0.8%
#: gives the fidelity of 0.5% with 7% fewer rows.
REFINED_W1_BOUND = 0.008


@dataclass(frozen=True, slots=True)
class RefineConfig:
    #: W₁ bound per (rank, stream, kernel), over its mean duration, or None: refinement off.
    #: On by default since it is vectorised (``argus bench compression`` reports both rates).
    max_w1_rel_mean: float | None = REFINED_W1_BOUND
    #: Rows per distribution at most (25 B each): the bound gives way to the byte budget here.
    max_clusters: int = 16
    #: Where the bound is out of reach within ``max_clusters`` (a shape no few truncated
    #: log-normals follow): keep the closest split found (True) or the KDE's rows (False, fewer
    #: bytes; the window's sketch holds the shape either way). True: L3 and the report read rows
    #: only, and on the production workload the comm p95 drops from 16% to 1.3% of the mean.
    keep_unreached: bool = True

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


def cluster_w1_sums(dur: np.ndarray, c_start: np.ndarray, c_size: np.ndarray, points: int = SCORE_POINTS,
                    tail: int = SCORE_TAIL) -> np.ndarray:
    """Per cluster: Σ |x_(i) − Q̂(u_i)| over its events, Q̂ the truncated log-normal the stored
    row is read back as (``mixture_cdf`` with lo/hi). Divide by the group's count for its W₁.

    Clusters of at most ``points`` events are scored on every event; larger ones on the same
    ``points`` positions each (``tail`` exact at either end, the body on strata), laid out as
    one 2-D array. This is the refinement's hot path: in-place passes, one ``ndtri`` each."""
    c_start, c_size = np.asarray(c_start, np.int64), np.asarray(c_size, np.int64)
    out = np.zeros(len(c_start))
    if len(c_start) == 0:
        return out
    first_x, last_x = dur[c_start], dur[c_start + c_size - 1]
    spread = np.flatnonzero(last_x > first_x)
    if spread.size == 0:
        return out
    cs, cn = c_start[spread], c_size[spread]
    lo, hi = first_x[spread], last_x[spread]
    mu = np.log(np.maximum(quantile_sorted(dur, cs, cn, 0.5), 1.0))
    sigma = np.maximum((np.log(np.maximum(quantile_sorted(dur, cs, cn, 0.99), 1.0)) - mu) / _Z99, _MIN_SIGMA)
    a = ndtr((np.log(np.maximum(lo, 1.0)) - mu) / sigma)
    span = ndtr((np.log(np.maximum(hi, 1.0)) - mu) / sigma) - a
    step = span <= _MIN_SPAN  # a degenerate range: the row reads back as a step at its max
    scale = span / cn  # u_i = a + scale·(i + ½)
    small = cn <= points
    res = np.empty(len(cs))
    e = np.flatnonzero(small)
    if e.size:  # every event: ragged, one owner per point
        n = cn[e]
        owner = np.repeat(np.arange(e.size), n)
        at = np.arange(int(n.sum()))
        at -= np.repeat(np.cumsum(n) - n, n)  # i, the rank within the cluster
        pos = at + 0.5
        at += np.repeat(cs[e], n)
        x = dur.take(at)
        hi_e = np.repeat(hi[e], n)
        a_e, scale_e, mu_e, sigma_e, lo_e = (np.repeat(v[e], n) for v in (a, scale, mu, sigma, lo))
        err = _abs_err(x, pos, a_e, scale_e, mu_e, sigma_e, lo_e, hi_e)
        res[e] = np.bincount(owner, weights=err, minlength=e.size)
        step_e = step[e]
        if step_e.any():
            res[e[step_e]] = np.bincount(owner, weights=np.abs(x - hi_e), minlength=e.size)[step_e]
    s = np.flatnonzero(~small)
    if s.size:  # the tails exactly and the body on strata: the same ``points`` positions for each
        n = cn[s]
        strata = points - 2 * tail
        at = np.empty((s.size, points), np.int64)
        at[:, :tail] = np.arange(tail)
        np.add((n - tail)[:, None], np.arange(tail), out=at[:, points - tail:])
        body = at[:, tail:points - tail]
        body[...] = (np.arange(strata) + 0.5)[None, :] * ((n - 2 * tail) / strata)[:, None]  # truncated, as astype
        body += tail
        pos = at + 0.5
        at += cs[s][:, None]
        x = dur.take(at)
        col = (slice(None), None)
        err = _abs_err(x, pos, a[s][col], scale[s][col], mu[s][col], sigma[s][col], lo[s][col], hi[s][col])
        step_s = step[s]
        if step_s.any():
            err[step_s] = np.abs(x[step_s] - hi[s][step_s][:, None])
        res[s] = (err[:, :tail].sum(axis=1) + err[:, points - tail:].sum(axis=1)
                  + err[:, tail:points - tail].sum(axis=1) * ((n - 2 * tail) / strata))
    out[spread] = res
    return out


def _abs_err(x: np.ndarray, pos: np.ndarray, a, scale, mu, sigma, lo, hi) -> np.ndarray:
    """|x_(i) − Q̂(a + scale·pos)|, ``pos`` = i + ½ (overwritten with the result), Q̂ = exp(μ + σ·Φ⁻¹)
    clipped to [lo, hi] (arrays broadcast)."""
    z = pos
    z *= scale
    z += a
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        z = ndtri(z, out=z)  # u never leaves (0, 1); ndtri(0) = −inf reads back as lo
        z *= sigma
        z += mu
        np.exp(z, out=z)
    np.clip(z, lo, hi, out=z)
    z -= x
    return np.abs(z, out=z)


def refine_clusters(dur: np.ndarray, g_start: np.ndarray, g_size: np.ndarray, c_group: np.ndarray,
                    c_start: np.ndarray, c_size: np.ndarray, config: RefineConfig = RefineConfig(),
                    logd: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split clusters of the groups whose reconstruction is off by more than the bound.

    ``dur`` sorted within groups (``logd``: its log, clipped at 1 ns, if the caller has it);
    ``g_start``/``g_size`` per group; clusters ascending within their group, groups in the
    order of their events. Returns (group, index within group, start, size) of the refined
    clusters."""
    c_index = _index_within(c_group)
    if config.max_w1_rel_mean is None or len(c_group) == 0:
        return c_group, c_index, c_start, c_size
    c_start, c_size = np.asarray(c_start, np.int64), np.asarray(c_size, np.int64)
    err = cluster_w1_sums(dur, c_start, c_size)
    n_groups = len(g_start)
    g_err = np.bincount(c_group, weights=err, minlength=n_groups)
    g_sum = np.bincount(c_group, weights=np.add.reduceat(dur, c_start) if len(dur) else np.zeros(0),
                        minlength=n_groups)
    bound = config.max_w1_rel_mean * g_sum  # W₁ ≤ r·mean  ⇔  Σ|…| ≤ r·Σx
    bad = (g_err > bound) & (np.asarray(g_size) > 1)
    if not bad.any():
        return c_group, c_index, c_start, c_size
    sel = bad[c_group]
    state = _Clusters(c_group[sel], c_start[sel], c_size[sel], err[sel], np.ones(int(sel.sum()), bool))
    if logd is None:
        logd = np.log(np.maximum(dur, 1.0))
    state = _split_all(dur, (_gap_keys(dur), _gap_keys(logd)), state, bound, config.max_clusters)
    g_final = np.bincount(state.group, weights=state.err, minlength=n_groups)
    take = bad if config.keep_unreached else bad & (g_final <= bound)
    if not take.any():
        return c_group, c_index, c_start, c_size
    mine = take[state.group]
    keep = ~take[c_group]
    new_start = np.concatenate([c_start[keep], state.start[mine]])
    order = np.argsort(new_start, kind="stable")  # groups are contiguous runs of events: start orders both
    new_group = np.concatenate([c_group[keep], state.group[mine]])[order]
    new_size = np.concatenate([c_size[keep], state.size[mine]])[order]
    return new_group, _index_within(new_group), new_start[order], new_size


def _index_within(c_group: np.ndarray) -> np.ndarray:
    """0, 1, … within each run of equal (sorted) group ids."""
    if len(c_group) == 0:
        return np.empty(0, np.int64)
    first = np.flatnonzero(np.concatenate([[True], c_group[1:] != c_group[:-1]]))
    run = np.diff(np.append(first, len(c_group)))
    return np.arange(len(c_group)) - np.repeat(first, run)


@dataclass
class _Clusters:
    """The clusters of the groups being refined, ordered by start: error sums, and whether a
    cut may still help (False once none did)."""

    group: np.ndarray
    start: np.ndarray
    size: np.ndarray
    err: np.ndarray
    open: np.ndarray


def _split_all(dur: np.ndarray, gap_keys: tuple[np.ndarray, np.ndarray], c: _Clusters, bound: np.ndarray,
               max_clusters: int) -> _Clusters:
    """Split each group's worst cluster at its best cut, again and again, until the group is
    within its bound, no cluster has a helpful cut, or it has ``max_clusters`` clusters —
    every group at once: a round picks each open group's worst cluster with segment
    reductions, scores all their candidate cuts coarsely in one call, the chosen pieces
    finely in another, and splices the accepted pieces in. No Python work per group.

    The worst cluster first, not the largest gain: measured on the production workload, chasing
    the largest gain spends rows on small improvements of big compute modes (1.0 KB against
    0.76 KB per rank-step for the same fidelity). A cluster no cut improves is closed and the
    next worst is tried."""
    n_groups = len(bound)
    for _ in range(MAX_ROUNDS):
        g_err = np.bincount(c.group, weights=c.err, minlength=n_groups)
        g_rows = np.bincount(c.group, minlength=n_groups)
        live = (g_err > bound) & (g_rows < max_clusters)
        cand = np.flatnonzero(c.open & live[c.group] & (c.size > 1))
        c.open[c.open & ~live[c.group]] = False
        c.open[c.size < 2] = False
        if cand.size == 0:
            break
        order = np.lexsort((-c.err[cand], c.group[cand]))
        ranked = cand[order]  # by group, worst first
        g = c.group[ranked]
        head = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1]]))
        run = np.diff(np.append(head, len(g)))
        rank = np.arange(len(g)) - np.repeat(head, run)
        e = c.err[ranked]
        before = np.cumsum(e) - e - np.repeat((np.cumsum(e) - e)[head], run)  # error of the worse ones
        # The worst open cluster of each live group, and the next worst too while the group
        # would still be above its bound were every worse one's error gone (worst first needs
        # them as well): several splits per group and round, rows within ``max_clusters``.
        take = (rank == 0) | ((rank < MAX_PICKS) & (rank < (max_clusters - g_rows)[g]) & (g_err[g] - before > bound[g]))
        pick = ranked[take]
        n_pick = np.bincount(c.group[pick], minlength=n_groups)
        cuts, proposals = _propose(dur, gap_keys, c, pick, g_rows[c.group[pick]] + 2 * n_pick[c.group[pick]] <= max_clusters)
        c = _accept(dur, c, pick, cuts, proposals)
    return c


def _propose(dur: np.ndarray, gap_keys: tuple[np.ndarray, np.ndarray], c: _Clusters, pick: np.ndarray,
             two_ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each picked cluster: the best single cut if one lowers its coarse error, else the
    best pair (where the group has room), else nothing. Returns cuts (k × 2, relative to the
    cluster's start; −1 where unused) and whether each pick has a proposal."""
    start, size, err = c.start[pick], c.size[pick], c.err[pick]
    owner, cut = _candidate_cuts(start, size, gap_keys)
    k = len(pick)
    pieces = cluster_w1_sums(dur, np.concatenate([start[owner], start[owner] + cut]),
                             np.concatenate([cut, size[owner] - cut]), CANDIDATE_POINTS, CANDIDATE_TAIL).reshape(2, -1)
    scores = pieces.sum(axis=0)
    first, best, best_at = _segment_argmin(scores, owner, k)
    cuts = np.full((k, 2), -1, np.int64)
    one = np.isfinite(best) & (best < err)
    cuts[one, 0] = cut[best_at[one]]
    need = np.flatnonzero(~one & two_ok)
    if need.size:  # a mode that only two cuts together fit (a few long waits, whose halves fit worse)
        p_owner, ia, ib = _cut_pairs(owner, first, need)
        if p_owner.size:
            ca, cb = cut[ia], cut[ib]
            # The outer pieces of a pair are the left piece of its first cut and the right piece
            # of its second, scored above: only the middle ones are new.
            middle = cluster_w1_sums(dur, start[p_owner] + ca, cb - ca, CANDIDATE_POINTS, CANDIDATE_TAIL)
            scores2 = np.stack([pieces[0, ia], middle, pieces[1, ib]]).sum(axis=0)
            _, best2, at2 = _segment_argmin(scores2, p_owner, k)
            two = np.zeros(k, bool)
            two[need] = np.isfinite(best2[need]) & (best2[need] < err[need])
            cuts[two, 0], cuts[two, 1] = ca[at2[two]], cb[at2[two]]
            one |= two
    return cuts, one


def _accept(dur: np.ndarray, c: _Clusters, pick: np.ndarray, cuts: np.ndarray, proposed: np.ndarray) -> _Clusters:
    """Score the proposed pieces as finely as every cluster, in one call; a split is kept only
    if it lowers the cluster's error, else the cluster is closed."""
    p = np.flatnonzero(proposed)
    c.open[pick[~proposed]] = False
    if p.size == 0:
        return c
    base, size = c.start[pick[p]], c.size[pick[p]]
    bounds = np.column_stack([np.zeros(p.size, np.int64), cuts[p], size])  # k × 4; −1 = unused
    bounds[:, 2] = np.where(bounds[:, 2] < 0, bounds[:, 1], bounds[:, 2])  # one cut: an empty middle piece
    lo, hi = bounds[:, :-1], bounds[:, 1:]
    piece_owner = np.repeat(np.arange(p.size), 3)
    p_lo, p_n = lo.ravel(), (hi - lo).ravel()
    real = p_n > 0
    piece_owner, p_lo, p_n = piece_owner[real], p_lo[real], p_n[real]
    p_start = base[piece_owner] + p_lo
    exact = cluster_w1_sums(dur, p_start, p_n)
    total = np.bincount(piece_owner, weights=exact, minlength=p.size)
    better = total < c.err[pick[p]]
    c.open[pick[p[~better]]] = False
    if not better.any():
        return c
    gone = np.zeros(len(c.start), bool)
    gone[pick[p[better]]] = True
    new = better[piece_owner]
    keep = ~gone
    start = np.concatenate([c.start[keep], p_start[new]])
    order = np.argsort(start, kind="stable")
    return _Clusters(np.concatenate([c.group[keep], c.group[pick[p[piece_owner[new]]]]])[order], start[order],
                     np.concatenate([c.size[keep], p_n[new]])[order], np.concatenate([c.err[keep], exact[new]])[order],
                     np.concatenate([c.open[keep], np.ones(int(new.sum()), bool)])[order])


def _segment_argmin(values: np.ndarray, owner: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over runs of ``owner`` (ascending, ids < k): each run's first index, least value (inf
    where the run is empty) and the index of its first least value (−1 where empty)."""
    counts = np.bincount(owner, minlength=k)
    first = np.cumsum(counts) - counts
    best = np.full(k, np.inf)
    at = np.full(k, -1, np.int64)
    has = counts > 0
    if values.size:
        best[has] = np.minimum.reduceat(values, first[has])
        hit = np.flatnonzero(values <= best[owner])
        o = owner[hit]
        firsts = np.concatenate([[True], o[1:] != o[:-1]])
        at[o[firsts]] = hit[firsts]
    return first, best, at


def _cut_pairs(owner: np.ndarray, first: np.ndarray, need: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair (a < b) of each needing cluster's candidate cuts (runs of ``owner``), thinned
    to at most ``PAIR_CANDIDATES`` evenly spaced ones per cluster: (owner, index of cut a, index
    of cut b), indices into the candidates."""
    counts = np.bincount(owner, minlength=len(first))[need]
    m = np.minimum(counts, PAIR_CANDIDATES)
    ok = m >= 2
    need, counts, m = need[ok], counts[ok], m[ok]
    if need.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    # The m chosen candidates of each cluster (evenly spaced over its sorted cuts).
    sub_owner = np.repeat(np.arange(need.size), m)
    sub_j = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)
    sub_pos = first[need][sub_owner] + (sub_j * counts[sub_owner]) // m[sub_owner]
    # Pairs: for each chosen a, every later b of the same cluster.
    later = m[sub_owner] - 1 - sub_j  # how many b follow a
    pa = np.repeat(np.arange(len(sub_pos)), later)
    pb = pa + 1 + (np.arange(int(later.sum())) - np.repeat(np.cumsum(later) - later, later))
    return need[sub_owner[pa]], sub_pos[pa], sub_pos[pb]


def _gap_keys(values: np.ndarray) -> np.ndarray:
    """Each gap ``values[i+1] − values[i]`` as an int64 that orders like the gap (the float's bits
    with the low ``_POS_BITS`` of the mantissa replaced by the position, earlier ones larger):
    the largest gap of any run and where it is come from one ``np.maximum.reduceat``, without
    gathering the run. Gaps that agree to 28 bits (1 in 2.7·10⁸) tie, and the first is taken."""
    key = np.zeros(max(len(values), 1), np.int64)  # a last 0, so that a run ending at the end can be closed
    body = key[:-1]
    gap = body.view(np.float64)
    np.subtract(values[1:], values[:-1], out=gap)
    np.maximum(gap, 0.0, out=gap)
    body &= ~_POS_MASK
    position = np.arange(len(body), dtype=np.int64)
    position &= _POS_MASK
    np.subtract(_POS_MASK, position, out=position)
    body |= position
    return key


def _largest_gaps(keys: np.ndarray, start: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Cut after the largest gap of each run ``[start, start + size)`` (size ≥ 2), relative to its start."""
    bounds = np.column_stack([start, start + size - 1]).ravel()
    top = np.maximum.reduceat(keys, bounds)[::2]
    return ((_POS_MASK - (top & _POS_MASK) - start) & _POS_MASK) + 1


def _candidate_cuts(start: np.ndarray, size: np.ndarray, gap_keys: tuple[np.ndarray, np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Where each sorted cluster may be cut, as (owner, cut relative to its start), ascending
    per owner: anywhere if it is small, else its largest gaps in ns and in log-ns and a few
    quantiles."""
    small = (size >= 2) & (size <= EVERY_CUT_BELOW)
    s = np.flatnonzero(small)
    n = size[s] - 1
    s_owner = np.repeat(s, n)
    s_cut = 1 + np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    big = np.flatnonzero(size > EVERY_CUT_BELOW)
    if big.size == 0:
        return s_owner, s_cut
    st, sz = start[big], size[big]
    q = (np.asarray(SPLIT_QUANTILES)[None, :] * sz[:, None]).astype(np.int64)
    b_cut = np.sort(np.column_stack([q, *(_largest_gaps(k, st, sz) for k in gap_keys)]), axis=1)
    fresh = np.ones(b_cut.shape, bool)
    fresh[:, 1:] = b_cut[:, 1:] != b_cut[:, :-1]
    fresh &= (b_cut > 0) & (b_cut < sz[:, None])
    b_owner = np.broadcast_to(big[:, None], b_cut.shape)[fresh]
    owner_all, cut_all = np.concatenate([s_owner, b_owner]), np.concatenate([s_cut, b_cut[fresh]])
    order = np.argsort(owner_all, kind="stable")
    return owner_all[order], cut_all[order]
