"""Host stalls: a rank with large intermittent busy excess while its kernels are normal — the host
stopped launching work (GC, a compile, the data loader), named by host phases or stacks."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from argus.analysis.host_phases import host_phase_cause
from argus.analysis.incident import WARNING_PCT, Action, Incident, IncidentClass, Severity, State, grade, run_share_pct
from argus.analysis.l2_stragglers import Finding
from argus.analysis.signals import stack_cause
from argus.analysis.evidence import EvidenceKind, busy_outlier, host_pressure, kernels_normal, stacks
from argus.analysis.rootcause.context import WindowAnalysis, _Ctx, _l1_evidence
from argus.analysis.rootcause.impact import _impact
from argus.analysis.rootcause.hardware import _pressure_standing_out

__all__ = ["RECURRING_SHARE", "SAME_STALL", "RECURRING_MIN_STEPS", "STRAY_GAPS", "STRAY_SIZE", "TWICE_SHARE"]


#: A recurring pause needs less of each step: short host pauses (GC, a recompile) in a share
#: of the steps are found once they recur and together cost the impact floor
#: (``incident.WARNING_PCT``) of the run; each must still be this share of its step, far above
#: a shared host's scheduling noise at the L2 thresholds (z and ratio).
RECURRING_SHARE = 0.05


#: … and a step is one of the stall's only if its excess is at least this share of the stall's
#: median excess (one piece of work recurs at about one size)
SAME_STALL = 0.25


RECURRING_MIN_STEPS = 3


#: … and a step further from the stall's other steps than this many of its usual intervals,
#: whose excess is also under ``STRAY_SIZE`` of the stall's typical one, is not the stall
#: recurring: judged alone, as a one-off (below half a step, the host's noise). A real 4-rank
#: job whose rank 2 stalled ~50 ms in every step from step 9 on had an 11 ms hiccup in step 1
#: join the stall (1 run in 5), and the incident began at step 1; a 600 ms collection pause nine
#: steps after the last one is the same pause again.
STRAY_GAPS = 3
STRAY_SIZE = 0.5


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


def _without_strays(ctx: _Ctx, steps: list[int], excess: dict[int, float]) -> list[int]:
    """``steps`` less those whose nearest other step lies more than ``STRAY_GAPS`` usual
    intervals away (the median gap), whose excess is under ``STRAY_SIZE`` of the typical one and
    below the one-off bar: a small hiccup long before or after a stall that recurs is not one of
    its occurrences."""
    if len(steps) < 3:
        return steps
    gaps = np.diff(steps)
    usual = max(float(np.median(gaps)), 1.0)
    typical = float(np.median([excess[s] for s in steps]))
    near = np.minimum(np.r_[np.inf, gaps], np.r_[gaps, np.inf])
    return [s for s, d in zip(steps, near.tolist()) if d <= STRAY_GAPS * usual or excess[s] >= STRAY_SIZE * typical
            or excess[s] >= ctx.config.one_off_share * ctx.step_time.get(s, np.inf)]


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
        steps = _without_strays(ctx, steps, excess)
        findings = [f for f in findings if set(f.steps) & set(steps)]
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
        evidence += [busy_outlier(f)
                     for f in sorted(findings, key=lambda f: -f.excess_s)[:4]]
        evidence.append(kernels_normal(rank, "no kernel of this rank is slower than its peers': the GPU waited for "
                                             "the host"))
        if measured is not None:  # measured on the rank's timeline: it names the cause first
            evidence.append({**measured.to_json(), "rank": rank})
        if stack is not None:
            evidence.append(stacks(rank, stack))
        cause = measured.cause if measured is not None else stack.cause if stack is not None else "unknown"
        # the host's own pressure, where it stands out from the other hosts': storage that stalls
        # (I/O waits: a data loader reading from a slow disk) or CPUs others were using
        host = ctx.hosts_of([rank])[0]
        pressed = []
        for kind, table, what in ((EvidenceKind.IO_PRESSURE, ctx.hw.io_pressure, "storage stalled (I/O pressure)"),
                                  (EvidenceKind.CPU_PRESSURE, ctx.hw.cpu_pressure, "CPUs contended")):
            got = _pressure_standing_out(ctx, table, [host], steps[0], steps[-1]).get(host)
            if got is not None:
                evidence.append(host_pressure(kind, [host], {host: round(got[0], 1)}, round(got[1], 1)))
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
