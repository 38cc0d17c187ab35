"""L3: degraded kernels, from the per-window kernel summaries.

For each kernel (and stream), every rank's distribution is rebuilt from its KDE summary (a
truncated log-normal mixture) on one log grid; each rank is compared with the pointwise
median CDF of its peer group by W₁ — O(n) per kernel, so 10,000 ranks cost little. A rank is
an outlier above the group's IQR fence (Q3 + 1.5·IQR) when the distance is also a real
effect (a minimum share of the kernel's duration and an absolute floor): compute kernels
that are *slower* than the peers point at the GPU.

Communication kernels in synchronous training mostly measure waiting, so single ranks are
not blamed on them. Instead, L3 looks for a **group-level shift**: ranks partitioned by a
group kind (tp, ep, dp, edp, pp) or by host; when a few groups' members are all shifted
together (small spread inside them, large between them), the shared link is the suspect.
Intersecting the hosts of the shifted groups over several kernels narrows the culprit down
(e.g. dp groups say "hosts 0–3", pipeline send/recv says "hosts 0, 1, 4, 5": hosts 0 and 1).
This runs on every window, not only on L1/L2 triggers: a link slow from the first step
never makes a spike.
"""

from __future__ import annotations

import math

import warnings

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from argus.analysis.frames import encode
from argus.analysis.strata import center_within, group_strata
from argus.compress import log_grid, mixture_cdf, w1, w1_matrix
from argus.topology import Layout
from argus.vocab import GroupKind, KernelKind, PhaseCategory, kernel_group
from argus.uniques import small_unique_inverse, sorted_unique

__all__ = ["CollectiveCalls", "GroupShift", "KernelOutlier", "L3Config", "L3Result", "collective_calls",
           "detect_kernels", "kernel_time_per_rank", "kinds_for", "w1_matrix_for"]


@dataclass(frozen=True, slots=True)
class L3Config:
    min_effect: float = 0.10  # W₁ at least this share of the peer median's mean duration
    min_w1_ns: float = 2_000.0  # and at least 2 µs
    fence: float = 1.5  # IQR fence multiplier
    grid: int = 96  # log-spaced points for detection (display matrices use finer grids)
    shift_effect: float = 0.3  # a shifted group's transfer floor is ≥ 30% above the others'
    shift_separation: float = 4.0  # … and this many robust spreads of the group floors
    max_shifted_share: float = 0.5  # a shift concerns a minority of the groups


#: The communicator kinds a layout defines, whose groups can be compared with their like.
LAYOUT_KINDS: tuple[GroupKind, ...] = (GroupKind.TP, GroupKind.EP, GroupKind.DP, GroupKind.EDP, GroupKind.PP,
                                       GroupKind.CP)

#: In a peer set of three, a rank is an outlier when its W₁ to the peers' median CDF is this many
#: times the larger of the other two (which measure the healthy spread; the effect gates below
#: still apply).
FEW_PEERS_RATIO = 3.0


@dataclass
class KernelOutlier:
    rank: int
    kernel: str
    stream: int
    category: str
    w1_ns: float
    rel: float  # W₁ / peer mean duration
    slower: bool  # the rank's mean duration is above the peers'
    peer_kind: str
    launches_ratio: float = 1.0  # the rank's launches of this kernel / the peers' median
    extra_ns: float = 0.0  # time the rank spent in this kernel beyond its peers' typical, over the window

    @staticmethod
    def by_cost(outliers: list[KernelOutlier]) -> list[KernelOutlier]:
        """Most attributable time first: what the report shows and the incident names (the
        kernel that slowed 6× and costs 30 ms a step, before an embedding that moved 2× and
        costs 5 µs)."""
        return sorted(outliers, key=lambda o: (-o.extra_ns, -o.rel))

    @property
    def more_work(self) -> bool:
        return self.launches_ratio >= 1.3

    def to_json(self) -> dict:
        return {"rank": self.rank, "kernel": self.kernel, "stream": self.stream, "category": self.category,
                "w1_ns": round(self.w1_ns, 1), "rel": round(self.rel, 4) if math.isfinite(self.rel) else None, "slower": self.slower,
                "launches_ratio": round(self.launches_ratio, 3), "extra_ms": round(self.extra_ns / 1e6, 4),
                "peers": self.peer_kind}


