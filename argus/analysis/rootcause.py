"""Root cause: combine L1–L3 findings, hardware and stack signals into incidents.

Rules, in the order they are applied:

* **hang** — the processors' live snapshots (``hangs.py``) when there are any, else steps
  that never finished: the culprits are the ranks that never entered the collective the
  others are blocked in.
* **compute** — a rank whose *busy* time is persistently above its peers' (L2), or whose
  compute kernels are slower than its peers' (L3, at least two kernels): the GPU or its
  work is slow. If the excess sits in one pass only (backward ≫ peers, forward ≈ peers) the
  class is ``pipeline_imbalance`` (its bubbles amplify along the pipeline), otherwise
  ``compute_straggler``. Communication that looks *shorter* on those ranks is a symptom:
  a compute culprit is never classed ``link_degradation``.
* **host stall** — a rank with huge intermittent busy excess (≥ 20% of the step) while its
  kernels are normal: the host stopped launching work. Its host phases (``gc``, ``compile``,
  ``dataloader``: ``host_phases.py``) name the cause when they explain the excess, else CPU
  stacks do.
* **link** — per-step transfer times of a minority of groups well above the rest (L2) or a
  communicator's floor shifted (L3); the hosts common to the shifted groups of different
  collectives are the culprits; a degraded PCIe link or a NIC alarm on them confirms.

State: ``confirmed`` when independent evidence agrees (L2 and L3, persistence over
windows, a hardware signal, a classified stack), else ``suspected``. Impact: extra job time
over the affected steps against L1's healthy level, or — when the fault spans the whole
run and no healthy level exists — the measured excess (busy time, transfer time).
Severity: from that impact alone (``incident.grade``; L4's what-if replaces it later), and
bounded by it whatever sets it: nothing above ``info`` below the 2% floor, never
``confirmed`` there.
"""

from __future__ import annotations

import bisect

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.analysis.evidence import EvidenceKind
from argus.analysis.frames import load_phases
from argus.analysis.hangs import hang_incident
from argus.analysis.host_phases import host_phase_cause
from argus.analysis.incident import (WARNING_PCT, Action, Incident, IncidentClass, Severity, State, grade,
                                    run_share_pct)
from argus.analysis.l1_windows import L1Result
from argus.analysis.l2_stragglers import Finding, L2Result
from argus.analysis.l3_kernels import KernelOutlier, L3Result
from argus.analysis.signals import PRESSURE_PCT, HwSignals, stack_cause
from argus.store import Attempt
from argus.topology import Topology

__all__ = ["WindowAnalysis", "RootCauseConfig", "build_incidents", "reinstate_victims"]


@dataclass
class WindowAnalysis:
    lo: int
    hi: int
    l2: L2Result
    l3: L3Result | None
    #: rank → compute-kernel time in the window (Σ launches × median duration), also where L3
    #: did not run (a warm-up window): a rank's own baseline before a regression
    kernel_time_ns: dict[int, float] | None = None


@dataclass(frozen=True, slots=True)
class RootCauseConfig:
    stall_share: float = 0.2  # an intermittent excess this share of the step is a host stall
    one_off_share: float = 0.5  # … but a single unexplained one must reach this share to be reported
    min_kernels: int = 2  # L3 alone needs this many slower kernels on a rank …
    min_busy_ratio: float = 1.15  # … and its total kernel time this far above its peers'
    pass_ratio: float = 1.25  # one pass this much slower than peers …
    other_pass: float = 1.1  # … while the other is within this: pipeline imbalance
    module_ratio: float = 1.5  # a module this much slower than its peers' names the phase


@dataclass
class _Ctx:
    attempt: Attempt
    topology: Topology
    l1: L1Result
    hw: HwSignals
    step_time: dict[int, float]
    config: RootCauseConfig
    world: int = field(init=False)

    def __post_init__(self) -> None:
        self.world = self.topology.world_size

    def hosts_of(self, ranks) -> list[str]:
        return sorted({str(self.topology.hosts[r]) for r in ranks})

    def gpus_of(self, ranks) -> list[str]:
        return [str(self.topology.gpu_uuids[r]) for r in sorted(ranks)]

    def normal(self, step: int) -> bool:
        return self.l1.is_normal_step(step) and np.isfinite(self.step_time.get(step, np.nan))

    def pair(self, rank: int) -> bool:
        """Is the rank's peer set just itself and one other?"""
        return len(self.topology.layout.peer_set(rank)) <= 2

    def stall_candidate(self, step: int) -> bool:
        """Normal, or a spike called periodic only for its timing: one rank's excess there is
        a recurring stall, not a checkpoint (a checkpoint keeps every rank busy)."""
        return self.normal(step) or (step in self.l1.periodic_steps and np.isfinite(self.step_time.get(step, np.nan)))


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


def build_incidents(attempt: Attempt, topology: Topology, l1: L1Result, windows: list[WindowAnalysis],
                    hw: HwSignals, step_time: dict[int, float],
                    config: RootCauseConfig = RootCauseConfig()) -> list[Incident]:
    ctx = _Ctx(attempt, topology, l1, hw, step_time, config)
    incidents: list[Incident] = []
    live = hang_incident(attempt, topology)  # the processors' snapshots of a real job
    if live is not None:
        incidents.append(live)
    elif l1.hung_steps:
        hang = _hang(ctx)
        if hang is not None:
            incidents.append(hang)
    compute = _compute(ctx, windows)
    compute = _slow_hosts(ctx, windows, compute)
    compute = _slow_in_pairs(ctx, windows, compute)
    incidents += compute
    # a compute "culprit" worth nothing (info) does not hide the same rank's host stall
    incidents += _stalls(ctx, windows, {r for inc in compute if inc.severity != Severity.INFO
                                        for r in inc.culprit_ranks})
    incidents += _links(ctx, windows, compute)
    incidents.sort(key=lambda i: (-i.severity_rank, -(i.slowdown_pct or 0.0), i.start_step))
    return incidents


# -- impact, severity, action ----------------------------------------------------------------
def _impact(ctx: _Ctx, steps: list[int], extra_per_step_s: float | None = None) -> tuple[float, float, float]:
    """(slowdown %, GPU-hours lost, extra seconds) over ``steps``."""
    normal = [s for s in steps if ctx.normal(s)] or [s for s in steps if np.isfinite(ctx.step_time.get(s, np.nan))]
    base = ctx.l1.baseline_s
    if not normal or not np.isfinite(base) or base <= 0:
        return 0.0, 0.0, 0.0
    if extra_per_step_s is None:
        extra = float(sum(max(0.0, ctx.step_time[s] - base) for s in normal))
    else:
        extra = max(extra_per_step_s, 0.0) * len(normal)
    return 100.0 * extra / (base * len(normal)), ctx.world * extra / 3600.0, extra


