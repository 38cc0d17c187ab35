"""Compute stragglers and pipeline imbalance: ranks whose busy time (L2) or compute kernels (L3)
are persistently above their peers'; one slow pass is ``pipeline_imbalance``."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State, grade
from argus.analysis.l2_stragglers import Finding
from argus.analysis.l3_kernels import KernelOutlier
from argus.analysis.evidence import busy_outlier, late_arrival, nic_port_down, thermal_throttle, w1_matrix, w1_outlier
from argus.analysis.rootcause.context import WindowAnalysis, _Ctx, _l1_evidence
from argus.analysis.rootcause.impact import _impact, _regression_covering


_STEP_LEVEL = ("optimizer", "dataloader")


def _block(name: str) -> str | None:
    low = name.lower()
    if "backward" in low or low.endswith("-bwd") and "compute" in low:
        return "bwd"
    if "forward" in low:
        return "fwd"
    return None


def _base(name: str) -> str:
    return name[:-4] if name.endswith("-bwd") else name


def _compute(ctx: _Ctx, windows: list[WindowAnalysis]) -> list[Incident]:
    per_rank: dict[int, dict] = defaultdict(lambda: {"windows": set(), "busy": [], "l3": [], "arrival": [],
                                                     "ratios": defaultdict(list), "stalled": False,
                                                     "kernel_excess": []})
    kernels_normal: set[int] = set()  # ranks whose long work ran with normal kernels where they were measured
    unmeasured: dict[int, int] = defaultdict(int)  # … windows where only their phases said so (L3 could not run)
    for w in windows:
        busy: dict[int, list[Finding]] = defaultdict(list)
        for f in w.l2.findings:
            if f.kind == "busy" and f.persistent and f.category == "compute":
                busy[f.rank].append(f)
        slow = defaultdict(list)
        busy_ratio = w.l3.busy_ratio if w.l3 else {}
        for o in (w.l3.outliers if w.l3 else []):
            if ((o.slower or o.more_work) and o.category in ("compute", "cpu_op")
                    and busy_ratio.get(o.rank, 0.0) >= ctx.config.min_busy_ratio):
                slow[o.rank].append(o)
        if w.l3 is not None:  # kernels measured: busy time with normal kernels is the host's (a stall)
            # … except in peer pairs, where no per-kernel outlier test exists: the total decides
            kept = {r: f for r, f in busy.items() if r in slow or (
                ctx.pair(r) and busy_ratio.get(r, 0.0) >= ctx.config.min_busy_ratio)}
            kernels_normal |= set(busy) - set(kept)
            busy = kept
        else:
            for r in busy:
                unmeasured[r] += 1
        arrival = {f.rank: f for f in w.l2.findings if f.kind == "arrival" and f.persistent}
        # device kernels alone can name a compute straggler (GPU phases are timed on the host and
        # blur); CPU ops cannot: on CPU the phases time the work itself, so slower sampled ops with
        # no longer phases are measurement noise (a rank's sampled step shared a core)
        ranks = set(busy) | {r for r, o in slow.items()
                             if sum(x.category == "compute" for x in o) >= ctx.config.min_kernels}
        for r in ranks:
            ev = per_rank[r]
            ev["windows"].add((w.lo, w.hi))
            if w.l3 is not None and r in w.l3.busy_excess_s:
                ev["kernel_excess"].append(w.l3.busy_excess_s[r])
            ev["busy"] += busy.get(r, [])
            ev["l3"] += slow.get(r, [])
            ev["stalled"] = ev["stalled"] or any(  # host work, or intermittent long work: the host's excess
                f.kind == "busy" and f.rank == r and (f.category == "host" or not f.persistent) and any(
                    f.excess_at(s) >= ctx.config.stall_share * ctx.step_time.get(s, np.inf) for s in f.steps)
                for f in w.l2.findings)
            if r in arrival:
                ev["arrival"].append(arrival[r])
            for (rank, name), ratio in w.l2.phase_ratio.items():
                if rank == r:
                    ev["ratios"][name].append(ratio)
    # A stall that recurs every few steps can land on most steps of one window by chance (or
    # spill into the next step), and that window then looks persistent; across the run it is
    # intermittent: windows where the rank's long work comes and goes outnumber the steady ones
    steady_w: Counter[int] = Counter()
    spiky_w: Counter[int] = Counter()
    for w in windows:
        for r in {f.rank for f in w.l2.findings if f.kind == "busy" and f.category == "compute" and f.persistent}:
            steady_w[r] += 1
        for r in {f.rank for f in w.l2.findings if f.kind == "busy" and f.category == "compute" and not f.persistent
                  and any(f.excess_at(s) >= ctx.config.stall_share * ctx.step_time.get(s, np.inf) for s in f.steps)}:
            spiky_w[r] += 1
    groups: dict[tuple[IncidentClass, str, bool], list[int]] = defaultdict(list)
    full = max((w.hi - w.lo + 1 for w in windows), default=0)
    for r, ev in per_rank.items():
        if full >= 3 and all(hi - lo + 1 < full for lo, hi in ev["windows"]):
            continue  # "steady" in the job's last, cut-short window alone (2 steps): too thin to call a slow
            # device — a real 4-rank CPU job's rank 0 read 1.43× in its last two steps (vCPU sharing)
        if ev["busy"] and spiky_w[r] >= 2 * steady_w[r]:
            continue  # a recurring host stall (see _stalls), not a slow device
        if r in kernels_normal and not ev["l3"] and unmeasured[r] >= len(ev["windows"]):
            # long work only in windows whose kernels could not be measured (warm-up mixed in),
            # and with normal kernels where they were: the host's pauses, not a slow device
            # (held-out 70007: 150 ms GC pauses in steps 2–4 of a warm-up window were a compute
            # straggler, and hid the same rank's recurring stall from the host-stall rule)
            continue
        if not ev["busy"] and len(ev["windows"]) < 2:
            continue  # slower kernels in one window only, and work not longer: noise
        if not ev["busy"] and ev["stalled"]:
            continue  # long host phases (or intermittent long work) and no steady compute excess: a host stall
        groups[(*_classify(ctx, ev), _constant_excess(ctx, windows, r))].append(r)
    flagged = {r for members in groups.values() for r in members}
    out = []
    for (klass, phase, constant), members in groups.items():
        # a rank and its only peer both "slower": each was the other's reference in turn (uneven
        # inputs, a shared CPU) — a pair's comparison names neither (CI's uneven-inputs job named
        # both data-parallel ranks of a stage, each slower in three alternate steps)
        members = [r for r in members if not _pair_in_turns(ctx, r, flagged)]
        if not members:
            continue
        out.append(_compute_incident(ctx, klass, phase, sorted(members), [per_rank[r] for r in sorted(members)],
                                     constant))
    return out


def _pair_in_turns(ctx: _Ctx, rank: int, flagged: set[int]) -> bool:
    """Whether ``rank`` is compared with one peer only, and that peer was flagged too."""
    if not ctx.pair(rank):
        return False
    return any(p != rank and p in flagged for p in ctx.topology.layout.peer_set(rank))


def _constant_excess(ctx: _Ctx, windows: list[WindowAnalysis], rank: int) -> bool:
    """Whether the rank's kernel-time excess was there before L1's level shift as much as after:
    a difference from the start (another shard's work, a slower part all along) did not make
    the job slower at the shift, and is not charged with it (nor merged with the ranks that did:
    on the real DLRM job a rank whose embedding kernels differ from the start joined a slowed
    rank's incident and its regression)."""
    shifts = [w.start_step for w in ctx.l1.windows if w.kind == "regression" and np.isfinite(w.magnitude)]
    if not shifts:
        return False
    onset = min(shifts)
    pre, post = [], []
    for w in windows:
        ratio = w.l3.busy_ratio.get(rank) if w.l3 is not None else None
        if ratio is None or not np.isfinite(ratio):
            continue
        if w.lo >= onset:
            post.append(ratio)
        elif onset - w.lo >= (w.hi - w.lo + 1) / 2:  # mostly before the shift
            pre.append(ratio)
    if not pre or not post:
        return False
    before, after = float(np.median(pre)), float(np.median(post))
    return before >= ctx.config.min_busy_ratio and before >= 0.8 * after


def _classify(ctx: _Ctx, ev: dict) -> tuple[IncidentClass, str]:
    ratios = {name: float(np.median(v)) for name, v in ev["ratios"].items()}
    fwd = [(v, n) for n, v in ratios.items() if _block(n) == "fwd" and "compute" in n.lower() or n.lower() == "forward"]
    bwd = [(v, n) for n, v in ratios.items() if _block(n) == "bwd" and "compute" in n.lower() or n.lower() == "backward"]
    if fwd and bwd and ctx.topology.layout.pp > 1:  # one slow pass amplifies along a pipeline; without one it
        # is a slow rank like any other
        (fv, fname), (bv, bname) = max(fwd), max(bwd)
        if bv >= ctx.config.pass_ratio and fv < ctx.config.other_pass:
            return IncidentClass.PIPELINE_IMBALANCE, bname
        if fv >= ctx.config.pass_ratio and bv < ctx.config.other_pass:
            return IncidentClass.PIPELINE_IMBALANCE, fname
    modules = [f for f in ev["busy"] if f.microbatch < 0 and _block(f.name) is None]
    if modules:
        best = max(modules, key=lambda f: f.excess_s)
        return IncidentClass.COMPUTE_STRAGGLER, _base(best.name)
    # no module stands out on its own cost: the one slowed the most relative to its peers
    # (a slow attention inside a block whose total is what crossed the cost gate)
    blocks_ratio = max([v for n, v in ratios.items() if _block(n)] or [1.0])
    inner = [(v, n) for n, v in ratios.items() if _block(n) is None and n not in _STEP_LEVEL
             and v >= max(ctx.config.module_ratio, blocks_ratio)]
    if inner and ev["busy"]:
        return IncidentClass.COMPUTE_STRAGGLER, _base(max(inner)[1])
    blocks = [f for f in ev["busy"] if f.microbatch < 0]
    if blocks:
        return IncidentClass.COMPUTE_STRAGGLER, max(blocks, key=lambda f: f.excess_s).name
    if ev["l3"]:
        return IncidentClass.COMPUTE_STRAGGLER, "compute"
    return IncidentClass.COMPUTE_STRAGGLER, "compute"


def _compute_incident(ctx: _Ctx, klass: IncidentClass, phase: str, ranks: list[int], evs: list[dict],
                      constant: bool = False) -> Incident:
    steps = sorted({s for ev in evs for f in ev["busy"] for s in f.steps}
                   | {s for ev in evs for lo, hi in ev["windows"] for s in range(lo, hi + 1)
                      if not ev["busy"]})
    wins = {w for ev in evs for w in ev["windows"]}
    lo, hi = min(steps), max(steps)
    # Onset: an L1 level shift that starts just before the first flagged step and is still on
    # there is the better start (one that ended before it is another episode: charging its
    # steps to these ranks made a 2-step finding cost the job 7% in a healthy run)
    for w in ctx.l1.windows:
        if (w.kind == "regression" and lo - 10 <= w.start_step <= lo and w.end_step >= lo
                and np.isfinite(w.magnitude)):
            lo = w.start_step
    steps = sorted(set(steps) | set(range(lo, hi + 1)))
    # L2 and L3 are independent only where L3 times the device (CUPTI kernels): sampled CPU
    # ops run on the thread whose phases L2 times, on the same clock, so they agree by construction
    both = any(ev["busy"] and any(o.category == "compute" for o in ev["l3"]) for ev in evs)
    thermal = [r for r in ranks if r in ctx.hw.thermal]
    confirmed = both or len(wins) >= 2 or bool(thermal)
    cost: Counter = Counter()  # the kernels named are those that cost the culprits the most time
    for ev in evs:
        for o in ev["l3"]:
            cost[o.kernel] += o.extra_ns
    kernels = [k for k, _ in cost.most_common(8)]
    if _regression_covering(ctx, steps) and not constant:
        pct, gpuh, _ = _impact(ctx, steps)
        # … but the culprits cannot cost the job more than their own excess: a level shift that
        # something else caused (a recompile stalling every rank) is not charged to them
        # (on a GPU the excess is in the kernels: host-timed phases carry only what the host
        # waited for, so the device's own excess per step counts as the culprit's too)
        own = max([f.typical_excess_s for ev in evs for f in ev["busy"]] + [_kernel_excess_s(ev) for ev in evs],
                  default=None)
        own = own if own else None
        span = [ctx.step_time[s] for s in steps if ctx.normal(s)]
        if own is not None and span:
            cap = 100.0 * own * len(span) / max(sum(span) - own * len(span), 1e-12)
            if cap < pct:
                gpuh, pct = gpuh * cap / pct if pct > 0 else 0.0, cap
    else:  # no healthy level to compare with (or an excess older than it): the culprits' own excess
        excess = [f.typical_excess_s for ev in evs for f in ev["busy"] if f.microbatch < 0 and _block(f.name)]
        if not excess:  # no block flagged: the slowed module's own excess is the block's excess too (the
            # demo's attention, 5 ms a step behind its peers' in 0.1 s steps whose noise hides it from L1,
            # was "+0.0%"); modules nest in blocks and may nest in each other, so the largest per rank
            excess = [max(f.typical_excess_s for f in ev["busy"] if f.microbatch < 0)
                      for ev in evs if any(f.microbatch < 0 for f in ev["busy"])]
        if not excess:
            excess = [x for x in (_kernel_excess_s(ev) for ev in evs) if x > 0]
        pct, gpuh, _ = _impact(ctx, steps, float(np.median(excess)) if excess else 0.0)
    severity = grade(pct)
    action = Action.CORDON_NODE if confirmed else Action.VERIFY
    # One window against one peer is too thin to call a slow device: a pair has no spread to
    # estimate, and on a shared VM a rank's CPU time for the same work runs 1.2–1.3× its one
    # peer's for a few consecutive steps now and then (measured on-CPU time, nothing blocked;
    # CI: a healthy 2-rank compiled job got a warning on rank 0). Shown, not claimed, until a
    # second window, the device's own kernels or a hardware signal say the same.
    thin = all(ctx.pair(r) for r in ranks) and len(wins) < 2 and not both and not thermal
    if thin and severity != Severity.INFO:
        severity, action = Severity.INFO, Action.OBSERVE
    evidence = _l1_evidence(ctx, lo, hi)
    for ev in evs[:4]:
        top = sorted(ev["busy"], key=lambda f: -f.excess_s)[:3]
        evidence += [busy_outlier(f) for f in top]
        evidence += [late_arrival(f) for f in ev["arrival"][:1]]
        evidence += [w1_outlier(o)
                     for o in KernelOutlier.by_cost(ev["l3"])[:3]]
    for r in thermal[:4]:
        evidence.append(thermal_throttle(r, ctx.hw.thermal[r]))
    alarms = [r for r in ranks if r in ctx.hw.nic_down]
    if alarms:
        evidence.append(nic_port_down(alarms[:8], "a NIC alarm on the culprits' host, but transfer times are normal "
                                                  "and the culprits compute slowly: the network is not the cause"))
    matrix = _w1_matrix_evidence(ctx, ranks, evs)
    if matrix is not None:
        evidence.append(matrix)
    what = "backward" if "bwd" in phase or "backward" in phase else phase
    summary = (f"{len(ranks)} rank{'s' * (len(ranks) > 1)} ({', '.join(map(str, ranks[:8]))}"
               f"{'…' if len(ranks) > 8 else ''}) on {', '.join(ctx.hosts_of(ranks)[:3])} "
               f"{'compute slowly' if klass == 'compute_straggler' else 'run their ' + what + ' slowly'} "
               f"in {phase}; their collectives look short because the others wait for them")
    if thin:
        summary += ("; seen in one window against a single peer, too little to tell a slow device from a "
                    "shared host's noise: watching for a second window")
    inc = Incident(klass, ranks, ctx.hosts_of(ranks), ctx.gpus_of(ranks), lo, hi, phase, kernels,
                   State.CONFIRMED if confirmed else State.SUSPECTED, severity, pct, gpuh, action, evidence, steps, summary)
    if thin:
        inc.claim_cap = Severity.INFO
    return inc


def _kernel_excess_s(ev: dict) -> float:
    """A culprit's device-kernel time per step beyond its peers' median (all its compute kernels,
    L3's ``busy_excess_s``; the median over the windows that flagged it); 0 without device
    kernels (sampled CPU ops time the host's own phases, which L2 already measures)."""
    if not any(o.category == "compute" for o in ev["l3"]):
        return 0.0
    values = [v for v in ev["kernel_excess"] if np.isfinite(v)]
    return max(float(np.median(values)), 0.0) if values else 0.0


def _w1_matrix_evidence(ctx: _Ctx, ranks: list[int], evs: list[dict]) -> dict | None:
    """Pairwise W₁ (ms) of the kernel that cost the culprits the most time, over them and a few
    peers, for display."""
    outliers = KernelOutlier.by_cost([o for ev in evs for o in ev["l3"]])
    if not outliers:
        return None
    top = outliers[0]
    peers = [int(p) for p in ctx.topology.layout.peer_set(top.rank) if p not in ranks][:8]
    shown = sorted(set(ranks[:8]) | set(peers))
    import pyarrow.compute as pc

    from argus.analysis.l3_kernels import w1_matrix_for

    lo = min(s for ev in evs for w in ev["windows"] for s in w)
    hi = max(s for ev in evs for w in ev["windows"] for s in w)
    summ = ctx.attempt.read("kernel_summaries", steps=(lo, hi),  # that kernel's rows of those ranks only
                            columns=["rank", "kernel", "stream", "count", "p50_ns", "p99_ns", "min_ns", "max_ns"],
                            filter=pc.field("rank").isin(shown) & (pc.field("kernel") == top.kernel)
                            & (pc.field("stream") == top.stream))
    try:
        m = w1_matrix_for(summ, top.kernel, top.stream, shown)
    except (ValueError, IndexError):
        return None
    return w1_matrix(top.kernel, top.stream, shown, [r for r in shown if r in ranks], (m / 1e6).round(4).tolist())