@dataclass
class GroupShift:
    kernel: str
    stream: int
    op: str
    group_kind: str
    ranks: list[int]  # members of the shifted groups
    hosts: list[str]
    shift_rel: float  # how much longer the shifted groups' transfer floor is (0.5: 50% longer)
    within_rel: float  # robust spread of the group floors (log units)
    extra_ns_per_event: float  # how much longer the shifted groups' fastest events are
    #: compared across pipeline stages (which may move other sizes): it narrows the hosts of
    #: a like-with-like finding down, never stands alone
    narrow_only: bool = False

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "stream": self.stream, "op": self.op, "group_kind": self.group_kind,
                "ranks": self.ranks[:64], "n_ranks": len(self.ranks), "hosts": self.hosts,
                "shift_rel": round(self.shift_rel, 4), "within_rel": round(self.within_rel, 4),
                "extra_ns_per_event": round(self.extra_ns_per_event, 1), "narrow_only": self.narrow_only}


@dataclass
class L3Result:
    window: int
    start_step: int
    end_step: int
    outliers: list[KernelOutlier] = field(default_factory=list)
    shifts: list[GroupShift] = field(default_factory=list)
    events_per_step: dict[tuple[str, int], float] = field(default_factory=dict)  # (kernel, stream) → per rank
    busy_ratio: dict[int, float] = field(default_factory=dict)  # rank → total compute-kernel time / peers' median
    busy_excess_s: dict[int, float] = field(default_factory=dict)  # rank → … minus the peers' median, per step (s)
    busy_total_ns: dict[int, float] = field(default_factory=dict)  # rank → its total compute-kernel time in the window
    #: the compute time is the device's (CUPTI kernels), not sampled CPU ops: those are timed on
    #: the ranks' own threads, one step in several, and a shared core stretches them
    device: bool = False
    #: communication kernels no layout communicator launches as often: (kernel, stream, op,
    #: launches per rank-step) — a group of a kind of its own, with no peer of that kind to judge it by
    unjudged: list[tuple[str, int, str, float]] = field(default_factory=list)


#: What L3 reads of a window's ``kernel_summaries``: these columns, the strings as dictionaries
#: (1.3 M kernel names of a few hundred values a window at 10,240 ranks).
L3_STRINGS = ("kernel", "category", "op")
L3_COLUMNS = ["rank", "stream", "count", "p50_ns", "p99_ns", "min_ns", "max_ns", *L3_STRINGS]