def _spread_pct(ctx: _Ctx, steps: list[int], pct: float) -> float:
    """An intermittent fault's slowdown over the steps from its first to its last, as a user
    sees it (and as L4's what-if and the benches state it), from ``pct`` over ``steps`` alone
    (``_impact``'s definition: extra time over L1's level × the normal steps): 3 scattered
    steps 4% slower in 12 cost the job 1% there, not 4%."""
    n = sum(1 for s in steps if ctx.normal(s))
    if not n or not pct > 0 or not np.isfinite(ctx.l1.baseline_s):
        return pct
    span = {s: ctx.step_time[s] for s in range(steps[0], steps[-1] + 1) if s in ctx.step_time}
    return run_share_pct(span, pct / 100.0 * ctx.l1.baseline_s * n)


def _regression_covering(ctx: _Ctx, steps: list[int]) -> bool:
    return any(w.kind == "regression" and w.start_step <= max(steps) and w.end_step >= min(steps)
               for w in ctx.l1.windows if np.isfinite(w.magnitude))


def _l1_evidence(ctx: _Ctx, lo: int, hi: int) -> list[dict]:
    return [{"level": "L1", **w.to_json()} for w in ctx.l1.windows
            if w.kind in ("jitter", "regression") and w.start_step <= hi and w.end_step >= lo][:4]


# -- hang -------------------------------------------------------------------------------------
def _hang(ctx: _Ctx) -> Incident | None:
    step = int(ctx.l1.hung_steps[0])
    f = load_phases(ctx.attempt, step, step)
    if f.n == 0:
        return None
    unfinished = f.dur < 0
    comm = f.is_comm
    blocked = np.unique(f.rank[unfinished & comm])
    present = np.unique(f.rank)
    culprits = [int(r) for r in present if r not in set(blocked.tolist())]
    missing = sorted(set(range(ctx.world)) - set(present.tolist()))
    culprits = culprits or missing
    if not culprits:
        return None
    waits = Counter(f.names[n] for n in f.name[unfinished & comm])
    last = {}
    for r in culprits[:8]:
        rows = np.flatnonzero(f.rank == r)
        if rows.size:
            i = rows[-1]
            last[r] = {"phase": f.names[f.name[i]], "never_finished": bool(f.dur[i] < 0)}
    evidence: list[dict[str, Any]] = [
        {"level": "L1", "kind": "steps_never_finished", "steps": ctx.l1.hung_steps[:10]},
        {"level": "L2", "kind": "blocked_in_collectives", "ranks": int(blocked.size),
         "collectives": dict(waits.most_common(5))},
        {"level": "L2", "kind": "never_joined", "ranks": culprits[:32], "last_phase": last}]
    stack = stack_cause(ctx.attempt, culprits[0], [step])
    if stack is not None:
        evidence.append({"level": "L5", "kind": "stacks", "rank": culprits[0], **stack.to_json()})
    last_ts = ctx.attempt.sql("SELECT max(end_ns) AS e FROM stacks").column("e")[0].as_py() if stack else None
    start = ctx.attempt.sql(f"SELECT min(start_ns) AS s FROM steps WHERE step = {step}").column("s")[0].as_py()
    stalled_s = (last_ts - start) / 1e9 if last_ts and start else 0.0
    phase = last.get(culprits[0], {}).get("phase", "")
    return Incident(IncidentClass.HANG, culprits, ctx.hosts_of(culprits), ctx.gpus_of(culprits), step, step, phase,
                    [], State.CONFIRMED, Severity.CRITICAL, 100.0, ctx.world * stalled_s / 3600.0,
                    Action.CHECKPOINT_AND_RESTART,
                    evidence, [step], f"job stopped at step {step}: {len(blocked)} ranks blocked in collectives, "
                    f"rank{'s' * (len(culprits) > 1)} {', '.join(map(str, culprits[:8]))} never joined")


# -- compute ----------------------------------------------------------------------------------
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
    out = []
    for (klass, phase, constant), members in groups.items():
        out.append(_compute_incident(ctx, klass, phase, sorted(members), [per_rank[r] for r in sorted(members)],
                                     constant))
    return out


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
        evidence += [{"level": "L2", **f.to_json(), "kind": "busy_outlier"} for f in top]
        evidence += [{"level": "L2", **f.to_json(), "kind": "late_arrival"} for f in ev["arrival"][:1]]
        evidence += [{"level": "L3", "kind": "w1_outlier", **o.to_json()}
                     for o in KernelOutlier.by_cost(ev["l3"])[:3]]
    for r in thermal[:4]:
        evidence.append({"level": "hw", "kind": "thermal_throttle", "rank": r, "max_temperature_c": ctx.hw.thermal[r]})
    alarms = [r for r in ranks if r in ctx.hw.nic_down]
    if alarms:
        evidence.append({"level": "hw", "kind": "nic_port_down", "ranks": alarms[:8],
                         "note": "a NIC alarm on the culprits' host, but transfer times are normal and the "
                                 "culprits compute slowly: the network is not the cause"})
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
    return Incident(klass, ranks, ctx.hosts_of(ranks), ctx.gpus_of(ranks), lo, hi, phase, kernels,
                    State.CONFIRMED if confirmed else State.SUSPECTED, severity, pct, gpuh, action, evidence, steps, summary)


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
    summ = ctx.attempt.read("kernel_summaries", filter=(pc.field("start_step") >= lo) & (pc.field("start_step") <= hi))
    try:
        m = w1_matrix_for(summ, top.kernel, top.stream, shown)
    except (ValueError, IndexError):
        return None
    return {"level": "L3", "kind": "w1_matrix", "kernel": top.kernel, "stream": top.stream, "ranks": shown,
            "culprits": [r for r in shown if r in ranks], "w1_ms": (m / 1e6).round(4).tolist()}


# -- host stalls ------------------------------------------------------------------------------
#: A recurring pause needs less of each step: short host pauses (GC, a recompile) in a share
#: of the steps are found once they recur and together cost the impact floor
#: (``incident.WARNING_PCT``) of the run; each must still be this share of its step, far above
#: a shared host's scheduling noise at the L2 thresholds (z and ratio).
RECURRING_SHARE = 0.05
#: … and a step is one of the stall's only if its excess is at least this share of the stall's
#: median excess (one piece of work recurs at about one size)
SAME_STALL = 0.25
RECURRING_MIN_STEPS = 3
#: … or two steps, when each stall is at least this share of a healthy step (L1's level; the
#: stalled step itself holds the stall): a 300 ms compile in 0.5 s steps, twice in a 20-step
#: job (the third hid in the warm-up), is no shared host's noise, and each alone was below the
#: one-off bar (half a step). Against the stalled step, the same compile in 0.62 s steps read
#: 0.326 of it and went unreported (held-out seed 66009).
TWICE_SHARE = 1 / 3


