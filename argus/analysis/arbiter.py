"""The one arbiter: the rules' candidate incidents and the what-if attribution's findings become
the diagnosis' incidents, each with the impact the attribution measured.

* A candidate whose culprits the attribution evaluated gets their **measured** cost — what the
  job gains with their excess removed, replayed through the job's dependencies — as its impact,
  graded from it: a "straggler" whose removal gains nothing is ``info`` however it was found.
* A finding that names the same culprits joins that candidate (its evidence, its culprits when
  narrower: a link's communicator instead of the hosts it crosses); one fault, one incident.
* A finding no rule saw is an incident of its own: a persistent straggler with no healthy window
  to compare against, work outside the recorded phases, a stage holding too many layers,
  variance on every worker.
* An L1 regression that no incident explains is a ``job_slowdown`` that says what was ruled out.

Where a window could not be modeled (its replay misses the recording), its candidates keep the
rules' impact and say why."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus.analysis.attribution import (MIN_FINDING_STEPS, MIN_STAGE_SLOWDOWN, Finding, GroupKind, Part, Shape,
                                        WindowOutcome)
from argus.analysis.incident import (Action, Incident, IncidentClass, Severity, State, grade)
from argus.analysis.l1_windows import L1Result
from argus.analysis.observations import Observation, ObservationKind
from argus.topology import GROUP_KINDS, Topology
from argus.vocab import EvidenceKind, Level
from argus.vocab import GroupKind as GK
from argus.uniques import sorted_unique

__all__ = ["arbitrate", "SLOW_CLASSES", "candidate_label", "fold_into_failures",
           "fold_stage_into_links"]

#: Classes whose impact is a slowdown the attribution can measure.
SLOW_CLASSES = (IncidentClass.COMPUTE_STRAGGLER, IncidentClass.PIPELINE_IMBALANCE, IncidentClass.HOST_STALL,
                IncidentClass.LINK_DEGRADATION)
#: Variance on every worker (uneven inputs) is a warning from this cost on, else an observation.
SPREAD_WARNING_PCT = 20.0
#: An L1 regression at least this large with no incident covering it is a job slowdown.
UNEXPLAINED_REGRESSION = 1.10
#: … after at least this many normal steps at the healthy level (the job slowed down, it did
#: not speed up after a long warm-up; a real DataLoader's prefetched batches made the first 3
#: steps of a healthy 12-step job ×1.46 faster than the rest).
MIN_HEALTHY_BEFORE = 5
#: A whole-job slowdown shorter than this many steps is shown, not claimed: every rank slowed
#: alike for a while and no one stands out (a shared cluster's load, a burst of long inputs);
#: one that lasts is a warning or worse by its cost.
TRANSIENT_JOB_STEPS = 20
#: … and shorter than this many seconds: a VM's vCPUs drift by a fifth for seconds at a time
#: (invisible to the guest, ``docs/diagnosis.md``), a shared cluster's load for tens of seconds;
#: a clean 30-step CI job read ×1.24 over its last 20 steps (1.6 s) and was told "critical".
TRANSIENT_JOB_S = 60.0


def candidate_label(i: int) -> str:
    """The label a candidate incident's culprits are evaluated under in each window."""
    return f"candidate {i}"


@dataclass
class _Merged:
    """One finding over the windows it appears in."""

    klass: str
    part: Part
    shape: Shape
    culprits: list[int]
    phase: str
    label: str
    parts: list[Finding] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return sorted({s for f in self.parts for s in f.steps})

    @property
    def windows(self) -> list[tuple[int, int]]:
        return sorted({(f.lo, f.hi) for f in self.parts})

    @property
    def share(self) -> float:
        return float(np.median([f.share for f in self.parts]))

    @property
    def slowdown(self) -> float:
        return float(np.median([f.slowdown for f in self.parts]))

    @property
    def persistent(self) -> bool:
        return all(f.persistent for f in self.parts)


def _merge(outcomes: list[WindowOutcome]) -> list[_Merged]:
    merged: dict[tuple, _Merged] = {}
    for o in outcomes:
        for f in o.findings or []:
            key = (f.part, f.shape, tuple(f.culprits) if f.shape != Shape.STAGE else f.phase)
            m = merged.get(key)
            if m is None:
                m = merged[key] = _Merged(f.klass, f.part, f.shape, list(f.culprits), f.phase, f.label)
            m.parts.append(f)
    # the class of the costliest window stands for all
    for m in merged.values():
        top = max(m.parts, key=lambda f: f.gain_s)
        m.klass, m.phase = top.klass, top.phase
    return sorted(merged.values(), key=lambda m: -sum(f.gain_s for f in m.parts))


@dataclass
class _Cost:
    extra_s: float  # job seconds the group cost over its steps
    span_s: float  # recorded job time over those steps
    steps: list[int]
    replays: list[tuple[int, float, float]]  # (step, recorded s, without the group s) for the chart
    error_pct: float

    intermittent: bool = False

    @property
    def slowdown_pct(self) -> float:
        return 100.0 * self.extra_s / max(self.span_s - self.extra_s, 1e-12) if self.span_s > 0 else 0.0

    def spread(self, step_time: dict[int, float]) -> None:
        """An intermittent cost as a user sees it: over the steps from its first to its last (a
        one-off: over the run) — 400 ms pauses in every third 70 ms step are not +795%."""
        if not self.intermittent or not self.steps:
            return
        if len(self.steps) == 1:
            self.span_s = sum(t for t in step_time.values() if np.isfinite(t))
        else:
            self.span_s = sum(t for s, t in step_time.items()
                              if self.steps[0] <= s <= self.steps[-1] and np.isfinite(t))