def _rank_cdfs(rows: dict[str, np.ndarray], grid: np.ndarray, world: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CDF per rank present (R, G), the ranks, and each rank's mean duration."""
    ranks, dist = small_unique_inverse(rows["rank"])
    cdf = mixture_cdf(grid, dist, rows["count"], rows["p50_ns"], rows["p99_ns"], n_dist=len(ranks),
                      lo=rows["min_ns"], hi=rows["max_ns"], dtype=np.float32)
    # mean of a truncated component ≈ its median for tight clusters; weighted by counts
    w = rows["count"].astype(np.float64)
    mean = np.bincount(dist, weights=w * rows["p50_ns"], minlength=len(ranks)) / np.bincount(
        dist, weights=w, minlength=len(ranks))
    return cdf, ranks, mean


def detect_kernels(summaries: pa.Table, layout: Layout, hosts: np.ndarray, window: int, start_step: int,
                   end_step: int, calls: list[CollectiveCalls] | None = None,
                   config: L3Config = L3Config()) -> L3Result:
    """L3 over one window's ``kernel_summaries`` rows. ``calls``: the window's collective phases
    (:func:`collective_calls`), to tell which communicator ran each kernel."""
    res = L3Result(window, start_step, end_step)
    if summaries.num_rows == 0:
        return res
    # numbers as arrays; the name columns as dictionary codes (a kernel's rows share one name,
    # category and op: an object array of a million strings costs more than the CDFs)
    cols = {c: summaries.column(c).to_numpy(zero_copy_only=False) for c in
            ("rank", "stream", "count", "p50_ns", "p99_ns", "min_ns", "max_ns")}
    text = {c: _codes(summaries.column(c)) for c in ("kernel", "category", "op")}
    n_steps = max(end_step - start_step + 1, 1)
    res.busy_ratio, excess, res.busy_total_ns = _busy_ratio(cols, text["category"], layout)
    res.busy_excess_s = {r: v / 1e9 / n_steps for r, v in excess.items()}
    codes, cats = text["category"]
    res.device = bool(np.isin(codes, np.flatnonzero(cats == PhaseCategory.COMPUTE)).any())
    # one integer key per (kernel, stream) and one sort: each kernel's rows are a slice, not a
    # string comparison over every row of the window
    kid, kernels = text["kernel"]
    streams, sid = small_unique_inverse(cols["stream"])
    key = kid.astype(np.int64) * len(streams) + sid
    order = np.argsort(key, kind="stable")
    key = key[order]
    bounds = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    first = order[bounds[:-1]]
    names = kernels[kid[first]]
    by_key = {c: v[order] for c, v in cols.items()}  # each kernel's rows a slice (one gather, not one a kernel)
    for b in np.argsort(np.char.add(names, np.char.add("|", cols["stream"][first].astype(str)))):
        rows = {c: v[bounds[b]:bounds[b + 1]] for c, v in by_key.items()}
        kernel, stream = str(names[b]), int(rows["stream"][0])
        category, op = (str(text[c][1][text[c][0][first[b]]]) for c in ("category", "op"))
        ranks = sorted_unique(rows["rank"])
        res.events_per_step[(kernel, stream)] = float(rows["count"].sum()) / len(ranks) / n_steps
        if len(ranks) < 3:
            continue
        if category == PhaseCategory.COMM:  # only the floors matter: no CDFs
            floor = np.full(len(ranks), np.inf)
            np.minimum.at(floor, np.searchsorted(ranks, rows["rank"]), rows["min_ns"])
            tagged = kernel_group(kernel)  # the communicator's kind, where the trace named it
            kinds = ((tagged,) if tagged in LAYOUT_KINDS else ()) if tagged is not None else \
                tuple(k for k in kinds_for(op, res.events_per_step[(kernel, stream)], calls) if k in LAYOUT_KINDS)
            if not kinds:
                res.unjudged.append((kernel, stream, op, res.events_per_step[(kernel, stream)]))
                continue
            shift = _group_shift(ranks, floor, layout, hosts, kernel, stream, op, kinds, config)
            if shift is not None:
                res.shifts.append(shift)
            elif layout.pp > 1:  # a whole stage's groups shifted alike: only the other stages show it
                shift = _group_shift(ranks, floor, layout, hosts, kernel, stream, op, kinds, config, by_stage=False)
                if shift is not None:
                    shift.narrow_only = True
                    res.shifts.append(shift)
        else:
            grid = log_grid(max(float(rows["min_ns"].min()) * 0.9, 1.0), float(rows["max_ns"].max()) * 1.1,
                            config.grid)
            cdf, ranks, mean = _rank_cdfs(rows, grid, layout.world_size)
            counts = np.bincount(np.searchsorted(ranks, rows["rank"]), weights=rows["count"], minlength=len(ranks))
            res.outliers += _outliers(cdf, ranks, mean, counts, grid, layout, kernel, stream, category, config)
            res.outliers += _more_launches(rows, ranks, mean, layout, kernel, stream, category, config)
    return res


def _peer_table(ranks: np.ndarray, layout: Layout, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Position of each present rank and its group (of ``kind``) index, for grouping rows."""
    return layout.group_index(kind)[ranks], np.arange(len(ranks))


def _by_size(inv: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Groups of equal size together: per size, (the groups, their members as a (groups, size)
    matrix of row indices, each group's ascending). One vectorised call per size, not one per
    group: 512 data-parallel groups of 20 ranks at 10,240 ranks were 20,000 small medians a window."""
    sizes = np.bincount(inv)
    order = np.argsort(inv, kind="stable")
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    out = []
    for n in sorted_unique(sizes[sizes > 0]).tolist():
        groups = np.flatnonzero(sizes == n)
        out.append((groups, order[starts[groups][:, None] + np.arange(n)]))
    return out


def _outliers(cdf, ranks, mean, counts, grid, layout: Layout, kernel, stream, category,
              config: L3Config) -> list[KernelOutlier]:
    kind = GroupKind.DP
    gid, _ = _peer_table(ranks, layout, kind)
    _, inv = np.unique(gid, return_inverse=True)
    parts = _by_size(inv)
    med_cdf = np.empty((int(inv.max()) + 1, cdf.shape[1]))
    peer_mean = np.empty(med_cdf.shape[0])
    for groups, members in parts:  # pointwise median CDF and median mean duration per group
        med_cdf[groups] = np.median(cdf[members], axis=1)
        peer_mean[groups] = np.median(mean[members], axis=1)
    dist = w1(cdf, med_cdf[inv], grid)
    peer_mean = peer_mean[inv]
    flagged = []
    for _, members in parts:
        if members.shape[1] < 3:
            continue
        d = dist[members]
        if members.shape[1] == 3:
            # Tukey's fence cannot flag one of three values (Q3 sits halfway to the largest): the
            # one far from the median CDF while both others sit close to it stands out
            others = np.stack([np.delete(d, i, axis=1).max(axis=1) for i in range(3)], axis=1)
            flag = d > FEW_PEERS_RATIO * others
        else:
            q1, q3 = np.percentile(d, [25, 75], axis=1)
            flag = d > (q3 + config.fence * (q3 - q1))[:, None]
            # a quarter or more of the peers slow (a host holding 2 of a stage's 6 ranks) puts Q3
            # among them and the fence above them all: a minority far from the median CDF while
            # the rest sit close to it stands out the way one of three does
            far = d > FEW_PEERS_RATIO * np.median(d, axis=1)[:, None]
            flag |= far & (far.sum(axis=1) < 0.5 * members.shape[1])[:, None]
        m = members[flag]
        flagged.append(m[(dist[m] >= config.min_w1_ns) & (dist[m] >= config.min_effect * peer_mean[m])])
    out = []
    if flagged:
        hit = np.concatenate(flagged)
        for m in hit[np.lexsort((hit, inv[hit]))].tolist():  # by group, then rank: the order it was read in
            out.append(KernelOutlier(int(ranks[m]), kernel, stream, category, float(dist[m]),
                                     # peers that spent no time in it: no ratio to state
                                     float(dist[m] / peer_mean[m]) if peer_mean[m] > 0 else math.inf,
                                     bool(mean[m] > peer_mean[m]), kind,
                                     extra_ns=float(max(mean[m] - peer_mean[m], 0.0) * counts[m])))
    return out


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A string column as (codes, the strings they index; a null is ""). A dictionary column's
    chunks are mapped onto one vocabulary by their own small dictionaries (filling its nulls or
    combining its chunks costs more than decoding the strings did)."""
    if not pa.types.is_dictionary(col.type):
        codes, vocab = encode(col.fill_null(""))
        return codes, np.asarray(vocab, dtype=str)
    at: dict[str, int] = {}
    parts = []
    for chunk in col.chunks:
        local = np.array([at.setdefault("" if v is None else v, len(at)) for v in chunk.dictionary.to_pylist()]
                         + [at.setdefault("", len(at))], np.int32)  # the last: a null's
        idx = chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False) if chunk.null_count else \
            chunk.indices.to_numpy(zero_copy_only=False)
        parts.append(local[idx])  # -1: the null's entry
    return (np.concatenate(parts) if parts else np.empty(0, np.int32)), np.asarray(list(at), dtype=str)


def kernel_time_per_rank(summaries: pa.Table, layout: Layout) -> dict[int, float]:
    """Each rank's compute-kernel time in a window's summaries (Σ count × p50, ns): cheap, and
    meaningful where the full L3 is not run (a warm-up window: each kernel at its median)."""
    if summaries.num_rows == 0:
        return {}
    cols = {c: summaries.column(c).to_numpy(zero_copy_only=False) for c in ("rank", "count", "p50_ns")}
    return _busy_ratio(cols, _codes(summaries.column("category")), layout)[2]


def _busy_ratio(cols: dict[str, np.ndarray], category: tuple[np.ndarray, np.ndarray],
                layout: Layout) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Each rank's total compute-kernel time (Σ count × p50) over its peer set's median (the
    faster one of a pair): a slow device or extra work raises it; noise scattered over
    individual kernels cancels out."""
    codes, cats = category
    compute = np.isin(codes, np.flatnonzero(np.isin(cats, [PhaseCategory.COMPUTE, KernelKind.CPU_OP])))
    if not compute.any():
        return {}, {}, {}
    rank = cols["rank"][compute].astype(np.int64)
    total = np.bincount(rank, weights=(cols["count"] * cols["p50_ns"])[compute], minlength=layout.world_size)
    present = np.bincount(rank, minlength=layout.world_size) > 0
    groups = layout.groups(GroupKind.DP)
    vals = np.where(present, total, np.nan)[groups]
    with warnings.catch_warnings():  # a group none of whose ranks is present (a partial store) has no reference: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        if groups.shape[1] == 2:  # a pair: the faster one is the reference (faults only add time)
            med = np.nanmin(vals, axis=1, keepdims=True) if np.isfinite(vals).any() else vals
        else:
            med = np.nanmedian(vals, axis=1, keepdims=True) if np.isfinite(vals).any() else vals
    ratio = np.full(layout.world_size, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio[groups] = vals / med
    ranks = np.flatnonzero(present & np.isfinite(ratio))
    excess = np.full(layout.world_size, np.nan)
    excess[groups] = vals - med  # ns over the window
    return (dict(zip(ranks.tolist(), ratio[ranks].tolist())), dict(zip(ranks.tolist(), excess[ranks].tolist())),
            dict(zip(ranks.tolist(), total[ranks].tolist())))


def _more_launches(rows, ranks, mean, layout: Layout, kernel, stream, category, config: L3Config) -> list[KernelOutlier]:
    """Ranks that launch a kernel ≥ 1.3× as often as their peers, at material cost: more work
    (e.g. an imbalanced shard, a repeated computation) rather than slower work."""
    counts = np.bincount(np.searchsorted(ranks, rows["rank"]), weights=rows["count"], minlength=len(ranks))
    _, inv = np.unique(layout.group_index(GroupKind.DP)[ranks], return_inverse=True)
    hits: list[tuple[int, int, float, float]] = []  # (group, member, ratio, extra): the groups of one size at once, each a row
    for groups, members in _by_size(inv):
        if members.shape[1] < 3:
            continue
        c = counts[members]
        med = np.median(c, axis=1)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = c / med
        extra_ns = (c - med) * mean[members]
        gi, j = np.nonzero((med > 0) & (ratio >= 1.3) & (extra_ns >= config.min_w1_ns * med))
        hits += zip(groups[gi].tolist(), members[gi, j].tolist(), ratio[gi, j].tolist(), extra_ns[gi, j].tolist())
    return [KernelOutlier(int(ranks[m]), kernel, stream, category, 0.0, 0.0, False, GroupKind.DP, r_, e)
            for _, m, r_, e in sorted(hits)]  # by group, then rank


def _group_shift(ranks, floor, layout: Layout, hosts, kernel, stream, op, kinds: tuple[str, ...],
                 config: L3Config, by_stage: bool = True) -> GroupShift | None:
    """The partition (group kind or host) in which a minority of groups is shifted as a whole.

    Compared is each group's **floor**: its fastest event of the window. In every collective
    one member arrives last and moves data without waiting, so a group's fastest event is its
    transfer time, whatever its members' positions in the schedule. Transfer time changes
    only with the links a group crosses; a straggler does not raise it (the straggler itself
    is the member that arrives last). Only the group kinds that run this collective are
    tried (``kinds``): in any other partition a group's members do not share instances and
    its floor still contains waiting."""
    best = None
    partitions = {kind: layout.group_index(kind)[ranks] for kind in kinds
                  if kind in LAYOUT_KINDS and layout.group_size(kind) > 1}
    min_shift = np.log1p(config.shift_effect)
    for kind, gid in partitions.items():
        ug, inv = np.unique(gid, return_inverse=True)
        if len(ug) < 3:
            continue
        gfloor = np.full(len(ug), np.inf)
        np.minimum.at(gfloor, inv, floor)
        # like with like: a group's floor against those of its own stage (strata.py); a group
        # alone in its stage has nothing to be compared with
        strata = group_strata(layout, kind)[ug] if by_stage else np.zeros(len(ug), np.int64)
        v, size = center_within(np.log(np.maximum(gfloor, 1.0)), strata)
        idx = np.flatnonzero(size >= 2)
        if idx.size < 3:
            continue
        v = v[idx]
        center = float(np.quantile(v, 0.25))  # faults only lengthen transfers: the low side is healthy
        low = v[v <= np.median(v)]
        spread = 1.4826 * float(np.median(np.abs(low - np.median(low)))) + 1e-3
        shift = v - center
        hit = np.flatnonzero((shift >= min_shift) & (shift >= config.shift_separation * spread))
        if hit.size == 0 or hit.size > config.max_shifted_share * idx.size:
            continue
        score = float(np.median(shift[hit])) / spread
        if best is None or score > best[0]:
            shifted = idx[hit]
            members = np.flatnonzero(np.isin(inv, shifted))
            extra = float(np.median(gfloor[shifted] * -np.expm1(-shift[hit])))  # above their stage's healthy floor
            best = (score, kind, members, float(np.expm1(np.median(shift[hit]))), spread, extra)
    if best is None:
        return None
    _, kind, members, shift_rel, within, extra = best
    member_ranks = ranks[members]
    return GroupShift(kernel, stream, op, kind, sorted(int(r) for r in member_ranks),
                      sorted({str(h) for h in np.asarray(hosts)[member_ranks]}), shift_rel, within, extra)


#: Phase-name words that identify the op a collective phase launches.
_OP_WORDS = {"reduce_scatter": ("reduce-scatter", "reduce_scatter", "reducescatter"),
             "all_gather": ("allgather", "all-gather", "all_gather"),
             "all_reduce": ("allreduce", "all-reduce", "all_reduce", "barrier"),
             "send_recv": ("send", "recv", "alltoall", "all-to-all", "all_to_all"),
             "all_to_all": ("alltoall", "all-to-all", "all_to_all"),
             "broadcast": ("broadcast",)}


@dataclass(frozen=True)
class CollectiveCalls:
    """One collective phase as the framework saw it: its op, group kind and calls per rank-step."""

    op: str
    group_kind: str
    per_rank_step: float


def collective_calls(names: list[str], groups: list[str], per_rank_step: list[float]) -> list[CollectiveCalls]:
    """Collective phases (name, group kind, calls per rank-step) → op-level call rates, summed
    per (op, group kind): pp-send and pp-recv both launch SendRecv kernels on one stream."""
    acc: dict[tuple[str, str], float] = {}
    for name, group, rate in zip(names, groups, per_rank_step):
        low = name.lower()
        for op, words in _OP_WORDS.items():
            if group and any(w in low for w in words):
                acc[(op, group)] = acc.get((op, group), 0.0) + float(rate)
                break
    return [CollectiveCalls(op, g, r) for (op, g), r in acc.items()]


def kinds_for(op: str, events_per_rank_step: float, calls: list[CollectiveCalls] | None) -> tuple[str, ...]:
    """Group kinds whose collective phases launch as many kernels of ``op`` per rank-step as
    this kernel has (NCCL runs one kernel per call); all kinds when nothing is known."""
    every = LAYOUT_KINDS
    if not calls:
        return every
    alias = {"send_recv": ("send_recv", "all_to_all"), "all_to_all": ("all_to_all", "send_recv")}.get(op, (op,))
    same_op = [c for c in calls if c.op in alias]
    match = [c.group_kind for c in same_op
             if abs(c.per_rank_step - events_per_rank_step) <= 0.25 * max(c.per_rank_step, 1.0)]
    if match:
        return tuple(sorted(set(match)))
    # No layout communicator launches this op as often: the kernel belongs to a group of its own
    # kind (Megatron's MODEL_PARALLEL grad-norm all-reduce over tp×pp, an embedding group…).
    # Judged as the "closest" kind it was split along groups it does not run in, and those
    # groups' floors compared (an 8- and a 16-rank communicator "tp" in a tp=4 job): not judged.
    return () if same_op or calls else every


def w1_matrix_for(summaries: pa.Table, kernel: str, stream: int, ranks: list[int], points: int = 256) -> np.ndarray:
    """Full pairwise W₁ matrix of one kernel over the given ranks — O(n²), for display only."""
    import pyarrow.compute as pc

    t = summaries.filter(pc.and_(pc.equal(summaries.column("kernel"), kernel), pc.equal(summaries.column("stream"), stream)))
    t = t.filter(pc.is_in(t.column("rank"), pa.array(ranks, pa.int32())))
    rows = {c: t.column(c).to_numpy() for c in ("rank", "count", "p50_ns", "p99_ns", "min_ns", "max_ns")}
    grid = log_grid(max(float(rows["min_ns"].min()) * 0.9, 1.0), float(rows["max_ns"].max()) * 1.1, points)
    cdf, present, _ = _rank_cdfs(rows, grid, 0)
    if len(present) != len(set(ranks)):
        raise ValueError("some ranks have no summary of this kernel")
    return w1_matrix(cdf.astype(np.float64), grid)