def _recurring_stalls(ctx: _Ctx, windows: list[WindowAnalysis], compute_ranks: set[int]) -> set[tuple[int, str]]:
    """(rank, phase) whose intermittent long work recurs (≥ 3 steps, or 2 of a third of a step
    each, in ≥ 2 windows) and costs the floor.

    What recurs is one piece of work (a phase: the collector pausing again, the same compile):
    a late warm-up hiccup in one phase and two small collections in another are three
    unrelated noises of a busy host, not a recurring stall."""
    excess: dict[tuple[int, str], dict[int, float]] = defaultdict(dict)
    where: dict[tuple[int, str], set[int]] = defaultdict(set)
    for i, w in enumerate(windows):
        for f in w.l2.findings:
            if f.kind != "busy" or f.rank in compute_ranks or (f.persistent and _fills_window(ctx, w, f)):
                continue
            key = (f.rank, f.name)
            for s in f.steps:
                if ctx.stall_candidate(s) and f.excess_at(s) >= RECURRING_SHARE * ctx.step_time.get(s, np.inf):
                    excess[key][s] = max(excess[key].get(s, 0.0), f.excess_at(s))
                    where[key].add(i)
    run_s = sum(t for s, t in ctx.step_time.items() if ctx.stall_candidate(s))
    healthy = ctx.l1.baseline_s if np.isfinite(ctx.l1.baseline_s) and ctx.l1.baseline_s > 0 else np.inf

    def often(by: dict[int, float]) -> bool:
        big = sum(1 for v in by.values() if v >= TWICE_SHARE * healthy)
        return len(by) >= RECURRING_MIN_STEPS or big >= 2

    return {key for key, by in excess.items() if often(by) and len(where[key]) >= 2
            and sum(by.values()) >= WARNING_PCT / 100.0 * run_s}


def _fills_window(ctx: _Ctx, w: WindowAnalysis, f: Finding) -> bool:
    """Whether a finding holds in every step of its window that a stall could be in: a steady
    excess. One that L2 calls persistent only because the pauses happened to fall in 3 of the
    window's 5 steps (GC at 40% of steps) is intermittent, and recurs step by step (held-out
    69016: nine 150 ms pauses in 0.87 s steps, two windows "persistent", graded +0.5%)."""
    return {s for s in range(w.lo, w.hi + 1) if ctx.stall_candidate(s)} <= set(f.steps)


def _stalls(ctx: _Ctx, windows: list[WindowAnalysis], compute_ranks: set[int]) -> list[Incident]:
    per_rank: dict[int, list[Finding]] = defaultdict(list)
    recurring = _recurring_stalls(ctx, windows, compute_ranks)
    recurring_ranks = {r for r, _ in recurring}

    def min_share(f: Finding) -> float:
        """The recurring work's own phase needs only RECURRING_SHARE of a step; the rank's other
        phases the full stall share (a stall every third step does not make the rank's few ms of
        scheduling noise in the steps between a stall: the CI job's steps 13 and 16)."""
        return RECURRING_SHARE if (f.rank, f.name) in recurring else ctx.config.stall_share

    for w in windows:
        ratio = w.l3.busy_ratio if w.l3 else {}
        slow_kernels = {o.rank for o in (w.l3.outliers if w.l3 else [])
                        if (o.slower or o.more_work) and o.category in ("compute", "cpu_op")
                        and ratio.get(o.rank, 0.0) >= ctx.config.min_busy_ratio}
        slow_kernels |= {r for r, v in ratio.items() if ctx.pair(r) and v >= ctx.config.min_busy_ratio}
        for f in w.l2.findings:
            if f.kind != "busy" or f.rank in compute_ranks:
                continue
            if f.rank in slow_kernels and f.category != "host" and f.persistent:
                continue  # slower kernels explain a steadily long compute phase (never a host phase, nor
                # an intermittent excess: kernels slower in every step do not make some steps 20% longer)
            if f.persistent and f.category == "compute" and w.l3 is None:
                continue  # without kernel data a persistent excess is read as compute
            big = [s for s in f.steps if ctx.stall_candidate(s)  # warm-up and checkpoint steps vary by nature
                   and f.excess_at(s) >= min_share(f) * ctx.step_time.get(s, np.inf)]
            if (len(f.steps) == 1 and f.rank not in recurring_ranks
                    and f.excess_s < ctx.config.one_off_share * ctx.step_time.get(f.steps[0], np.inf)):
                continue  # one hiccup below half a step: the noise of a shared host, not a stall
            if big:
                per_rank[f.rank].append(f)
    out = []
    for rank, findings in per_rank.items():
        # a window that a recurring stall happens to fill looks persistent (3 GC pauses and one 4 ms
        # collection in 5 steps): its finding counts like any other, step by step — each step by its
        # own excess against the stall's share and the stall's typical size, below
        spiky = findings
        steps = sorted({s for f in spiky for s in f.steps if ctx.stall_candidate(s)
                        and f.excess_at(s) >= min_share(f) * ctx.step_time.get(s, np.inf)})
        if not steps:
            continue
        # what recurs is one piece of work of about one size: a step whose excess is a fraction of
        # the stall's typical one is the host's noise, not the stall again (400 ms TorchScript
        # compiles every third step; 7 ms more of the same phase in the step after one of them)
        excess = {s: max(f.excess_at(s) for f in spiky if s in f.steps) for s in steps}
        typical = float(np.median(list(excess.values())))
        steps = [s for s in steps if excess[s] >= SAME_STALL * typical]
        main = max(findings, key=lambda f: f.excess_s)
        phase = main.name
        # the host phase that explains the costliest finding, in that finding's own steps (a
        # recompile in one step is not diluted by smaller pauses that share the incident)
        main_steps = [s for s in main.steps if s in steps] or steps
        measured = host_phase_cause(ctx.attempt, rank, main_steps, main.excess_s)  # gc, compile, dataloader
        stack = stack_cause(ctx.attempt, rank, steps)
        confirmed = measured is not None or (stack is not None and stack.cause != "unknown") or len(steps) >= 2
        pct, gpuh, _ = _impact(ctx, steps)
        mb = sorted({f.microbatch for f in findings if f.microbatch >= 0})
        evidence = _l1_evidence(ctx, steps[0], steps[-1])
        evidence += [{"level": "L2", **f.to_json(), "kind": "busy_outlier"}
                     for f in sorted(findings, key=lambda f: -f.excess_s)[:4]]
        evidence.append({"level": "L3", "kind": "kernels_normal", "rank": rank,
                         "note": "no kernel of this rank is slower than its peers': the GPU waited for the host"})
        if measured is not None:  # measured on the rank's timeline: it names the cause first
            evidence.append({**measured.to_json(), "rank": rank})
        if stack is not None:
            evidence.append({"level": "L5", "kind": "stacks", "rank": rank, **stack.to_json()})
        cause = measured.cause if measured is not None else stack.cause if stack is not None else "unknown"
        # the host's own pressure, where it stands out from the other hosts': storage that stalls
        # (I/O waits: a data loader reading from a slow disk) or CPUs others were using
        host = ctx.hosts_of([rank])[0]
        pressed = []
        for kind, table, what in (("io_pressure", ctx.hw.io_pressure, "storage stalled (I/O pressure)"),
                                  ("cpu_pressure", ctx.hw.cpu_pressure, "CPUs contended")):
            got = _pressure_standing_out(ctx, table, [host], steps[0], steps[-1]).get(host)
            if got is not None:
                evidence.append({"level": "hw", "kind": kind, "hosts": [host], "pressure_pct": {host: round(got[0], 1)},
                                 "others_pct": round(got[1], 1)})
                pressed.append(f"{what} {got[0]:.0f}% vs {got[1]:.0f}% on the other hosts")
        if len(steps) == 1:  # one hiccup, explained or not: matters only if it nearly doubled the step
            share = max(f.excess_at(steps[0]) for f in findings) / ctx.step_time.get(steps[0], np.inf)
            if share < ctx.config.one_off_share:
                continue  # below the noise of a shared host: not an incident
            # … and costs the job its extra time over the run, not over its own step: one 100 ms
            # GC pause slows its step by a fifth but a 12-step job by 1.5% (an observation)
            pct = run_share_pct(ctx.step_time, _impact(ctx, steps)[2])
        severity = grade(pct)
        if len(steps) == 1:
            if share < 1.0 and not confirmed:
                severity = Severity.INFO
        summary = (f"rank {rank} on {ctx.hosts_of([rank])[0]}: host stall in {phase}"
                   f"{' microbatch ' + ','.join(map(str, mb)) if mb else ''} in {len(steps)} step"
                   f"{'s' * (len(steps) > 1)} ({cause.replace('_', ' ')}); kernels normal"
                   + (f"; the host's {'; '.join(pressed)}" if pressed else ""))
        out.append(Incident(IncidentClass.HOST_STALL, [rank], ctx.hosts_of([rank]), ctx.gpus_of([rank]), steps[0], steps[-1],
                            phase, [], State.CONFIRMED if confirmed else State.SUSPECTED,
                            severity, pct, gpuh, Action.RAISE_TRACE_FIDELITY, evidence,
                            steps, summary))
    return out