def _cost(parts: list[Finding], outcomes: dict[tuple[int, int], WindowOutcome], step_time: dict[int, float],
          normal) -> _Cost:
    """What a finding's group cost: the seconds per step its fix gains in each window (measured on
    the window's normal steps), charged to every step of the window it affects — a persistent
    fault costs about the same seconds in a long checkpoint step — and the share of the time
    over those steps it took."""
    extra = span = 0.0
    steps: list[int] = []
    replays: list[tuple[int, float, float]] = []
    errors = []
    for f in parts:
        o = outcomes.get((f.lo, f.hi))
        wa = o.attribution if o is not None else None
        if wa is None:
            continue
        errors.append(wa.error_pct)
        window_steps = [s for s in range(f.lo, f.hi + 1) if s in step_time and np.isfinite(step_time[s])]
        hit = window_steps if f.persistent else [s for s in f.steps if s in step_time and np.isfinite(step_time[s])]
        gain = max(f.gain_s, 0.0)
        # an intermittent group costs what it cost in its own steps; a persistent one its typical
        # gain in the steps that were not replayed (a checkpoint step, a warm-up one)
        hit_gains = [max(f.step_gain_s[s], 0.0) for s in hit if s in f.step_gain_s]
        other = float(np.median(hit_gains)) if hit_gains and not f.persistent else gain
        for s in hit:
            g = max(f.step_gain_s[s], 0.0) if s in f.step_gain_s else other
            extra += min(g, step_time[s])
            span += step_time[s]
            steps.append(s)
        for k, rec in zip(wa.steps, wa.recorded_s / 1e9):
            if len(replays) < 12:
                g = max(f.step_gain_s.get(int(k), gain), 0.0)
                replays.append((int(k), float(rec), float(rec) - min(g, float(rec))))
    cost = _Cost(extra, span, sorted(set(steps)), replays, float(np.median(errors)) if errors else float("nan"),
                 intermittent=not all(f.persistent for f in parts))
    cost.spread(step_time)
    return cost


def _candidate_cost(i: int, inc: Incident, outcomes: list[WindowOutcome], step_time: dict[int, float],
                    normal) -> tuple[_Cost | None, list[str]]:
    """The measured cost of candidate ``i``'s culprits in the windows its steps lie in, and the
    notes of the windows that could not measure it."""
    label = candidate_label(i)
    inc_steps = set(inc.steps or range(inc.start_step, inc.end_step + 1))
    parts: list[Finding] = []
    notes: list[str] = []
    by_window: dict[tuple[int, int], WindowOutcome] = {}
    for o in outcomes:
        span = set(range(o.lo, o.hi + 1))
        if not span & inc_steps:
            continue
        by_window[(o.lo, o.hi)] = o
        if not o.modeled:
            notes.append(o.note or "not attributed")
            continue
        wa = o.attribution
        assert wa is not None
        shares = [s for s in wa.shares if s.label == label]
        if not shares:
            continue
        if inc.klass == IncidentClass.LINK_DEGRADATION:  # a link costs what its transfers take
            shares = [s for s in shares if s.kind == GroupKind.TRANSFERS] or shares
        else:
            shares = [s for s in shares if s.kind != GroupKind.TRANSFERS] or shares
        wanted = Part.HOST if inc.klass == IncidentClass.HOST_STALL else Part.WORKER
        best = max(shares, key=lambda s: (s.part == wanted, float(np.mean(s.per_step_gain_s or [0.0]))))
        if inc.klass == IncidentClass.HOST_STALL:  # a stall may sit in a phase or between phases
            best = max(shares, key=lambda s: float(np.mean(s.per_step_gain_s or [0.0])))
        gain = float(np.mean(best.per_step_gain_s)) if best.per_step_gain_s else 0.0
        # its steps, and the steps its excess cost (a rank frozen after its last collective makes
        # the others wait in the next step)
        costly = {int(k) for k, g_, r in zip(wa.steps, best.per_step_gain_s, wa.recorded_s / 1e9)
                  if r > 0 and g_ >= 0.02 * r}
        hit = sorted((inc_steps & span) | costly)
        persistent = len(hit) >= 0.6 * (o.hi - o.lo + 1)
        persistent = persistent and not (inc.klass == IncidentClass.HOST_STALL and inc.steps)
        parts.append(Finding(best.part, Shape.RANKS, str(inc.klass), list(inc.culprit_ranks), inc.phase, best.share,
                             1.0, gain, hit, o.lo, o.hi, label, {"persistent": persistent},
                             {int(k): float(x) for k, x in zip(wa.steps, best.per_step_gain_s)}))
    if not parts:
        return None, notes
    return _cost(parts, by_window, step_time, normal), notes


def _critical(outcomes: list[WindowOutcome], steps: list[int], top: int = 8) -> dict | None:
    """The critical path of ``steps`` (of the windows holding them): each rank's share of it,
    averaged over those steps — not over their windows, where the steps between a recurring
    stall's occurrences (whoever happened to be last there) would dilute it."""
    modeled = [o.attribution for o in outcomes if o.modeled and o.attribution is not None]
    wanted = set(steps)
    owns = [own for wa in modeled for step, own in wa.critical.items() if step in wanted]
    if not owns:  # none of its steps replayed (irregular ones are not): its windows' steps
        owns = [own for wa in modeled if any(wa.lo <= s <= wa.hi for s in steps) for own in wa.critical.values()]
    if not owns:
        return None
    shares: dict[int, float] = {}
    for own in owns:
        for r, v in own.items():
            shares[r] = shares.get(r, 0.0) + v
    n = len(owns)
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])[:top]
    first = next((s for s in steps), None)
    return {"level": Level.L4, "kind": EvidenceKind.CRITICAL_PATH, "step": first,
            "by_rank": [{"rank": int(r), "share": round(v / n, 4)} for r, v in ranked],
            "note": "share of the recorded steps' critical path spent in each rank's own work (the rank the others "
                    "waited for at each synchronisation), from the replayed dependency graph"}


def _what_if(cost: _Cost, world: int, note: str) -> dict:
    """The ``what_if`` evidence the report charts: recorded steps against the steps without the group."""
    return {"level": Level.L4, "kind": EvidenceKind.WHAT_IF, "steps": [r[0] for r in cost.replays],
            "step_s": [round(r[1], 6) for r in cost.replays],
            "without_fault_s": [round(r[2], 6) for r in cost.replays],
            "replay_error_pct": [round(cost.error_pct, 2)], "covers_steps": len(cost.steps),
            "extra_s": round(cost.extra_s, 6), "slowdown_pct": round(cost.slowdown_pct, 3),
            "gpu_hours_lost": round(world * cost.extra_s / 3600.0, 6), "note": note}


