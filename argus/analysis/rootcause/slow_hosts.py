"""Compute stragglers per-rank tests cannot see: a whole host slower than its peers on other hosts
(case 5), and one rank of a peer pair whose kernel time rose when the job slowed."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from argus.analysis.l2_stragglers import nanmedian
from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State, grade
from argus.analysis.evidence import kernel_time, nic_port_down
from argus.analysis.rootcause.context import WindowAnalysis, _Ctx, _l1_evidence, _rank_list
from argus.analysis.rootcause.impact import _impact, _regression_start
from argus.vocab import GroupKind

__all__ = ["ONSET_BUSY_RATIO", "SLOW_HOST_SHARE", "SLOW_HOST_WINDOWS", "SLOW_HOST_EXPLAINED"]


def _ranks_on_hosts(ctx: _Ctx, hosts: list[str]) -> list[int]:
    return [int(r) for r in np.flatnonzero(np.isin(ctx.topology.hosts.astype(str), hosts))]


def _host_kernel_time(ctx: _Ctx, windows: list[WindowAnalysis], ranks: list[int],
                      steps: list[int], own: set[int] | None = None,
                      threshold: float | None = None) -> dict[int, float] | None:
    """Per rank of ``ranks``: its compute-kernel time over its peers' median (L3), in windows
    overlapping ``steps``; None unless most of them run ≥ ``min_busy_ratio`` × their peers'.

    The peers are those on other hosts where there are any: the question is whether these
    hosts compute slower than the rest, and a host that holds half of each peer set (8 of 16)
    pulls the all-peer median half-way to itself (case 5 at ×2 read as 1.1×: a link). A rank
    whose every peer is on these hosts (the host holds a whole pipeline stage) is compared
    with itself: its kernel time per step against its own before L1's regression began,
    relative to the same change on the ranks of other hosts (a job that slowed everywhere —
    a shared machine, one host only — changes nothing; those ranks are added to ``own``)."""
    ratios: dict[int, list[float]] = defaultdict(list)
    suspects = set(ranks)
    layout = ctx.topology.layout
    start = _regression_start(ctx)
    for w in windows:
        if w.l3 is None or w.hi < steps[0] or w.lo > steps[-1]:
            continue
        total = w.l3.busy_total_ns
        elsewhere: float | None = None  # the other hosts' own change, once needed
        for r in ranks:
            others = [total[int(q)] for q in layout.peer_set(r) if int(q) not in suspects and int(q) in total]
            before = None if others or r not in total or w.lo < start else _own_kernel_time_before(ctx, windows, r)
            if before is not None and elsewhere is None:
                changes = [total[q] / (w.hi - w.lo + 1) / b for q in total if q not in suspects
                           for b in [_own_kernel_time_before(ctx, windows, q)] if b is not None]
                elsewhere = float(np.median(changes)) if changes else np.nan
            if r in total and others and np.median(others) > 0:
                ratios[r].append(total[r] / float(np.median(others)))
            elif before is not None and elsewhere is not None and elsewhere > 0:
                ratios[r].append(total[r] / (w.hi - w.lo + 1) / before / elsewhere)
                if own is not None:
                    own.add(r)
            elif r in w.l3.busy_ratio:
                ratios[r].append(w.l3.busy_ratio[r])
    med = {r: float(np.median(v)) for r, v in ratios.items() if v}
    bar = ctx.config.min_busy_ratio if threshold is None else threshold
    slow = {r: v for r, v in med.items() if v >= bar}
    return slow if ranks and len(slow) >= 0.5 * len(ranks) else None


#: A host whose kernel time rose against the other hosts' by this much exactly when L1's
#: regression began is slow, though below ``min_busy_ratio``: held-out 69116 and 69120 (one
#: host's mlp ×1.25 behind a NIC alarm in a data-parallel job, 5–6% of the job) read 1.11× —
#: and were links. The change at the onset is what a host's natural spread (≈ 1.00 before) lacks.
ONSET_BUSY_RATIO = 1.06


def _host_slow(ctx: _Ctx, windows: list[WindowAnalysis], ranks: list[int], steps: list[int],
               own: set[int] | None = None) -> dict[int, float] | None:
    """:func:`_host_kernel_time`, or — below its bar — the ranks whose kernel time against their
    peers elsewhere rose by ``ONSET_BUSY_RATIO`` from the windows before L1's regression to
    ``steps`` (None without a regression, a window before it, or such a rise on half the ranks)."""
    slow = _host_kernel_time(ctx, windows, ranks, steps, own)
    start = _regression_start(ctx)
    if slow is not None or not np.isfinite(start) or steps[0] < start:
        return slow
    after = _host_kernel_time(ctx, windows, ranks, steps, None, threshold=ONSET_BUSY_RATIO)
    before = _kernel_time_before(ctx, windows, ranks)
    if after is None or not before:
        return None
    rose = {r: v for r, v in after.items() if r in before and v >= ONSET_BUSY_RATIO * before[r]}
    return rose if len(rose) >= 0.5 * len(ranks) else None


def _kernel_time_before(ctx: _Ctx, windows: list[WindowAnalysis], ranks: list[int]) -> dict[int, float]:
    """Per rank of ``ranks``: its kernel time over its peers' on other hosts in the windows before
    L1's regression began (windows' kernel time at their median durations); empty without them."""
    start = _regression_start(ctx)
    layout, suspects = ctx.topology.layout, set(ranks)
    ratios: dict[int, list[float]] = defaultdict(list)
    for w in windows:
        k = w.kernel_time_ns
        if k is None or w.hi >= start:
            continue
        for r in ranks:
            others = [k[int(q)] for q in layout.peer_set(r) if int(q) not in suspects and int(q) in k]
            if r in k and others and np.median(others) > 0:
                ratios[r].append(k[r] / float(np.median(others)))
    return {r: float(np.median(v)) for r, v in ratios.items()}


def _own_kernel_time_before(ctx: _Ctx, windows: list[WindowAnalysis], rank: int) -> float | None:
    """The rank's compute-kernel time per step in the windows that ended before L1's
    regression began (each kernel at its window's median duration: warm-up steps do not
    weigh), or None without a regression or such a window."""
    start = _regression_start(ctx)
    per_step = [w.kernel_time_ns[rank] / (w.hi - w.lo + 1) for w in windows
                if w.kernel_time_ns is not None and w.hi < start and rank in w.kernel_time_ns]
    return float(np.median(per_step)) if per_step and np.median(per_step) > 0 else None


#: A host is slow when this share of its ranks compute ≥ ``min_busy_ratio`` × their peers on
#: other hosts, in this many windows, each of them mostly inside an L1 regression.
SLOW_HOST_SHARE = 0.75


SLOW_HOST_WINDOWS = 2


#: … and their extra kernel time per step is at least this share of what each step lost (L1):
#: a rank waited for does not cost the job more than its extra work (pipelines amplify it, by
#: at most the stages over the microbatches; 1/4 leaves room for that)
SLOW_HOST_EXPLAINED = 0.25


def _slow_hosts(ctx: _Ctx, windows: list[WindowAnalysis], compute: list[Incident]) -> list[Incident]:
    """``compute`` with hosts whose ranks all compute slowly, judged against their peers on
    other hosts, added — each in place of compute incidents that named a few of its ranks (one
    of eight stood out against a peer set half made of its slow host-mates).

    Per-rank comparisons (L2, L3) flag a rank against its whole peer set; a host that holds
    half of every peer set (8 GPUs of a 16-rank data-parallel group) moves the peers' median
    half-way to itself and no rank stands out — case 5 at ×2 was then a NIC alarm's link or
    nothing. The question asked here is the host's: are its ranks slower than the same ranks'
    peers elsewhere, in the windows where the job got slower (an L1 regression measures what
    it cost)?

    Only device kernels (CUPTI) answer it: sampled CPU ops are timed on the ranks' own threads,
    which L2's phases already time, and one sampled step whose core was shared reads 2× (a
    healthy 6-rank CPU job on two cores named a host from it). And the host's extra kernel time
    must explain a material share of what the steps lost (``SLOW_HOST_EXPLAINED``): the same CI
    job read 4.6 ms more kernel time on a host while each step lost 34 ms elsewhere."""
    regressions = [w for w in ctx.l1.windows if w.kind == "regression" and np.isfinite(w.magnitude)]
    if not regressions:
        return compute
    hosts = ctx.topology.hosts.astype(str)
    out = list(compute)
    for host in _candidate_hosts(ctx, windows, regressions, hosts):
        ranks = [int(r) for r in np.flatnonzero(hosts == host)]
        named = {r for inc in compute for r in inc.culprit_ranks}
        if len(named & set(ranks)) >= SLOW_HOST_SHARE * len(ranks):
            continue  # already named as a whole
        flagged: list[WindowAnalysis] = []
        ratios: dict[int, list[float]] = defaultdict(list)
        extra: dict[int, list[float]] = defaultdict(list)  # rank → its extra kernel time per step (s)
        own: set[int] = set()
        for w in windows:
            if w.l3 is None or not _device_window_in_regression(w, regressions):
                continue
            slow = _host_slow(ctx, windows, ranks, [w.lo, w.hi], own)
            if slow is not None and len(slow) >= SLOW_HOST_SHARE * len(ranks):
                flagged.append(w)
                for r, v in slow.items():
                    ratios[r].append(v)
                    total = w.l3.busy_total_ns.get(r, 0.0)
                    extra[r].append(total * (1.0 - 1.0 / v) / 1e9 / (w.hi - w.lo + 1))
        if len(flagged) < SLOW_HOST_WINDOWS:
            continue
        steps = [s for w in flagged for s in range(w.lo, w.hi + 1)]
        lo = min((rg.start_step for rg in regressions if rg.end_step >= steps[0]), default=steps[0])
        steps = sorted(set(range(min(lo, steps[0]), steps[-1] + 1)))
        pct = _impact(ctx, steps)[0]  # the steps' loss: pct % of L1's level, per step
        explained = float(np.median([np.median(v) for v in extra.values()]))
        if not pct > 0 or explained < SLOW_HOST_EXPLAINED * pct / 100.0 * ctx.l1.baseline_s:
            continue
        inc = _masked_compute(ctx, [host], steps, {r: float(np.median(v)) for r, v in ratios.items()}, 0.0, 0.0,
                              own)
        within = [o for o in out if o.klass == IncidentClass.COMPUTE_STRAGGLER and set(o.culprit_ranks) <= set(ranks)]
        if within and max(o.slowdown_pct or 0.0 for o in within) > (inc.slowdown_pct or 0.0):
            inc.slowdown_pct = max(o.slowdown_pct or 0.0 for o in within)  # the same loss, measured there
            inc.gpu_hours_lost = max(o.gpu_hours_lost or 0.0 for o in within)
            inc.severity = max(within, key=lambda o: o.severity_rank).severity
        out = [o for o in out if o not in within] + [inc]
    return out


def _candidate_hosts(ctx: _Ctx, windows: list[WindowAnalysis], regressions: list, hosts: np.ndarray) -> list[str]:
    """The hosts :func:`_slow_hosts` could flag, screened at once for every host: in at least
    ``SLOW_HOST_WINDOWS`` windows, ``SLOW_HOST_SHARE`` of their ranks compute at least the lower
    of its two bars over the median of their peers on other hosts — or cannot be compared so (no
    peer elsewhere, no kernel time: the exact test's fallbacks decide those). A necessary
    condition only: the exact per-host test runs on these, the same verdicts as over every host
    (a Python loop over 1,280 hosts × windows × peers took 20 s at 10,240 ranks)."""
    names, code = np.unique(hosts, return_inverse=True)
    n_ranks = np.bincount(code, minlength=len(names))
    table = ctx.topology.layout.groups(GroupKind.DP)  # every rank's peer set, one row each
    member_host = code[table]
    # groups whose members all sit on different hosts (every group of a large job): a member's
    # peers elsewhere are the others, a median left out of one sort; the rest by a mask
    hs = np.sort(member_host, axis=1)
    shared = (hs[:, 1:] == hs[:, :-1]).any(axis=1)
    elsewhere = member_host[shared][:, :, None] != member_host[shared][:, None, :]  # (group, member, peer)
    bar = min(ctx.config.min_busy_ratio, ONSET_BUSY_RATIO)
    windows_passed = np.zeros(len(names), np.int64)
    for w in windows:
        if w.l3 is None or not _device_window_in_regression(w, regressions):
            continue
        total = np.full(len(hosts), np.nan)
        if w.l3.busy_total_ns:
            keys = np.fromiter(w.l3.busy_total_ns.keys(), np.int64, len(w.l3.busy_total_ns))
            total[keys] = np.fromiter(w.l3.busy_total_ns.values(), np.float64, len(keys))
        own = total[table]
        med = _median_of_others(own)
        if shared.any():  # a rank without peers elsewhere: all-NaN, NaN
            med[shared] = nanmedian(np.where(elsewhere, own[shared][:, None, :], np.nan), keepdims=False)
        with np.errstate(all="ignore"):
            ratio = own / med
        comparable = np.isfinite(own) & np.isfinite(med) & (med > 0)
        passes = np.zeros(len(hosts), bool)
        passes[table.ravel()] = (~comparable | (ratio >= bar)).ravel()
        share = np.bincount(code, weights=passes, minlength=len(names))
        windows_passed += share >= SLOW_HOST_SHARE * n_ranks
    return sorted(str(h) for h in names[windows_passed >= SLOW_HOST_WINDOWS])


def _median_of_others(values: np.ndarray) -> np.ndarray:
    """Per row of ``values`` (groups × members) and member: the median of the row's other
    values, NaN left out (NaN where none is left) — ``nanmedian`` of the row with that member
    masked, to the bit, from one sort of the row instead of a (groups, members, members) array
    (102,400 rows of 200 a window at 102,400 ranks)."""
    G, M = values.shape
    order = np.argsort(values, axis=1, kind="stable")  # NaN last
    s = np.take_along_axis(values, order, axis=1)
    n = (~np.isnan(values)).sum(axis=1, keepdims=True)  # non-NaN values per row
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(M)[None, :], axis=1)  # each member's place in its row's sort
    own_nan = np.isnan(values)
    k = np.where(own_nan, n, n - 1)  # values left for each member
    lo, hi = np.maximum((k - 1) // 2, 0), np.maximum(k // 2, 0)
    # the i-th value without the member at sorted place p is s[i] below p, s[i + 1] from p on
    # (a NaN member sits past every value: nothing shifts)
    lo_i = np.where(own_nan | (lo < pos), lo, lo + 1)
    hi_i = np.where(own_nan | (hi < pos), hi, hi + 1)
    rows = np.arange(G)[:, None]
    med = 0.5 * (s[rows, np.minimum(lo_i, M - 1)] + s[rows, np.minimum(hi_i, M - 1)])
    return np.where(k > 0, med, np.nan)


def _device_window_in_regression(w: WindowAnalysis, regressions: list) -> bool:
    """A window with device kernels (L3), mostly inside one of L1's regressions."""
    inside = sum(1 for s in range(w.lo, w.hi + 1) for rg in regressions if rg.start_step <= s <= rg.end_step)
    return w.l3 is not None and w.l3.device and inside >= 0.5 * (w.hi - w.lo + 1)


def _slow_in_pairs(ctx: _Ctx, windows: list[WindowAnalysis], compute: list[Incident]) -> list[Incident]:
    """``compute`` with ranks of peer *pairs* whose kernel time rose against their one peer's
    when L1's regression began, added.

    With one peer, no per-rank test can tell the slow one from the fast (tp=8 × dp=2 on two
    hosts: every rank's peer set is itself and one other), and a GPU that heated up and fell to
    ×1.25 by the end was "no incident: every rank matches its peers'" while the job ran 17%
    slower (held-out 69122). Time breaks the tie: the one whose share of the pair's kernel time
    rose by ``ONSET_BUSY_RATIO`` from the windows before the regression, in
    ``SLOW_HOST_WINDOWS`` windows inside it, with extra kernel time explaining
    ``SLOW_HOST_EXPLAINED`` of the loss. Device kernels only, as for hosts."""
    start = _regression_start(ctx)
    if not np.isfinite(start):
        return compute
    regressions = [w for w in ctx.l1.windows if w.kind == "regression" and np.isfinite(w.magnitude)]
    named = {r for inc in compute if inc.severity != Severity.INFO for r in inc.culprit_ranks}
    layout = ctx.topology.layout
    out = list(compute)
    for r in range(layout.world_size):
        if r in named or not ctx.pair(r):
            continue
        peers = [int(q) for q in layout.peer_set(r) if int(q) != r]
        if len(peers) != 1:
            continue
        q = peers[0]
        before: list[float] = []
        after: list[tuple[WindowAnalysis, float, float]] = []
        for w in windows:
            k = w.kernel_time_ns
            if k is None or r not in k or q not in k or k[q] <= 0:
                continue
            if w.hi < start:
                before.append(k[r] / k[q])
                continue
            if not _device_window_in_regression(w, regressions):
                continue
            after.append((w, k[r], k[q]))
        if not before or not after:
            continue
        base = float(np.median(before))
        # (window, ratio to the peer, extra kernel time per step beyond the share it had before)
        # … and slower than the peer now, not just less fast than in a noisy warm-up window
        rose = [(w, kr / kq, (kr - base * kq) / 1e9 / (w.hi - w.lo + 1)) for w, kr, kq in after
                if kr / kq >= ONSET_BUSY_RATIO * max(base, 1.0)]
        if len(rose) < SLOW_HOST_WINDOWS:
            continue
        steps = sorted({s for w, _, _ in rose for s in range(w.lo, w.hi + 1)})
        steps = list(range(min(min(rg.start_step for rg in regressions), steps[0]), steps[-1] + 1))
        pct, gpuh, _ = _impact(ctx, steps)
        explained = float(np.median([e for _, _, e in rose]))
        if not pct > 0 or explained < SLOW_HOST_EXPLAINED * pct / 100.0 * ctx.l1.baseline_s:
            continue
        host = str(ctx.topology.hosts[r])
        last = rose[-1][1]
        evidence = _l1_evidence(ctx, steps[0], steps[-1])
        evidence += [kernel_time(r, round(v, 3), "compute-kernel time over its one peer's", peer=q,
                                 window=[w.lo, w.hi]) for w, v, _ in rose[:6]]
        evidence.append(kernel_time(r, round(base, 3), "the same, before the job slowed", peer=q))
        summary = (f"rank {r} on {host} computes slowly: its kernels went from {base:.2f}× its only peer's (rank {q}) "
                   f"to {last:.2f}× as the job slowed")
        out.append(Incident(IncidentClass.COMPUTE_STRAGGLER, [r], [host], ctx.gpus_of([r]), steps[0], steps[-1],
                            "compute", [], State.SUSPECTED, grade(pct), pct, gpuh, Action.VERIFY, evidence, steps,
                            summary))
    return out


def _host_kernel_time_known(windows: list[WindowAnalysis], ranks: list[int]) -> bool:
    """Whether L3 measured these ranks' kernel time at all (no kernels: no verdict on compute)."""
    return any(w.l3 is not None and any(r in w.l3.busy_ratio for r in ranks) for w in windows)


def _masked_compute(ctx: _Ctx, hosts: list[str], steps: list[int], ratios: dict[int, float], explained_s: float,
                    lost_s: float, own: set[int] | None = None) -> Incident:
    """``own``: ranks judged against their own kernel time before the slowdown (their host
    holds every peer they have), not against peers on other hosts."""
    ranks = sorted(ratios)
    own = set(own or ()) & set(ranks)
    pct, gpuh, _ = _impact(ctx, steps)
    evidence = _l1_evidence(ctx, steps[0], steps[-1])
    evidence += [kernel_time(r, round(v, 3), "compute-kernel time over its own before the slowdown (every peer on "
                             "this host)" if r in own else "compute-kernel time over the peers' median on other hosts")
                 for r, v in sorted(ratios.items())[:8]]
    nic = sorted(r for r in ctx.hw.nic_down if str(ctx.topology.hosts[r]) in hosts)
    if nic:
        evidence.append(nic_port_down(nic[:8], f"transfers explain {1e3 * explained_s:.1f} ms of the "
                                               f"{1e3 * lost_s:.0f} ms each step lost: the alarm is not the cause"))
    summary = (f"{len(ranks)} rank{'s' * (len(ranks) > 1)} ({_rank_list(ranks)}) on {', '.join(hosts)} compute "
               f"slowly: kernels {float(np.median(list(ratios.values()))):.2f}× "
               + ("their own before the slowdown (the host holds their every peer)" if own == set(ranks) else
                  "their peers' on other hosts" if not own else "their peers' on other hosts, or their own before")
               + ("; a NIC alarm there, but their transfers explain little of the loss" if nic else ""))
    return Incident(IncidentClass.COMPUTE_STRAGGLER, ranks, hosts, ctx.gpus_of(ranks), steps[0], steps[-1], "compute",
                    [], State.SUSPECTED, grade(pct), pct, gpuh, Action.VERIFY, evidence, steps, summary)