# -- links ------------------------------------------------------------------------------------
#: A slow link slows the same group's transfers step after step (or flap after flap), while
#: the per-step test's false alarms fall on random groups and steps: a group's finding stands
#: once it recurs in this many steps (or a hardware link signal sits on its hosts). With a
#: per-test false-alarm rate α, a group then raises one by chance at ~C(n, 2)·α² per window of
#: n steps, instead of n·α.
MIN_RECURRENCE = 2
#: Two pipeline lines, one's fastest transfer of a step ≥ 4× the other's (``links.PP_PAIR_FLOOR``):
#: with two values there is no spread to judge by, and on a shared CPU host scheduling alone
#: makes one line's receives 4–22× the other's in a few steps (a healthy 4-rank pipeline on 2
#: vCPUs: 3 of 12 steps). A slow link does it step after step (the throttled netns link: 60 of
#: 60), so such a finding stands only when it holds in this share of the normal steps from its
#: first to its last, and in at least ``PAIR_MIN_STEPS`` of them.
PAIR_PERSISTENCE = 0.8
PAIR_MIN_STEPS = 4
#: Findings of one step within this share of its costliest one name the slow transfers;
#: smaller ones (a collective a tenth as long that moves in the noise) neither narrow the hosts
#: nor add culprits.
DOMINANT_SHARE = 0.5


#: A host's CPU pressure explains a slow link as well as the link does when it is at least
#: ``signals.PRESSURE_PCT`` and this many points above the other hosts' (like with like: on one
#: machine shared by every "host", or a cluster all busy alike, pressure tells no host apart)
PRESSURE_MARGIN = 10.0


def _host_pressure(ctx: _Ctx, table: dict[int, dict[int, float]], lo: int, hi: int) -> dict[str, float]:
    """Host → its worst pressure (%) sampled in steps ``lo..hi`` (hosts without samples: absent)."""
    out: dict[str, float] = {}
    for r, by_step in table.items():
        vals = [v for s_, v in by_step.items() if lo <= s_ <= hi]
        if vals and 0 <= r < len(ctx.topology.hosts):
            h = str(ctx.topology.hosts[r])
            out[h] = max(out.get(h, 0.0), max(vals))
    return out


def _pressure_standing_out(ctx: _Ctx, table: dict[int, dict[int, float]], hosts: list[str], lo: int,
                           hi: int) -> dict[str, tuple[float, float]]:
    """Hosts among ``hosts`` under pressure while the others were not: host → (its %, others' median %)."""
    per = _host_pressure(ctx, table, lo, hi)
    others = [v for h, v in per.items() if h not in hosts]
    if not others:
        return {}
    base = float(np.median(others))
    return {h: (per[h], base) for h in hosts if h in per and per[h] >= PRESSURE_PCT and per[h] - base >= PRESSURE_MARGIN}


def _link_error_hosts(ctx: _Ctx, lo: int | None = None, hi: int | None = None) -> dict[str, float]:
    """Host → link errors counted (InfiniBand port counters, NVLink) in steps ``lo..hi`` (all: None)."""
    out: dict[str, float] = {}
    for r, by_step in ctx.hw.link_errors.items():
        n = sum(v for s_, v in by_step.items() if (lo is None or s_ >= lo) and (hi is None or s_ <= hi))
        if n > 0 and 0 <= r < len(ctx.topology.hosts):
            h = str(ctx.topology.hosts[r])
            out[h] = out.get(h, 0.0) + n
    return out