def _attribution_evidence(m: _Merged, outcomes: dict[tuple[int, int], WindowOutcome]) -> dict:
    top = max(m.parts, key=lambda f: f.gain_s)
    o = outcomes.get((top.lo, top.hi))
    wa = o.attribution if o is not None else None
    shares = []
    if wa is not None:
        part_shares = sorted(wa.of(top.part), key=lambda s: -s.share)
        shares = [s.to_json() for s in part_shares[:8]]
    out = {"level": Level.L4, "kind": EvidenceKind.ATTRIBUTION, "part": m.part, "shape": m.shape,
           "group": m.label, "culprits": m.culprits[:64], "share": round(m.share, 3),
           "slowdown": round(m.slowdown, 4), "windows": [list(w) for w in m.windows][:16],
           "persistent": m.persistent, **({k: v for k, v in top.detail.items() if k not in ("group",)}),
           "shares": shares}
    if wa is not None:
        out["job"] = wa.to_json()  # the window the group costs most in: its steps, slowdowns, fidelity
    out["note"] = ("each group's recorded durations replaced by its peers' typical ones (its stage balanced, for a "
                   "stage), the step replayed through the job's collectives and pipeline transfers; share = the part "
                   "of the slowdown that group's fix recovers")
    return out


def _matches(inc: Incident, m: _Merged) -> bool:
    """One fault, one incident: a finding on the same culprits (overlapping ranks, overlapping
    steps) is the candidate's, whatever each named it — the rule's class stands, with more
    evidence behind it (kernels, stacks, host phases)."""
    if not set(inc.culprit_ranks) & set(m.culprits):
        return False
    if not any(inc.start_step <= f.hi and inc.end_step >= f.lo for f in m.parts):
        return False
    if inc.klass == IncidentClass.LINK_DEGRADATION:
        return m.shape == Shape.COMMUNICATOR
    # a stage that turns slow mid-run is its ranks' fault, which the rules name (a partition does not change)
    return m.shape == Shape.RANKS or (m.shape == Shape.STAGE and inc.klass != IncidentClass.HOST_STALL)


def arbitrate(candidates: list[Incident], outcomes: list[WindowOutcome], topology: Topology, l1: L1Result,
              step_time: dict[int, float]) -> tuple[list[Incident], list[Observation]]:
    """The diagnosis' incidents from the rules' ``candidates`` and the windows' attributions, and
    what was measured but is no incident (variance on every worker below a claim)."""
    world = topology.world_size
    normal = l1.is_normal_step
    by_window = {(o.lo, o.hi): o for o in outcomes}
    merged = _merge(outcomes)
    used: set[int] = set()
    out: list[Incident] = []
    observations: list[Observation] = []
    for i, inc in enumerate(candidates):
        if inc.klass not in SLOW_CLASSES:
            out.append(inc)
            continue
        if inc.klass in (IncidentClass.COMPUTE_STRAGGLER, IncidentClass.PIPELINE_IMBALANCE,
                         IncidentClass.HOST_STALL) and _follows_inputs(inc, outcomes):
            observations.append(Observation(
                ObservationKind.VARIANCE, tuple(inc.culprit_ranks), (inc.slowdown_pct or 0.0) / 100.0,
                f"steps {inc.start_step}–{inc.end_step}: ranks {', '.join(map(str, inc.culprit_ranks[:8]))} ran "
                f"longer than their peers, every stage of their pipeline line together and more in some steps than "
                f"others — their inputs were longer, not their devices slower", phase=inc.phase))
            continue
        match = [j for j, m in enumerate(merged) if j not in used and _matches(inc, m)]
        for j in match:
            used.add(j)
            m = merged[j]
            inc.evidence.append(_attribution_evidence(m, by_window))
            if m.shape == Shape.COMMUNICATOR and set(m.culprits) < set(inc.culprit_ranks):
                # the communicator the attribution names, not every rank of the hosts it crosses
                inc.culprit_ranks = sorted(m.culprits)
                inc.hosts = sorted({str(topology.hosts[r]) for r in m.culprits})
                inc.gpus = [str(topology.gpu_uuids[r]) for r in inc.culprit_ranks]
        cost: _Cost | None
        notes: list[str] = []
        if match:
            # the candidate's own culprits were evaluated in every window its steps reach; the
            # finding only where it stood out
            cost, notes = _candidate_cost(i, inc, outcomes, step_time, normal)
            if cost is None or not cost.steps:
                cost = _cost([f for j in match for f in merged[j].parts], by_window, step_time, normal)
        elif _kernels_only(inc):
            cost, notes = None, [("the culprits' phases carry no excess (only their kernels do: a GPU trace's "
                                  "annotations end when the host is done launching): a replay of the phases cannot "
                                  "remove it")]
        elif inc.klass != IncidentClass.LINK_DEGRADATION and _own_peers(inc, topology):
            cost, notes = None, [("the culprits are most of their own peer sets (a whole stage, a whole replica): "
                                  "the what-if's typical durations come from them, so it cannot measure them")]
        elif inc.klass == IncidentClass.LINK_DEGRADATION and _most_communicators(inc, topology):
            # a link's transfers are set to the other communicators of its kind: where most of
            # them hold a culprit, their typical is the slow link's own
            cost, notes = None, [("most communicators of the slow collectives' kind cross the culprits: the "
                                  "what-if's typical transfers come from them, so it cannot measure the link")]
        else:
            cost, notes = _candidate_cost(i, inc, outcomes, step_time, normal)
        if cost is not None and inc.klass == IncidentClass.LINK_DEGRADATION and inc.slowdown_pct is not None \
                and cost.slowdown_pct < inc.slowdown_pct:
            # a link every communicator of its kind crosses has no healthy like to be set to: the
            # rules' measurement (against clean steps, the costliest collective's excess) stands
            notes = [f"the what-if measures {cost.slowdown_pct:.1f}% (its communicators' typical transfer holds the "
                     f"slow link when every group of the kind crosses it); the comparison's "
                     f"{inc.slowdown_pct:.1f}% stands"]
            inc.evidence.append(_what_if(cost, world, notes[0]))
            cost = None
        observed = _no_progress_s(inc)
        if cost is not None and observed is not None and cost.extra_s < 0.5 * observed:
            # the processor watched every other rank wait, blocked, this long: the replayed steps
            # hold only part of it (a rank frozen after its step's last collective: the others wait
            # in the next step's), so the impact stays the one observed
            inc.evidence.append({"level": Level.L4, "kind": EvidenceKind.WHAT_IF_SKIPPED, "note": (
                f"the processor saw the job make no progress for {observed:.0f} s; replayed, the incident's steps "
                f"give back {cost.extra_s:.2f} s (the wait fell in another step): the impact is the one observed")})
            out.append(inc)
            continue
        if (cost is None or not cost.steps) and observed is not None:
            notes = [f"the processor saw the job make no progress for {observed:.0f} s, and no window's replay "
                     "could measure it: the impact is the one observed"]
        if cost is not None and cost.steps and _replay_blind(inc, cost, l1, step_time, candidates):
            # L1 measured these steps slower than the job's healthy level, the replay without the
            # culprits' excess leaves them as slow, and nothing else explains them: the excess sits
            # where the phases do not hold it (device time behind host-timed annotations,
            # asynchronous launches) — the replay may not lower what was measured
            notes = [f"replayed without the culprits' excess the steps stay as slow as recorded ({cost.slowdown_pct:.1f}% "
                     "gained), above the job's healthy level, and no other incident explains them: the replayed "
                     "phases do not hold the excess"]
            inc.evidence.append(_what_if(cost, world, notes[0]))
            cost = None
        if cost is None or not cost.steps:
            if notes:
                inc.evidence.append({"level": Level.L4, "kind": EvidenceKind.WHAT_IF_SKIPPED,
                                     "note": notes[0] + "; the impact is L1's"})
            out.append(inc)
            continue
        _set_impact(inc, cost, world, "measured: the job replayed through its dependencies without these culprits' "
                                      "excess")
        _with_critical(inc, outcomes)
        out.append(inc)
    for j, m in enumerate(merged):
        if j in used:
            continue
        made = _from_finding(m, by_window, topology, step_time, normal)
        if made is None:
            continue
        if m.shape == Shape.SPREAD and made.severity == Severity.INFO:
            # legitimate variance, or a noisy host: measured and shown, never an incident
            observations.append(Observation(ObservationKind.VARIANCE, (), (made.slowdown_pct or 0.0) / 100.0,
                                            f"steps {made.start_step}–{made.end_step}: {made.summary}",
                                            phase="every worker"))
            continue
        _with_critical(made, outcomes)
        out.append(made)
    out = fold_spread_into_links(fold_stage_into_links(_one_per_fault(out)))
    job = _unexplained(out, l1, outcomes, world, step_time)
    if job is not None:
        out.append(job)
    return out, observations


