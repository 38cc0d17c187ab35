"""L4/L5 on the incidents L1–L3 produced: the automated last mile.

For each compute, pipeline or host-stall incident: replay its steps without the culprits'
excess (what-if impact and the critical path), the pipeline's busy/bubble picture when the
job is pipelined, the device's idle gaps inside a stalled phase, and the stalled host's
stacks. Their findings become evidence; the what-if replaces L1's impact estimate (it
isolates the culprits' share of the slowdown where L1 measures everything that happened);
agreement from another channel (stacks, the device's idle gaps) confirms the incident; the
critical path and the pipeline's origin, replays of the same phases, are shown, never confirming.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from argus.analysis.frames import WindowFrames
from argus.analysis.incident import Incident, IncidentClass, Severity, State, grade, run_share_pct
from argus.analysis.l4_gaps import gpu_idle
from argus.analysis.l4_pipeline import pipeline_bubbles
from argus.analysis.l4_replay import what_if
from argus.analysis.l5_stacks import stack_cause
from argus.store import Attempt
from argus.topology import Topology
from argus.vocab import EvidenceKind, Level

__all__ = ["DeepenConfig", "deepen", "MAX_REPLAY_ERROR_PCT"]

#: A replay that misses the recorded step time by more than this does not model the job (its
#: events do not hold the dependencies that set the step): its what-if neither replaces the
#: impact nor votes. The simulator and real gloo jobs replay within a few percent.
MAX_REPLAY_ERROR_PCT = 10.0
#: L4/L5 findings measured apart from the phase comparison that raised an incident: only these confirm it.
INDEPENDENT_AGREEMENT = {"stacks", "gpu_idle"}


def _replay_blind(inc: Incident, wi, baseline_s: float, incidents: list[Incident]) -> bool:
    """Whether the replay cannot see what L1 measured: the job's steps ran well above its healthy
    level, the replay without the culprits' excess leaves them there, and no other incident is
    there to explain the rest. Then the excess sits where the replayed phases do not hold it (on
    the device behind host-timed annotations, behind asynchronous launches), and the replay may
    not lower the measured impact: an unexplained slowdown is not "nobody's"."""
    if not (np.isfinite(baseline_s) and baseline_s > 0) or not wi.replays:
        return False
    if grade(inc.slowdown_pct) == Severity.INFO or grade(wi.slowdown_pct) != Severity.INFO:
        return False
    recorded = float(np.median([r.recorded_s for r in wi.replays]))
    fixed = float(np.median([r.without_fault_s for r in wi.replays]))
    excess = recorded - baseline_s
    if excess < 0.05 * baseline_s or fixed - baseline_s < 0.5 * excess:
        return False  # nothing measured to explain, or the replay explains it
    replayed = {r.step for r in wi.replays}
    return not any(o is not inc and o.severity != Severity.INFO and replayed & set(o.steps or range(
        o.start_step, o.end_step + 1)) for o in incidents)


@dataclass(frozen=True, slots=True)
class DeepenConfig:
    enabled: bool = True
    max_replays: int = 3  # steps replayed per incident at least …
    event_budget: int = 150_000  # … and more while their communication events fit this budget


def deepen(attempt: Attempt, topology: Topology, incidents: list[Incident], step_time: dict[int, float],
           normal_step, config: DeepenConfig = DeepenConfig(), frames: WindowFrames | None = None,
           timings: dict[str, float] | None = None, baseline_s: float = float("nan")) -> None:
    """Add L4/L5 evidence to ``incidents`` in place; ``normal_step(s)`` says whether a step is
    neither warm-up nor checkpoint (those are replayed only when nothing else is affected).
    ``frames``: the windows' phases the diagnosis already read (default: read here); ``timings``
    gains the seconds spent in L4 and in L5; ``baseline_s``: L1's healthy step time (a replay that
    leaves measured slow steps unexplained does not lower the impact, ``_replay_blind``)."""
    clock = {"l4": 0.0, "l5": 0.0}
    if timings is not None:
        timings.update(clock)
    if not config.enabled:
        return
    frames = frames if frames is not None else WindowFrames(attempt, [])
    # phases aggregated per step (read back from a TSDB) have no event order to replay
    replayable = attempt.meta.get("phase_detail") != "aggregated"
    t_all = time.perf_counter()
    for inc in incidents:
        if inc.klass not in ("compute_straggler", "pipeline_imbalance", "host_stall") or inc.severity == "info":
            continue
        steps = inc.steps or list(range(inc.start_step, inc.end_step + 1))
        # a stall in a warm-up step is still a stall; a persistent fault is measured on normal steps
        normal = steps if inc.klass == "host_stall" else ([s for s in steps if normal_step(s)] or steps)
        agree: list[str] = []
        wi = None
        # The replay moves phases: a slowdown seen only in kernels (host-timed phases that do
        # not carry it — a real GPU trace's annotations end when the host is done launching)
        # is invisible to it, and "removing the culprits changes nothing" would be wrong.
        blind = inc.klass in ("compute_straggler", "pipeline_imbalance") and not any(
            e.get("kind") == EvidenceKind.BUSY_OUTLIER for e in inc.evidence)
        if blind:
            inc.evidence.append({"level": Level.L4, "kind": EvidenceKind.WHAT_IF_SKIPPED, "note": (
                "the culprits' phases carry no excess (only their kernels do): a replay of the phases "
                "cannot remove it; the impact is L1's")})
        if replayable and not blind:  # what_if itself declines jobs too large to replay
            # intermittent faults: replay the affected steps; persistent: a spread of normal ones
            wi = what_if(attempt, steps, inc.culprit_ranks, topology.hosts, step_time, config.max_replays, normal,
                         config.event_budget, frames)
        if wi is not None and wi.replays:
            error = float(np.median([abs(r.fidelity_pct) for r in wi.replays]))
            if not error <= MAX_REPLAY_ERROR_PCT:
                # the replay does not reproduce the recorded steps (collectives overlapping
                # host-timed work it cannot see): its what-if is no measurement
                inc.evidence.append({**wi.to_json(), "kind": EvidenceKind.WHAT_IF_SKIPPED, "note": (
                    f"the replay misses the recorded steps by {error:.0f}% (more than {MAX_REPLAY_ERROR_PCT:.0f}%): "
                    "it does not model this job; the impact is L1's")})
                _spread_stall(inc, step_time, topology.world_size)
                wi = None
        observed = _no_progress_s(inc)
        if wi is not None and observed is not None and wi.extra_s < 0.5 * observed:
            # the processor watched every other rank wait, blocked, for this long: a replay of the
            # incident's own steps that gives back less holds only part of it (a rank frozen in its
            # optimizer, after the step's last collective: its peers wait in the next step's)
            inc.evidence.append({**wi.to_json(), "kind": EvidenceKind.WHAT_IF_SKIPPED, "note": (
                f"the processor saw the job make no progress for {observed:.0f} s; replayed, the incident's "
                f"steps give back {wi.extra_s:.2f} s (the wait fell in another step): the impact is the one "
                "observed")})
            wi = None
        if wi is not None and _replay_blind(inc, wi, baseline_s, incidents):
            # L1 measured the job slower in these steps, the replay without the culprits' excess
            # leaves them as slow, and nothing else explains it: the replay cannot see where their
            # excess sits, so it may not lower L1's measured impact (a ×2 regression explained by
            # one culprit set is never "info")
            inc.evidence.append({**wi.to_json(), "kind": EvidenceKind.WHAT_IF_SKIPPED, "note": (
                "replayed without the culprits' excess the steps stay as slow as recorded, above the job's "
                "healthy level, and no other incident explains them: the replayed phases do not hold the "
                "excess (device time behind host-timed annotations, asynchronous launches); the impact is L1's")})
            inc.evidence.append(wi.critical_json())
            _spread_stall(inc, step_time, topology.world_size)
            wi = None
        if wi is not None:
            previous = {"slowdown_pct": inc.slowdown_pct, "gpu_hours_lost": inc.gpu_hours_lost}
            inc.evidence.append({"level": Level.L1, "kind": EvidenceKind.IMPACT_ESTIMATE, **{
                k: None if v is None else round(float(v), 4) for k, v in previous.items()},
                "note": "extra job time against L1's healthy level (superseded by the L4 what-if)"})
            # the slowdown of the job over the incident's window (an intermittent stall's cost
            # spread over the steps between, as a user sees it), not of the stalled steps alone
            span = [step_time[s] for s in range(inc.start_step, inc.end_step + 1)
                    if np.isfinite(step_time.get(s, np.nan))]
            wi.slowdown_pct = 100.0 * wi.extra_s / max(sum(span) - wi.extra_s, 1e-12) if span else wi.slowdown_pct
            if inc.klass == IncidentClass.HOST_STALL and len(inc.steps) == 1:  # a one-off: over the run
                wi.slowdown_pct = run_share_pct(step_time, wi.extra_s)
            inc.slowdown_pct, inc.gpu_hours_lost = wi.slowdown_pct, wi.gpu_hours_lost
            # severity from the replayed impact: what the job would gain without the culprits'
            # excess. It replaces L1's estimate (which charges every slow step to the incident),
            # down as well as up: a "straggler" whose removal changes nothing is not worth anyone's attention
            inc.severity = grade(wi.slowdown_pct)
            inc.evidence += [wi.to_json(), wi.critical_json()]
            if grade(previous["slowdown_pct"]) != Severity.INFO and grade(wi.slowdown_pct) == Severity.INFO:
                # L1–L3 saw a costly fault on these ranks, the replay says removing it gains
                # nothing: the levels disagree — the slowdown is real but not (only) theirs
                inc.state = State.INCONCLUSIVE
                inc.evidence.append({"level": Level.L4, "kind": EvidenceKind.DISAGREEMENT, "note": (
                    f"L1 charges {previous['slowdown_pct']:.1f}% to these ranks; replayed without their excess "
                    f"the job gains {wi.slowdown_pct:.1f}%: the slowdown is not theirs alone")})
            top = max(wi.critical.items(), key=lambda kv: kv[1], default=(None, 0.0))
            if top[0] in inc.culprit_ranks:
                agree.append("critical_path")
        rep = wi.replays[0].step if wi is not None and wi.replays else (normal[len(normal) // 2] if normal else None)
        if inc.klass in ("compute_straggler", "pipeline_imbalance") and attempt.layout.pp > 1 and rep is not None:
            pipe = pipeline_bubbles(attempt, inc.culprit_ranks, rep, frames)
            if pipe is not None:
                inc.evidence.append(pipe)
                if pipe["origin_rank"] in inc.culprit_ranks:
                    agree.append("pipeline_origin")
        if inc.klass == "host_stall":
            rank = inc.culprit_ranks[0]
            mb = next((int(e["microbatch"]) for e in inc.evidence
                       if e.get("kind") == EvidenceKind.BUSY_OUTLIER and e.get("microbatch", -1) is not None
                       and int(e.get("microbatch", -1)) >= 0), -1)
            gaps = gpu_idle(attempt, rank, steps, inc.phase, mb, frames)
            if gaps is not None:
                inc.evidence.append(gaps)
                if gaps.get("host_stall"):
                    agree.append("gpu_idle")
            if not any(e.get("level") == Level.L5 for e in inc.evidence):
                t5 = time.perf_counter()
                stack = stack_cause(attempt, rank, steps)
                clock["l5"] += time.perf_counter() - t5
                if stack is not None:
                    inc.evidence.append({"level": Level.L5, "kind": EvidenceKind.STACKS, "rank": rank, **stack.to_json()})
            cause = next((e["cause"] for e in inc.evidence if e.get("level") == Level.L5), "unknown")
            if cause != "unknown":
                agree.append("stacks")
                inc.summary = inc.summary.replace("(unknown)", f"({cause.replace('_', ' ')})")
        if agree:
            inc.evidence.append({"level": Level.L4, "kind": EvidenceKind.AGREEMENT, "with": agree,
                                 "note": "automated trace and stack analysis agree with L1–L3"})
            # the critical path and the pipeline's origin are replays of the phases that raised
            # the incident: they agree by construction; stacks (another channel) and the device's
            # idle gaps (kernels against phases) are evidence of their own
            if inc.state == State.SUSPECTED and set(agree) & INDEPENDENT_AGREEMENT:
                inc.state = State.CONFIRMED
    if timings is not None:
        timings.update(l4=time.perf_counter() - t_all - clock["l5"], l5=clock["l5"])


def _spread_stall(inc: Incident, step_time: dict[int, float], world: int) -> None:
    """An intermittent host stall whose impact stays L1's: its extra time spread over the steps
    from the first stall to the last, the convention the what-if follows (over the stalled steps
    alone, 400 ms pauses in every third 70 ms step read +795%)."""
    if inc.klass != IncidentClass.HOST_STALL or not inc.gpu_hours_lost or len(inc.steps) <= 1:
        return
    extra = float(inc.gpu_hours_lost) * 3600.0 / max(world, 1)
    span = [step_time[s_] for s_ in range(inc.start_step, inc.end_step + 1) if np.isfinite(step_time.get(s_, np.nan))]
    if span:
        inc.slowdown_pct = 100.0 * extra / max(sum(span) - extra, 1e-12)


def _no_progress_s(inc: Incident) -> float | None:
    """Seconds the processor saw the job make no progress in this incident (its hang snapshot's
    ``no_progress`` evidence: a frozen rank's stall), else None."""
    for e in inc.evidence:
        if e.get("kind") == EvidenceKind.NO_PROGRESS and isinstance(e.get("stalled_s"), (int, float)):
            return float(e["stalled_s"])
    return None