def _links(ctx: _Ctx, windows: list[WindowAnalysis], compute: list[Incident]) -> list[Incident]:
    hw_hosts = {str(ctx.topology.hosts[r]) for r in list(ctx.hw.pcie_degraded) + list(ctx.hw.nic_down)}
    hw_hosts |= set(_link_error_hosts(ctx))  # a port or NVLink counting errors while the job ran

    def backed(hosts_: list[str], narrow_only: bool) -> bool:
        """Like-with-like evidence stands on its own; a two-group or cross-stage comparison
        (stages may move other sizes) only with a hardware link signal on those hosts."""
        return not narrow_only or bool(set(hosts_) & hw_hosts)

    # not in warm-up or checkpoint steps: a communicator's first collective builds it (NCCL
    # connects lazily: one group's first all-to-all far slower than the rest), a save's
    # barrier waits on storage — neither is a link, and a second chance finding would make two
    findings = [lf for w in windows for lf in w.l2.links if ctx.normal(lf.step)]
    seen: dict[tuple[str, tuple[int, ...]], set[int]] = defaultdict(set)
    for lf in findings:
        seen[(lf.group_kind, tuple(lf.ranks))].add(lf.step)
    by_step: dict[int, list] = defaultdict(list)
    for lf in findings:
        if lf.pair_only and not _persistent_pair(ctx, seen[(lf.group_kind, tuple(lf.ranks))]) \
                and not set(lf.hosts) & hw_hosts:
            continue
        if len(seen[(lf.group_kind, tuple(lf.ranks))]) >= MIN_RECURRENCE or set(lf.hosts) & hw_hosts:
            by_step[lf.step].append(lf)
    shifts = [s for w in windows if w.l3 for s in w.l3.shifts]
    # … only on hosts whose transfers were seen slower at least once: an alarm on a host that
    # computes slowly while its transfers are normal is case 5's red herring, never a link
    slow_transfer = {h for fs in by_step.values() for f in fs for h in f.hosts} | {h for s in shifts for h in s.hosts}
    # … or whose compute kernels are normal: when every group crosses the host (all of them
    # shifted alike, nothing to compare), the alarm and the slow steps are the evidence, and
    # normal kernels rule out case 5's slow GPUs
    nic_all = _nic_down_slow_steps(ctx)
    nic_hosts = sorted({h for hs in nic_all.values() for h in hs})
    normal_compute = {h for h in nic_hosts if _host_kernel_time(ctx, windows, _ranks_on_hosts(ctx, [h]),
                                                                sorted(nic_all)) is None
                      and _host_kernel_time_known(windows, _ranks_on_hosts(ctx, [h]))}
    nic_steps = {step: hs & (slow_transfer | normal_compute) for step, hs in nic_all.items()
                 if hs & (slow_transfer | normal_compute)}
    pcie = _pcie_steps_by_host(ctx)
    if not by_step and not shifts and not nic_steps:
        return _pcie_only(ctx, pcie, compute)
    per_step_hosts: dict[int, set[str]] = {}
    for step in list(by_step):
        stands = [f for f in by_step[step] if backed(f.hosts, f.narrow_only)]
        if not stands:
            del by_step[step]  # comparisons that only narrow other findings down
            continue
        top = max(f.extra_per_step_ns for f in stands)
        by_step[step] = [f for f in by_step[step] if f.extra_per_step_ns >= DOMINANT_SHARE * top]
    for step, fs in by_step.items():
        common = set.intersection(*(set(f.hosts) for f in fs))
        per_step_hosts[step] = common or min((set(f.hosts) for f in fs if backed(f.hosts, f.narrow_only)), key=len)
    # window-level communicator floors narrow the hosts the same way (like-with-like ones first:
    # a cross-stage comparison only narrows what another finding names)
    for s in sorted(shifts, key=lambda s: s.narrow_only):
        for step in range(_window_of(windows, s)[0], _window_of(windows, s)[1] + 1):
            if step not in per_step_hosts and not backed(s.hosts, s.narrow_only):
                continue
            per_step_hosts[step] = (per_step_hosts.get(step, set(s.hosts)) & set(s.hosts)) or per_step_hosts.get(
                step, set(s.hosts))
    # a NIC port reported down in a step that is slower than the job's healthy level: the
    # hardware and the step time agree on the host, even where every group crossing it (two
    # hosts: all of them) is shifted alike and no comparison of groups can tell
    for step, hs in nic_steps.items():
        per_step_hosts[step] = (per_step_hosts[step] & hs) or hs if step in per_step_hosts else set(hs)
    counts = Counter(h for hs in per_step_hosts.values() for h in hs)
    if not counts:
        return _pcie_only(ctx, pcie, compute)
    n_steps = len(per_step_hosts)
    hosts = sorted(h for h, c in counts.items() if c >= 0.5 * n_steps)
    if hw_hosts & set(hosts):
        # the hardware names the hosts: those the comparisons agree on, and every other host
        # whose PCIe link is down at the same time (noise picks one of two slow hosts per step)
        hosts = sorted(hw_hosts & set(hosts) | set(pcie))
    steps = sorted(s for s, hs in per_step_hosts.items() if hs & set(hosts))
    if not hosts or not steps:
        return _pcie_only(ctx, pcie, compute)
    # a link the hardware reports trained down is slow in every step it does so, whether or
    # not a comparison of that step stood out: those steps are the incident's, never a clean
    # baseline to measure its cost against
    down_steps = {s_ for h in hosts for s_ in pcie.get(h, ()) if s_ in ctx.step_time and ctx.normal(s_)}
    if down_steps and len(set(steps) & down_steps) < PCIE_COMPARED_SHARE * len(down_steps):
        # comparisons stood out in a few of the steps the hardware reports the link down in:
        # they measure noise, not the link (every group it slows crosses the slow hosts)
        return _pcie_only(ctx, pcie, compute)
    steps = sorted(set(steps) | {s_ for h in hosts for s_ in pcie.get(h, ()) if s_ in ctx.step_time})
    # what names the slow transfers: findings that stand (narrowing-only ones picked the hosts)
    standing = {s_: [f for f in fs if backed(f.hosts, f.narrow_only)] for s_, fs in by_step.items()}
    # Case 5: a NIC alarm pins slow steps to hosts whose compute kernels take far longer than
    # their peers' while their measured transfers explain little of the loss — the network is
    # the red herring; the hosts' GPUs are slow (even where the host holds half a peer set and
    # no per-rank test can single its ranks out)
    masking = [inc for inc in compute if inc.severity != "info" and set(inc.hosts) & set(hosts)
               and inc.start_step <= steps[-1] and inc.end_step >= steps[0]]
    own: set[int] = set()
    slow_compute = _host_slow(ctx, windows, _ranks_on_hosts(ctx, hosts), steps, own)
    if slow_compute is not None and any(nic_steps.get(s_, set()) & set(hosts) for s_ in steps):
        lost = _impact(ctx, steps)[2] / max(sum(1 for s_ in steps if ctx.normal(s_)), 1)
        explained = max((f.extra_per_step_ns for s_ in steps for f in standing.get(s_, [])
                         if set(f.hosts) & set(hosts)), default=0.0) / 1e9
        if explained < 0.5 * lost:
            # the hosts named slow already (``_slow_hosts``) are that incident, not a second one
            named = {r for inc in masking for r in inc.culprit_ranks}
            return [] if set(slow_compute) <= named else [
                _masked_compute(ctx, hosts, steps, slow_compute, explained, lost, own)]
    # A compute culprit on these hosts explains the waits (``masking``): never call it a link.
    # Transfers measured slow there too cannot be told apart from it: shown, as inconclusive,
    # not claimed.
    ranks = _slow_link_ranks(ctx, standing, steps, hosts, [s_ for s_ in shifts if not s_.narrow_only])
    # each step loses at least what the slow link added to the costliest collective's transfers:
    # a per-step transfer finding's, or a window's shifted communicator floor × its launches per
    # step (a link slow from the first step slows all-to-alls launched 64 times a step, which no
    # per-step comparison of one phase sees whole)
    floor_cost = _shift_cost_per_step(windows, [s_ for s_ in shifts if backed(s_.hosts, s_.narrow_only)], hosts)
    extra = [max(max((f.extra_per_step_ns for f in standing.get(s, []) if set(f.hosts) & set(hosts)), default=0.0),
                 floor_cost.get(s, 0.0)) / 1e9 for s in steps if s in standing or s in floor_cost]
    # a second channel: the device-timed kernels of a communicator of a kind the phases named
    # slow on these hosts (a comparison that only narrows cannot stand alone, but it can agree)
    named_kinds = {f.group_kind for fs in standing.values() for f in fs if set(f.hosts) & set(hosts)}
    l3_agrees = any(set(s.hosts) & set(hosts) and (not s.narrow_only or s.group_kind in named_kinds) for s in shifts)
    hw_agrees = bool(hw_hosts & set(hosts))
    persistent = len(steps) >= 0.8 * len(ctx.step_time) - 2
    # confirmed only where a second channel agrees (device-timed communicator kernels, the
    # hardware): steps that recur in the host-timed phases alone are one channel, and a healthy
    # CPU job's pipeline receives on a shared core recurred in 3 steps (a cordon for nothing)
    confirmed = len(steps) >= 2 and (l3_agrees or hw_agrees)
    down = [s_ for s_ in steps if nic_steps.get(s_, set()) & set(hosts)]
    if len(down) >= 0.5 * len(steps):  # the alarm pins the slow steps: what they lost is the link's
        pct, gpuh, _ = _impact(ctx, steps)
    else:
        pct, gpuh, _ = _impact(ctx, steps, float(np.median(extra)) if extra else None)
        measured = _measured_slowdown_pct(ctx, steps)
        if measured is not None and measured < pct:  # slow transfers off the critical path cost less
            gpuh *= measured / pct if pct > 0 else 0.0
            pct = measured
        if not persistent:
            pct = _spread_pct(ctx, steps, pct)
    collectives = Counter(f.collective for s in steps for f in standing.get(s, []))
    kernels = sorted({s.kernel for s in shifts if set(s.hosts) & set(hosts)}) or sorted(collectives)
    evidence = _l1_evidence(ctx, steps[0], steps[-1])
    for step in steps[:3]:
        evidence += [{"level": "L2", **f.to_json(), "kind": "transfer_shift"} for f in by_step.get(step, [])[:3]]
    evidence += [{"level": "L3", **s.to_json(), "kind": "group_shift"} for s in shifts[:4]]
    for r in sorted(ctx.hw.pcie_degraded)[:8]:
        if str(ctx.topology.hosts[r]) in hosts:
            gen, width = ctx.hw.pcie_degraded[r]
            evidence.append({"level": "hw", "kind": "pcie_degraded", "rank": r, "pcie_gen": gen, "pcie_width": width})
    nic = sorted(r for r in ctx.hw.nic_down if str(ctx.topology.hosts[r]) in hosts)
    if nic:
        evidence.append({"level": "hw", "kind": "nic_port_down", "ranks": nic[:8]})
    errors = {h: n for h, n in _link_error_hosts(ctx, steps[0], steps[-1]).items() if h in hosts}
    if errors:
        evidence.append({"level": "hw", "kind": "link_errors", "hosts": sorted(errors),
                         "errors": {h: int(n) for h, n in sorted(errors.items())},
                         "note": "InfiniBand port or NVLink error counters rose on these hosts during the slow steps"})
    # … and the host's CPUs: a link that looks slow on the one host whose CPUs were saturated
    # (packet processing, other tenants) is as likely contention as a link: never confirmed so
    contended = _pressure_standing_out(ctx, ctx.hw.cpu_pressure, hosts, steps[0], steps[-1])
    if contended:
        confirmed = False
        evidence.append({"level": "hw", "kind": "cpu_pressure", "hosts": sorted(contended),
                         "pressure_pct": {h: round(v, 1) for h, (v, _) in sorted(contended.items())},
                         "others_pct": round(next(iter(contended.values()))[1], 1),
                         "note": "CPU pressure (PSI, softirq, steal) on these hosts only, during the slow steps"})
    first = min((s_ for s_ in ctx.step_time if ctx.normal(s_)), default=0)
    pattern = (("from the first step" if steps[0] <= first else f"from step {steps[0]} on") if persistent
               else f"in {len(steps)} step{'s' * (len(steps) > 1)} (intermittent)")
    slow_groups = {(f.group_kind, tuple(f.ranks)) for s in steps for f in standing.get(s, [])}
    groups = sorted({kind for kind, _ in slow_groups})
    where = (f"the {'/'.join(groups)} group{'s' * (len(slow_groups) > 1)} of rank{'s' * (len(ranks) > 1)} "
             f"{_rank_list(ranks)} on {', '.join(hosts)}" if groups else f"collectives crossing {', '.join(hosts)}")
    summary = (f"{where} transfer slowly {pattern}: "
               f"{', '.join(c for c, _ in collectives.most_common(3)) or ', '.join(kernels)}; compute is normal")
    if errors:
        summary += f"; link error counters rose on {', '.join(sorted(errors))}"
    if contended:
        h, (v, base) = sorted(contended.items())[0]
        summary += (f"; {h}'s CPUs were under pressure meanwhile ({v:.0f}% vs {base:.0f}% on the other hosts): "
                    f"contention is as likely as the link")
    # … and so does one among the slow groups' own members, wherever its host: a group waits for
    # its slowest member, and a member that computes slowly cannot be told from the link it
    # crosses (held-out 69222: a host's mlp ×2 named, and the data-parallel groups its ranks
    # share with the next host's were a confirmed link there, with cordon_node)
    members = {r for s_ in steps for f in standing.get(s_, []) if set(f.hosts) & set(hosts) for r in f.ranks}
    members |= {r for sh in shifts if set(sh.hosts) & set(hosts) for r in sh.ranks}
    masking += [inc for inc in compute if inc not in masking and inc.severity != "info"
                and set(inc.culprit_ranks) & members and inc.start_step <= steps[-1] and inc.end_step >= steps[0]]
    link = Incident(IncidentClass.LINK_DEGRADATION, ranks, hosts, ctx.gpus_of(ranks), steps[0], steps[-1],
                    next(iter(collectives), "collectives"), kernels, State.CONFIRMED if confirmed else State.SUSPECTED,
                    grade(pct), pct, gpuh, Action.CORDON_NODE if confirmed else Action.VERIFY,
                    evidence, steps, summary)
    if masking:
        # culprit over victim: the compute culprit explains the waits, so the slow-looking
        # transfers are its victims' evidence, in its incident — never an incident of their own
        # (unless the replay later finds the culprit costs nothing: ``reinstate_victims``)
        culprit = masking[0]
        culprit.evidence.append({
            "level": "L2", "kind": "victim_transfers", "hosts": hosts, "ranks": ranks[:64], "steps": steps[:32],
            "collectives": [c for c, _ in collectives.most_common(3)] or kernels[:3],
            "note": "transfers on these hosts look slow while their ranks compute slowly: the others wait for "
                    "them there; no link is blamed"})
        culprit.victims.append(link)
        return []
    return [link]