def _one_per_fault(incidents: list[Incident]) -> list[Incident]:
    """Two incidents of one class on the same culprits over overlapping steps are one fault (a live
    hang snapshot's and the phases' view of one frozen rank): the more severe stays, and holds the
    other's evidence it lacks."""
    order = {s: i for i, s in enumerate(Severity)}
    kept: list[Incident] = []
    for inc in sorted(incidents, key=lambda i: -order[i.severity]):
        twin = next((k for k in kept if k.klass == inc.klass and k.culprit_ranks and
                     sorted(k.culprit_ranks) == sorted(inc.culprit_ranks) and
                     k.start_step <= inc.end_step and k.end_step >= inc.start_step), None)
        if twin is None:
            kept.append(inc)
            continue
        have = {e.get("kind") for e in twin.evidence}
        twin.evidence += [e for e in inc.evidence if e.get("kind") not in have]
    position = {id(i): n for n, i in enumerate(incidents)}
    return sorted(kept, key=lambda i: position[id(i)])


def _with_critical(inc: Incident, outcomes: list[WindowOutcome]) -> None:
    if inc.klass in (IncidentClass.COMPUTE_STRAGGLER, IncidentClass.PIPELINE_IMBALANCE, IncidentClass.HOST_STALL):
        crit = _critical(outcomes, inc.steps or list(range(inc.start_step, inc.end_step + 1)))
        if crit is not None:
            inc.evidence.append(crit)


def _set_impact(inc: Incident, cost: _Cost, world: int, note: str) -> None:
    previous, previous_severity = inc.slowdown_pct, inc.severity
    inc.evidence.append({"level": Level.L1, "kind": EvidenceKind.IMPACT_ESTIMATE,
                         "slowdown_pct": None if previous is None else round(float(previous), 4),
                         "gpu_hours_lost": None if inc.gpu_hours_lost is None else round(float(inc.gpu_hours_lost), 4),
                         "note": "L1's estimate (superseded by the measured what-if)"})
    inc.evidence.append(_what_if(cost, world, note))
    inc.slowdown_pct, inc.gpu_hours_lost = cost.slowdown_pct, world * cost.extra_s / 3600.0
    severity = grade(cost.slowdown_pct)
    if inc.claim_cap is not None and inc.claim_cap.value != severity.value and \
            list(Severity).index(inc.claim_cap) < list(Severity).index(severity):
        severity = inc.claim_cap  # the rule's evidence is too thin to claim more, whatever it costs
    if previous_severity == Severity.INFO and inc.steps:
        # intermittent, and the rule itself did not claim it (real loopback transfers vary step to
        # step): measured, not raised; a persistent one the rule under-rated is raised
        severity = Severity.INFO
    inc.severity = severity
    if previous_severity != Severity.INFO and inc.severity == Severity.INFO:
        inc.state = State.INCONCLUSIVE
        inc.evidence.append({"level": Level.L4, "kind": EvidenceKind.DISAGREEMENT, "note": (
            ("the comparison charged these ranks" if previous is None else
             f"the comparison charged {previous:.1f}% to these ranks") +
            f"; replayed without their excess the job gains {cost.slowdown_pct:.1f}%: the slowdown is not theirs")})