def reinstate_victims(incidents: list[Incident]) -> list[Incident]:
    """Incidents held back as a compute culprit's victims, put back where that culprit no longer
    explains anything: L4's replay found removing its excess gains the job nothing (graded
    ``info``). Masking is decided before the replay; without this a throttled link vanished
    behind a pipeline "culprit" the replay then dismissed, and the job's 30% loss had no incident."""
    out = list(incidents)
    for inc in incidents:
        if not inc.victims or inc.severity != Severity.INFO:
            continue
        for victim in inc.victims:
            victim.evidence.append({
                "level": "L4", "kind": EvidenceKind.CULPRIT_DISMISSED, "incident": inc.id, "ranks": inc.culprit_ranks[:16],
                "note": f"taken at first for the waits of rank(s) {_rank_list(inc.culprit_ranks)} ({inc.klass}); "
                        "replayed without their excess the job gains nothing, so the slow transfers stand on their own"})
            out.append(victim)
        inc.evidence = [e for e in inc.evidence if e.get("kind") != "victim_transfers"]
        inc.victims = []
    return out


#: A link the hardware reports down is measured by transfer comparisons only when they stood
#: out in at least this share of the steps it was down in.
PCIE_COMPARED_SHARE = 0.25


def _pcie_steps_by_host(ctx: _Ctx) -> dict[str, set[int]]:
    """Host → the steps in which one of its ranks' PCIe links ran below its maximum."""
    out: dict[str, set[int]] = defaultdict(set)
    for r, steps in ctx.hw.pcie_steps.items():
        out[str(ctx.topology.hosts[r])].update(int(s) for s in steps if s >= 0)
    return dict(out)