_ACTIONS = {IncidentClass.COMPUTE_STRAGGLER: Action.VERIFY, IncidentClass.LINK_DEGRADATION: Action.VERIFY,
            IncidentClass.HOST_STALL: Action.RAISE_TRACE_FIDELITY, IncidentClass.PIPELINE_IMBALANCE: Action.OBSERVE,
            IncidentClass.INPUT_IMBALANCE: Action.OBSERVE}


def _from_finding(m: _Merged, outcomes: dict[tuple[int, int], WindowOutcome], topology: Topology,
                  step_time: dict[int, float], normal) -> Incident | None:
    cost = _cost(m.parts, outcomes, step_time, normal)
    if not cost.steps:
        return None
    world = topology.world_size
    klass = IncidentClass(m.klass)
    # balanced in a later window: a partition does not change, so not the layers (a noisy
    # start, a victim of something else told elsewhere)
    transient_stage = m.shape == Shape.STAGE and _balanced_after(m, outcomes)
    if m.shape == Shape.STAGE and _balanced_before(m, outcomes) and not transient_stage:
        # balanced in an earlier window and not since: a partition does not change, its ranks did
        klass = IncidentClass.COMPUTE_STRAGGLER
        m.phase = f"{m.phase} (slowed from step {m.windows[0][0]})"
    ranks = sorted(m.culprits)
    hosts = sorted({str(topology.hosts[r]) for r in ranks})
    steps = cost.steps
    evidence = [_attribution_evidence(m, outcomes), _what_if(cost, world, "the attribution's group removed")]
    summary = _summary(m, hosts, cost)
    severity = grade(cost.slowdown_pct)
    if m.shape == Shape.RANKS and not m.persistent and len(m.steps) < MIN_RECURRING_STEPS:
        # once or twice in the job, seen by no rule: a process descheduled for a slice of a step
        # on a shared host looks exactly like it — shown, not claimed
        severity = Severity.INFO
        summary += f"; in {len(m.steps)} step{'s' * (len(m.steps) != 1)} only, and no rule saw it: shown, not claimed"
    elif m.shape in (Shape.RANKS, Shape.STAGE, Shape.COMMUNICATOR) and len(m.windows) < 2 \
            and not _unmistakable(m, cost):
        # one window of one comparison: a shared host's CPU does this for a few seconds now and
        # then, to work and to loopback transfers alike (CI's unthrottled netns pipeline: one
        # pipeline line's sends 1.5x the others' in steps 1-4 only, +3.0%) — shown, watched for a
        # second window, not claimed
        severity = Severity.INFO
        summary += "; seen in one window only, and not far enough from its peers to claim on that alone"
    elif (weather := _weather(m, outcomes)) is not None:
        # one rank's work spiking now and then, in a job where every rank's does
        severity = Severity.INFO
        spike, others = weather
        summary += (f"; intermittent, its largest spike ({spike * 1e3:.0f} ms over its peers) under "
                    f"{WEATHER_MULTIPLE:g}× the largest other ranks had in the run ({others * 1e3:.0f} ms): "
                    "the job's own weather, shown, not claimed")
    elif m.shape == Shape.RANKS and not m.persistent and (cost.slowdown_pct < INTERMITTENT_CLAIM_PCT or (
            not _unmistakable(m, cost) and m.part == Part.WORKER) or _within_scheduling(cost)):
        # some steps' work a little longer now and then, which no rule's comparison saw: what
        # preemption on a shared host looks like (6 ranks on 2 vCPUs: 11% in a healthy job) —
        # shown, not claimed; work outside every phase, recurring, still claims from 5%. Below
        # 5% not even a large ratio claims: a couple of ms descheduled in a 3 ms phase reads 3×
        # (CI's throttled-link drill: ranks 2 and 3 "stalled" 3 steps at +4.4%); nor does time
        # outside the phases that costs less a step than one scheduling period
        severity = Severity.INFO
        summary += "; intermittent, not far from its peers, and no rule saw it: not told from a shared host's scheduling noise"
    if transient_stage:
        severity = Severity.INFO
        summary += (f"; only in steps {m.windows[0][0]}–{m.windows[-1][1]}, balanced after: "
                    "not the partition, shown, not claimed")
    if m.shape == Shape.SPREAD:
        if not all(f.detail.get("inputs_told") for f in m.parts):
            severity = Severity.INFO  # uneven inputs and a noisy host cannot be told apart here
            summary += "; without a pipeline, uneven inputs and a noisy host look alike here: shown, not claimed"
        else:
            # legitimate data-dependent variance: reported, never blamed on a node — a warning only
            # once it costs a fifth of the job (worth packing the inputs), else an observation
            severity = Severity.WARNING if cost.slowdown_pct >= SPREAD_WARNING_PCT else Severity.INFO
            if severity != Severity.INFO and len(m.windows) < 2:
                # a job's inputs are uneven in every window; one window of it on a shared host is
                # its weather (CI's unthrottled netns pipeline: +22% in steps 20–24 alone)
                severity = Severity.INFO
                summary += "; seen in one window only: shown, watched for a second window, not claimed"
    inc = Incident(klass, ranks, hosts, [str(topology.gpu_uuids[r]) for r in ranks], steps[0], steps[-1], m.phase,
                   [], State.SUSPECTED, severity, cost.slowdown_pct, world * cost.extra_s / 3600.0,
                   _ACTIONS.get(klass, Action.OBSERVE), evidence, steps if not m.persistent else [], summary)
    return inc