def _pcie_only(ctx: _Ctx, pcie: dict[str, set[int]], compute: list[Incident]) -> list[Incident]:
    """PCIe links reported trained down where no comparison of transfers could stand: every
    group those ranks' transfers cross runs through the slow hosts (two of three hosts), so
    there is no healthy group of the same kind to compare with. The hardware names the hosts;
    the cost is measured only if the job ran clean steps before the link went down — else it
    is stated as not measurable (never inferred), the incident a warning to verify (an
    active link check), not a confirmed cordon."""
    steps = sorted({s for ss in pcie.values() for s in ss if s in ctx.step_time})
    if not pcie or not steps:
        return []
    hosts = sorted(pcie)
    ranks = sorted(int(r) for r in ctx.hw.pcie_degraded if str(ctx.topology.hosts[r]) in hosts)
    if any(inc.severity != Severity.INFO and set(inc.hosts) & set(hosts) for inc in compute):
        return []  # a compute culprit there explains the job's waits
    measured = _measured_slowdown_pct(ctx, steps)
    n_normal = sum(1 for s_ in steps if ctx.normal(s_))
    gpuh = None if measured is None else ctx.world * measured / 100.0 * ctx.l1.baseline_s * n_normal / 3600.0
    severity = grade(measured) if measured is not None else Severity.WARNING
    evidence = [{"level": "hw", "kind": "pcie_degraded", "rank": r, "pcie_gen": ctx.hw.pcie_degraded[r][0],
                 "pcie_width": ctx.hw.pcie_degraded[r][1]} for r in ranks[:8]]
    evidence.append({"level": "L2", "kind": "not_compared",
                     "note": "no group of the same kind runs clear of these hosts: transfers cannot be compared like "
                             "with like" + ("" if measured is not None else
                                            "; no clean step before the link went down: the cost is not measurable "
                                            "from this job")})
    first = min((s_ for s_ in ctx.step_time if ctx.normal(s_)), default=0)
    when = "from the first step" if steps[0] <= first else f"from step {steps[0]} on"
    gen, width = ctx.hw.pcie_degraded[ranks[0]]
    summary = (f"PCIe links of {len(ranks)} rank{'s' * (len(ranks) > 1)} ({_rank_list(ranks)}) on {', '.join(hosts)} "
               f"run below their maximum (Gen{gen:g} x{width:g}) {when}; every group their transfers belong to "
               "crosses these hosts, so no comparison of transfers can single them out; "
               + ("no clean step before it: the cost is not measurable from this job" if measured is None else
                  f"the job ran {measured:.1f}% slower than before") + " — verify the links")
    return [Incident(IncidentClass.LINK_DEGRADATION, ranks, hosts, ctx.gpus_of(ranks), steps[0], steps[-1],
                     "collectives", [], State.SUSPECTED, severity, measured, gpuh, Action.VERIFY, evidence, steps, summary)]


def _persistent_pair(ctx: _Ctx, flagged: set[int]) -> bool:
    """Did a two-line pipeline finding hold step after step (``PAIR_PERSISTENCE``)?"""
    normal = [s for s in ctx.step_time if ctx.normal(s) and min(flagged) <= s <= max(flagged)]
    hits = sum(1 for s in normal if s in flagged)
    return hits >= PAIR_MIN_STEPS and hits >= PAIR_PERSISTENCE * len(normal)


def _shift_cost_per_step(windows: list[WindowAnalysis], shifts: list, hosts: list[str]) -> dict[int, float]:
    """Step → the costliest shifted floor on ``hosts`` in its window: the floor's extra ns per
    event × the kernel's events per rank-step (a lower bound of what the step lost: transfers
    of other kernels may add to it, overlap with compute may hide some)."""
    out: dict[int, float] = {}
    for w in windows:
        if w.l3 is None:
            continue
        for sh in w.l3.shifts:
            if sh in shifts and set(sh.hosts) & set(hosts):
                cost = sh.extra_ns_per_event * w.l3.events_per_step.get((sh.kernel, sh.stream), 0.0)
                for step in range(w.lo, w.hi + 1):
                    out[step] = max(out.get(step, 0.0), cost)
    return out


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