def _summary(m: _Merged, hosts: list[str], cost: _Cost) -> str:
    ranks = ", ".join(map(str, m.culprits[:8])) + ("…" if len(m.culprits) > 8 else "")
    where = f" on {', '.join(hosts[:3])}" if hosts else ""
    gain = f"without it the job runs ×{m.slowdown:.2f} faster in those steps ({cost.slowdown_pct:.1f}% of its time)"
    if m.shape == Shape.STAGE:
        return (f"pipeline {m.phase} holds more work than the others (every replica: ranks {ranks}): the step "
                f"replayed with the stages' work balanced is ×{m.slowdown:.2f} faster; move layers off {m.phase}")
    if m.shape == Shape.SPREAD:
        return (f"variance on every worker costs the job ×{m.slowdown:.2f}: no rank, host or link explains it "
                "(each rank's step-to-step fluctuation and many small differences): uneven inputs, no node is at fault")
    if m.shape == Shape.COMMUNICATOR:
        return f"transfers of {m.label} (ranks {ranks}){where} are slow: {gain}"
    if m.part == Part.HOST:
        return (f"rank{'s' * (len(m.culprits) > 1)} {ranks}{where} spend time outside every recorded phase (work no "
                f"phase covers: a save, a busy thread, code after the optimizer) while the others wait: {gain}")
    if m.klass == IncidentClass.HOST_STALL:
        return f"rank{'s' * (len(m.culprits) > 1)} {ranks}{where} stall in {m.phase} now and then: {gain}"
    what = "one pass" if m.klass == IncidentClass.PIPELINE_IMBALANCE else "their work"
    return (f"rank{'s' * (len(m.culprits) > 1)} {ranks}{where} run {what} slower than their peers in {m.phase} "
            f"({'every step' if m.persistent else 'some steps'}): {gain}")


#: A whole-job slowdown ending this close to a failure that stopped the job is the failure's.
FAILURE_LEAD_STEPS = 3


def fold_into_failures(incidents: list[Incident]) -> list[Incident]:
    """A whole-job slowdown that runs into a rank's failure or a hang: the job's last steps as it
    died (a rank killed mid-step, the others slowed as it went): one fault, one incident — the
    failure's; the slowdown is kept as info and says so."""
    stops = [i for i in incidents if i.klass in (IncidentClass.FAIL_STOP, IncidentClass.HANG)]
    for inc in incidents:
        if inc.klass != IncidentClass.JOB_SLOWDOWN or inc.severity == Severity.INFO:
            continue
        stop = next((f for f in stops if f.start_step >= 0 and inc.end_step >= f.start_step - FAILURE_LEAD_STEPS
                     and inc.start_step <= max(f.end_step, f.start_step)), None)
        if stop is not None:
            inc.severity = Severity.INFO
            inc.summary += f"; it runs into the {stop.klass} at step {stop.start_step}: told there"
    return incidents


def fold_stage_into_links(incidents: list[Incident]) -> list[Incident]:
    """A stage that looks heavier while a link inside it is slow: its reductions and transfers
    wait on that link (the victim, not a partition) — one fault, one incident, the link's."""
    links = [i for i in incidents if i.klass == IncidentClass.LINK_DEGRADATION and i.severity != Severity.INFO]
    for inc in incidents:
        # a stage that slowed later is told as its ranks' compute straggler ("stage 1 (slowed
        # from step 10)"): the same stage shape, the same victim of the link in it
        if inc.klass not in (IncidentClass.PIPELINE_IMBALANCE, IncidentClass.COMPUTE_STRAGGLER) \
                or inc.severity == Severity.INFO or not inc.phase.startswith("stage "):
            continue
        link = next((k for k in links if set(k.culprit_ranks) & set(inc.culprit_ranks)
                     and k.start_step <= inc.end_step and k.end_step >= inc.start_step), None)
        if link is not None:
            inc.severity = Severity.INFO
            inc.summary += (f"; a slow link inside it (ranks {', '.join(map(str, link.culprit_ranks[:6]))}) holds "
                            "its transfers: told in the link's incident")
    return incidents


def fold_spread_into_links(incidents: list[Incident]) -> list[Incident]:
    """Variance on every worker inside the L1 regression a claimed link incident holds: a slow
    link on a pipeline line delays every stage of that line together, step by step, which is
    what uneven inputs look like (CI's 6-host drill: host 4 throttled from step 7, its
    transfers named from step 13, "uneven inputs" at +20% over steps 5–14) — one fault, one
    incident, the link's."""
    links = [i for i in incidents if i.klass == IncidentClass.LINK_DEGRADATION and i.severity != Severity.INFO
             and i.culprit_ranks]
    for inc in incidents:
        if inc.klass != IncidentClass.INPUT_IMBALANCE or inc.severity == Severity.INFO:
            continue
        for link in links:
            spans = [(int(e["start_step"]), int(e["end_step"])) for e in link.evidence
                     if e.get("kind") == EvidenceKind.REGRESSION and "start_step" in e and "end_step" in e]
            lo, hi = min((a for a, _ in spans), default=link.start_step), max((b for _, b in spans), default=link.end_step)
            if lo <= inc.end_step and hi >= inc.start_step:
                inc.severity = Severity.INFO
                inc.summary += (f"; yet it lies inside the slowdown (steps {lo}–{hi}) of the slow link on "
                                f"rank{'s' * (len(link.culprit_ranks) > 1)} "
                                f"{', '.join(map(str, link.culprit_ranks[:6]))}, which delays its pipeline line as "
                                "uneven inputs would: told in the link's incident")
                break
    return incidents


def _unexplained(incidents: list[Incident], l1: L1Result, outcomes: list[WindowOutcome], world: int,
                 step_time: dict[int, float]) -> Incident | None:
    """An L1 regression no incident above info covers: the whole job slowed, and the attribution's
    ruled-out parts say what it is not."""
    regs = [w for w in l1.windows if w.kind == "regression" and np.isfinite(w.magnitude)
            and w.magnitude >= UNEXPLAINED_REGRESSION]
    for w in regs:
        # covered by an incident that claims it, or one whose evidence was too thin to claim more
        covered = any((i.severity != Severity.INFO or i.claim_cap is not None)
                      and i.start_step <= w.end_step and i.end_step >= w.start_step for i in incidents)
        if covered:
            continue
        before = [s for s in step_time if s < w.start_step and l1.is_normal_step(s) and np.isfinite(step_time[s])]
        if len(before) < MIN_HEALTHY_BEFORE:
            continue  # slower early steps and a faster job later: a long warm-up, not a slowdown
        if not _beyond_noise(w, l1, step_time):
            continue
        modeled = [o for o in outcomes if o.modeled and o.lo <= w.end_step and o.hi >= w.start_step]
        steps = [s for s in range(w.start_step, w.end_step + 1) if np.isfinite(step_time.get(s, np.nan))]
        if not steps:
            continue
        base = l1.baseline_s
        extra = sum(max(step_time[s] - base, 0.0) for s in steps) if np.isfinite(base) else 0.0
        span = sum(step_time[s] for s in steps)
        pct = 100.0 * extra / max(span - extra, 1e-12) if span > 0 else 0.0
        ruled = []
        for o in modeled[:4]:
            wa = o.attribution
            assert wa is not None
            ruled.append({"window": [o.lo, o.hi], "worker": round(wa.s_worker, 3), "stage": round(wa.s_stage, 3),
                          "host": round(wa.s_host, 3)})
        evidence = [{"level": Level.L1, **w.to_json()},
                    {"level": Level.L4, "kind": EvidenceKind.ATTRIBUTION, "part": "job", "shape": "none",
                     "group": "every rank", "culprits": [], "share": 0.0, "slowdown": round(float(w.magnitude), 3),
                     "windows": [r["window"] for r in ruled], "ruled_out": ruled,
                     "note": "within these steps no rank, host, stage or communicator is slower than its peers by "
                             "more than noise: the regression is the whole job's"}]
        summary = (f"the whole job slowed ×{w.magnitude:.2f} from step {w.start_step}"
                   + (": no rank, host, stage or link stands out from its peers (ruled out by the attribution in "
                      f"{len(ruled)} window{'s' * (len(ruled) != 1)})" if ruled else
                      ": no window could be attributed to tell who"))
        last = max((s for s, t in step_time.items() if np.isfinite(t)), default=w.end_step)
        severity = grade(pct)
        if len(steps) < TRANSIENT_JOB_STEPS or span < TRANSIENT_JOB_S:
            # every rank alike for a while, no one to name: a shared cluster's load, a burst of
            # long inputs, the disk under a checkpoint — shown; graded once it lasts
            severity = Severity.INFO
            took = f"{len(steps)} step{'s' * (len(steps) != 1)} ({span:.1f} s)"
            summary += (f"; recovered by itself after {took}" if w.end_step < last
                        else f"; {took} so far") + ": shown, not claimed"
        return Incident(IncidentClass.JOB_SLOWDOWN, [], [], [], w.start_step, w.end_step, "step", [],
                        State.SUSPECTED, severity, pct, world * extra / 3600.0, Action.OBSERVE, evidence, steps,
                        summary)
    return None


#: … and its shift at least this many times the healthy steps' own robust spread (CV).
NOISE_MULTIPLE = 3.0


def _beyond_noise(w, l1: L1Result, step_time: dict[int, float]) -> bool:
    """Whether an L1 regression stands out from how much the job's normal steps outside it vary
    (a shared host's speed drifts by a fifth for seconds at a time: not a job slowdown)."""
    outside = np.array([t for s, t in step_time.items() if np.isfinite(t) and l1.is_normal_step(s)
                        and not (w.start_step <= s <= w.end_step)])
    if outside.size < MIN_HEALTHY_BEFORE:
        return False
    med = float(np.median(outside))
    cv = 1.4826 * float(np.median(np.abs(outside - med))) / med if med > 0 else np.inf
    return float(w.magnitude) - 1.0 >= NOISE_MULTIPLE * cv


#: An intermittent finding no rule saw claims only over at least this many steps …
MIN_RECURRING_STEPS = 3
#: … and from this cost on (or when unmistakable).
INTERMITTENT_CLAIM_PCT = 5.0
#: A finding seen in one window claims when its ranks' work is this many times their peers' …
UNMISTAKABLE_RATIO = 2.0
#: … or their time outside the phases this share of a step; intermittent, only where it costs
#: the job more a step than a rank descheduled for one scheduling period loses (CFS's latency
#: target, 24 ms on 8+ CPUs): a 6 ms phase read 12 ms on a rank preempted in 3 of a CI job's
#: steps (ratio 2.01, 13 ms a step), on a 2-vCPU machine running 4 ranks and their processor.
UNMISTAKABLE_SHARE = 0.5
SCHEDULING_PERIOD_S = 0.024


def _within_scheduling(cost: _Cost) -> bool:
    """Whether an intermittent cost is, a step, no more than one descheduled scheduling period."""
    return cost.extra_s < SCHEDULING_PERIOD_S * max(len(cost.steps), 1)


#: An intermittent spike of one rank's own work that no rule saw claims only when it is this
#: many times the largest spike the other ranks had anywhere in the run: on a shared host every
#: rank is descheduled now and then, and the one that happened to be hit worst is no culprit (a
#: 4-rank job with uneven inputs on 2 vCPUs: each rank's work 1.5–1.9× its peers' in some step,
#: the worst 2.3–2.9×, 45–68 ms against the others' 30–36 ms; CI's 6-host link drill: rank 0 93 ms
#: in two windows against 53–67 ms on three other ranks); a stall of the rank's own is not bounded
#: by the scheduler's slices (a GIL-holding thread: 360–790 ms against the others' ≤ 81 ms).
WEATHER_MULTIPLE = 3.0


def _weather(m: _Merged, outcomes: dict[tuple[int, int], WindowOutcome]) -> tuple[float, float] | None:
    """(the culprits' largest step excess, the other ranks' largest) where an intermittent
    worker finding is within ``WEATHER_MULTIPLE`` of the job's own spikes; else None."""
    if m.shape != Shape.RANKS or m.persistent or m.part != Part.WORKER:
        return None
    culprits = set(m.culprits)
    mine = others = 0.0
    for (lo, hi), o in outcomes.items():
        wa = o.attribution
        if not o.modeled or wa is None or wa.work_excess_steps_s.size == 0:
            continue
        peak = np.nanmax(np.where(np.isfinite(wa.work_excess_steps_s), wa.work_excess_steps_s, -np.inf), axis=1)
        is_culprit = np.isin(wa.ranks, list(culprits))
        if (lo, hi) in m.windows and is_culprit.any():
            mine = max(mine, float(peak[is_culprit].max()))
        if (~is_culprit).any():
            others = max(others, float(peak[~is_culprit].max()))
    if mine <= 0 or others <= 0 or mine >= WEATHER_MULTIPLE * others:
        return None
    return mine, others