def _regression_start(ctx: _Ctx) -> float:
    """The first step of L1's earliest measured regression (inf: none)."""
    return min((w.start_step for w in ctx.l1.windows if w.kind == "regression" and np.isfinite(w.magnitude)),
               default=np.inf)


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
    for host in sorted(set(hosts.tolist())):
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
        evidence += [{"level": "L3", "kind": "kernel_time", "rank": r, "peer": q, "window": [w.lo, w.hi],
                      "ratio": round(v, 3), "note": "compute-kernel time over its one peer's"} for w, v, _ in rose[:6]]
        evidence.append({"level": "L3", "kind": "kernel_time", "rank": r, "peer": q, "ratio": round(base, 3),
                         "note": "the same, before the job slowed"})
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
    evidence += [{"level": "L3", "kind": "kernel_time", "rank": r, "ratio": round(v, 3),
                  "note": "compute-kernel time over its own before the slowdown (every peer on this host)" if r in own
                  else "compute-kernel time over the peers' median on other hosts"}
                 for r, v in sorted(ratios.items())[:8]]
    nic = sorted(r for r in ctx.hw.nic_down if str(ctx.topology.hosts[r]) in hosts)
    if nic:
        evidence.append({"level": "hw", "kind": "nic_port_down", "ranks": nic[:8],
                         "note": f"transfers explain {1e3 * explained_s:.1f} ms of the {1e3 * lost_s:.0f} ms each "
                                 "step lost: the alarm is not the cause"})
    summary = (f"{len(ranks)} rank{'s' * (len(ranks) > 1)} ({_rank_list(ranks)}) on {', '.join(hosts)} compute "
               f"slowly: kernels {float(np.median(list(ratios.values()))):.2f}× "
               + ("their own before the slowdown (the host holds their every peer)" if own == set(ranks) else
                  "their peers' on other hosts" if not own else "their peers' on other hosts, or their own before")
               + ("; a NIC alarm there, but their transfers explain little of the loss" if nic else ""))
    return Incident(IncidentClass.COMPUTE_STRAGGLER, ranks, hosts, ctx.gpus_of(ranks), steps[0], steps[-1], "compute",
                    [], State.SUSPECTED, grade(pct), pct, gpuh, Action.VERIFY, evidence, steps, summary)


def _rank_list(ranks: list[int], head: int = 8) -> str:
    return ", ".join(map(str, ranks[:head])) + (f" … ({len(ranks)})" if len(ranks) > head else "")


def _slow_link_ranks(ctx: _Ctx, by_step: dict[int, list], steps: list[int], hosts: list[str],
                     shifts: list | None = None) -> list[int]:
    """The ranks whose transfers are slow: members of the shifted groups on the culprit hosts
    in at least half the steps that saw them (else of the window-level communicator floors
    that shifted, ``shifts``), plus ranks whose PCIe or NIC the hardware flags there. A slow
    group's ranks, not every rank of its hosts or stage; a whole host's ranks only when
    nothing narrower was seen (a NIC alarm alone)."""
    on_hosts = np.isin(ctx.topology.hosts.astype(str), hosts)
    seen: Counter[int] = Counter()
    n = 0
    for s in steps:
        fs = [f for f in by_step.get(s, []) if set(f.hosts) & set(hosts)]
        if fs:
            n += 1
            seen.update({r for f in fs for r in f.ranks if on_hosts[r]})
    ranks = {r for r, c in seen.items() if c >= 0.5 * n}
    if not ranks:
        ranks = {int(r) for sh in shifts or [] if set(sh.hosts) & set(hosts) for r in sh.ranks if on_hosts[r]}
    ranks |= {int(r) for r in list(ctx.hw.pcie_degraded) + list(ctx.hw.nic_down) if on_hosts[r]}
    return sorted(ranks) or sorted(int(r) for r in np.flatnonzero(on_hosts))


def _measured_slowdown_pct(ctx: _Ctx, steps: list[int], min_clean: int = 2) -> float | None:
    """How much slower (at least) the link's steps ran than the job's clean steps (normal ones
    the link did not touch: before its onset, or between flaps), or None without enough clean
    steps (a link slow from the first step: only its transfers' excess can be measured)."""
    hit = set(steps)
    flagged = [s for s in steps if ctx.normal(s)]
    lo, hi = min(steps), max(steps)
    span = [s for s in ctx.step_time if lo <= s <= hi and ctx.normal(s)]
    intermittent = len(flagged) < 0.8 * max(len(span), 1)
    clean = [s for s in ctx.step_time if ctx.normal(s) and s not in hit and (s < lo or (intermittent and s <= hi))]
    if intermittent and flagged and ctx.l1.change_points:
        # Between flaps the job runs as it otherwise would: an intermittent finding is measured
        # against the clean steps of its own level (L1 change points), so a level shift of the
        # whole job (a host busy with other work slows every step) is not charged to the link.
        cuts = sorted(ctx.l1.change_points)
        level = lambda step: bisect.bisect_right(cuts, step)  # noqa: E731
        pools = {level(f): [s for s in ctx.step_time if ctx.normal(s) and s not in hit and level(s) == level(f)]
                 for f in flagged}
        if all(len(p) >= min_clean for p in pools.values()):
            base = {lv: float(np.median([ctx.step_time[s] for s in p])) for lv, p in pools.items()}
            d = np.array([ctx.step_time[s] - base[level(s)] for s in flagged])
            r = np.concatenate([np.array([ctx.step_time[s] for s in p]) - base[lv] for lv, p in pools.items()])
            sigma = 1.4826 * float(np.median(np.abs(np.r_[d - np.median(d), r])))
            se = 1.2533 * sigma * float(np.sqrt(1.0 / len(d) + 1.0 / len(r)))
            ref = float(np.median([base[level(s)] for s in flagged]))
            return max(0.0, 100.0 * (float(np.median(d)) - se) / ref) if ref > 0 else None
    if len(clean) < min_clean or not flagged:
        return None
    a = np.array([ctx.step_time[s] for s in flagged])
    b = np.array([ctx.step_time[s] for s in clean])
    during, before = float(np.median(a)), float(np.median(b))
    if before <= 0:
        return None
    # what the steps lost beyond the job's own step-to-step noise: the difference of medians
    # less one standard error (robust spreads pooled), so a short healthy baseline that
    # happened to run fast does not turn a slow link off the critical path into a claim
    sigma = 1.4826 * float(np.median(np.abs(np.r_[a - during, b - before])))
    se = 1.2533 * sigma * float(np.sqrt(1.0 / len(a) + 1.0 / len(b)))
    return max(0.0, 100.0 * (during - se - before) / before)


def _nic_down_slow_steps(ctx: _Ctx, min_slowdown: float = 0.05) -> dict[int, set[str]]:
    """Steps in which a host reported a NIC port down *and* the job's step was at least
    ``min_slowdown`` above its healthy level → that host. A port down in a step of normal
    speed (a redundant port, a bonded link) is not a slow link."""
    base = ctx.l1.baseline_s
    out: dict[int, set[str]] = defaultdict(set)
    if not np.isfinite(base) or base <= 0:
        return out
    for rank, steps in ctx.hw.nic_down.items():
        for step in steps:
            t = ctx.step_time.get(int(step), np.nan)
            if np.isfinite(t) and t >= (1 + min_slowdown) * base and step not in ctx.l1.warmup_steps:
                out[int(step)].add(str(ctx.topology.hosts[rank]))
    return out


def _window_of(windows: list[WindowAnalysis], shift) -> tuple[int, int]:
    for w in windows:
        if w.l3 is not None and shift in w.l3.shifts:
            return w.lo, w.hi
    return 0, -1