def _unmistakable(m: _Merged, cost: _Cost | None = None) -> bool:
    if cost is not None and not m.persistent and _within_scheduling(cost):
        return False
    return any(float(f.detail.get("ratio") or 0.0) >= UNMISTAKABLE_RATIO
               or float(f.detail.get("step_share") or 0.0) >= UNMISTAKABLE_SHARE for f in m.parts)


def _balanced_before(m: _Merged, outcomes: dict[tuple[int, int], WindowOutcome]) -> bool:
    """Whether a modeled window before the stage finding's first one had its stages balanced."""
    first = m.windows[0][0]
    return _balanced(o for (lo, _), o in outcomes.items() if lo < first)


def _balanced_after(m: _Merged, outcomes: dict[tuple[int, int], WindowOutcome]) -> bool:
    """Whether a modeled window after the stage finding's last one had its stages balanced."""
    last = m.windows[-1][1]
    return _balanced(o for (lo, _), o in outcomes.items() if lo > last)


def _balanced(windows) -> bool:
    """Whether one of these windows, modeled and long enough to make a finding, had its stages
    balanced: a window too short to find an imbalance is too short to clear one (the job's last
    step alone, a 5-step window's tail, read ×1.05 to ×1.19 in four runs of a ×1.12 partition)."""
    return any(o.attribution.s_stage < MIN_STAGE_SLOWDOWN for o in windows
               if o.modeled and o.attribution is not None and len(o.attribution.steps) >= MIN_FINDING_STEPS)


def _replay_blind(inc: Incident, cost: _Cost, l1: L1Result, step_time: dict[int, float],
                  candidates: list[Incident]) -> bool:
    """Whether the what-if cannot see what L1 measured on the candidate's steps (see ``arbitrate``)."""
    base = l1.baseline_s
    if not (np.isfinite(base) and base > 0) or grade(inc.slowdown_pct) == Severity.INFO:
        return False
    if grade(cost.slowdown_pct) != Severity.INFO:
        return False
    steps = [s for s in cost.steps if np.isfinite(step_time.get(s, np.nan))]
    if not steps:
        return False
    recorded = float(np.median([step_time[s] for s in steps]))
    gained = cost.extra_s / len(steps)
    excess = recorded - base
    if excess < 0.05 * base or (recorded - gained) - base < 0.5 * excess:
        return False
    return not any(o is not inc and o.severity != Severity.INFO and o.klass in SLOW_CLASSES
                   and o.start_step <= steps[-1] and o.end_step >= steps[0] for o in candidates)


def _follows_inputs(inc: Incident, outcomes: list[WindowOutcome]) -> bool:
    """Whether a compute candidate's excess is its inputs': in a pipeline, the culprits' work moves
    with their line partners' (a long microbatch lengthens every stage it passes through) and
    from step to step (a slow device is slow in every step)."""
    votes = []
    for o in outcomes:
        wa = o.attribution
        if not o.modeled or wa is None or not wa.line.size or not (inc.start_step <= o.hi and inc.end_step >= o.lo):
            continue
        if len(sorted_unique(wa.stage)) < 2 or wa.work_ratio.shape[1] < 3:
            continue
        col = {int(r): c for c, r in enumerate(wa.ranks.tolist())}
        for r in inc.culprit_ranks:
            c = col.get(int(r))
            if c is None:
                continue
            row = wa.work_ratio[c]
            partners = np.flatnonzero((wa.stage != wa.stage[c]) & (wa.line == wa.line[c]))
            if not partners.size or not np.isfinite(row).all():
                continue
            other = np.nanmax(wa.work_ratio[partners], axis=0)
            excess = row - 1.0
            steps = excess > 0.1
            if steps.sum() < 2:
                continue
            together = float(((other - 1.0)[steps] >= 0.5 * excess[steps]).mean())
            varies = float(np.std(row)) >= 0.5 * max(float(np.mean(row)) - 1.0, 1e-9)
            votes.append(together >= 2 / 3 and varies)
    return bool(votes) and float(np.mean(votes)) >= 0.5


def _kernels_only(inc: Incident) -> bool:
    """A compute finding seen only in the culprits' kernels: their host-timed phases do not hold
    the excess, so the graph of phases cannot show what removing it gains."""
    return inc.klass in (IncidentClass.COMPUTE_STRAGGLER, IncidentClass.PIPELINE_IMBALANCE) and not any(
        e.get("kind") == EvidenceKind.BUSY_OUTLIER for e in inc.evidence)


def _own_peers(inc: Incident, topology: Topology) -> bool:
    """Whether the culprits are at least half of some culprit's peer set (same stage, same tp
    shard): then the peers' typical is theirs, and no what-if against it measures them."""
    layout = topology.layout
    culprits = set(inc.culprit_ranks)
    for r in list(culprits)[:64]:
        if not 0 <= r < layout.world_size:
            continue
        peers = set(int(p) for p in layout.peer_set(r))
        if len(peers) > 1 and len(peers & culprits) >= 0.5 * len(peers):
            return True
    return False


def _most_communicators(inc: Incident, topology: Topology) -> bool:
    """Whether at least half of the communicators of a link incident's kinds (its evidence's
    ``group_kind``, else data-parallel) hold one of its culprits."""
    layout = topology.layout
    culprits = np.array([r for r in inc.culprit_ranks if 0 <= r < layout.world_size], np.int64)
    if culprits.size == 0:
        return False
    kinds = {str(e["group_kind"]) for e in inc.evidence if e.get("group_kind") in GROUP_KINDS} or {GK.DP}
    for kind in kinds:
        index = layout.group_index(kind)
        if sorted_unique(index[culprits]).size >= 0.5 * sorted_unique(index).size:
            return True
    return False


def _no_progress_s(inc: Incident) -> float | None:
    """Seconds the processor saw the job make no progress in this incident (its hang snapshot's
    ``no_progress`` evidence: a frozen rank's stall), else None."""
    for e in inc.evidence:
        if e.get("kind") == EvidenceKind.NO_PROGRESS and isinstance(e.get("stalled_s"), (int, float)):
            return float(e["stalled_s"])
    return None
