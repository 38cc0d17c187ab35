"""Silent data corruption: replicas that stopped holding the same bits.

Data-parallel replicas hold bit-identical gradients after their all-reduce and bit-identical
parameters after the optimizer step (``argus/producer/replicas.py`` digests both every few
steps). Within each peer set (same stage, same TP shard) the digests of one check are
compared:

* A group is taken for replicas of a sensor's state only once its members were seen to agree
  on that sensor: a job whose ranks never agree (no gradient sync, a layout Argus was not told,
  sharded state it could not tell apart) is not a set of replicas, and saying nothing is right.
  Per sensor: all-reduced gradients agree by construction even where the parameters never did
  (a pipeline whose data-parallel copies were never initialised alike: a real 6-host job of
  three replicas per stage read as "stopped agreeing at step 0").
* A rank outvoted by a strict majority that agrees among itself is a **suspect**; with two
  replicas (or a tie) there is no majority, and both are named as candidates.
* **Confirmed** needs a second, independent check to outvote the same ranks: a parameter once
  wrong stays wrong, so a real corruption is seen again, while a digest miscomputed once is
  not. A numerical outlier (NaN/Inf on one replica only) is a heuristic warning, never confirmed.
* **Exposure** starts right after the last check at which every replica agreed: after a
  parameters check the next step, after a gradients check that very step (its optimizer step
  may be the one that went wrong). Checkpoints saved from then on are marked suspect, and the
  last one before is named to resume from.

A corruption of one rank's *local* values before the all-reduce (a wrong GEMM output in its
forward) is averaged into every replica alike and cannot be seen by comparing replicas. The
GEMM check sees it on the rank itself (``argus/producer/gemm_check.py``): a sampled layer's
output columns against its inputs, re-run at once where they disagree. Reproduced on the device
and contradicted by the host's float64 reference: **confirmed**; correct on the re-run (a
transient upset that cannot be reproduced): **inconclusive**; the reference agreeing with the
device: nothing (the bound, not the device, was wrong). Exposure starts at the step of the
wrong GEMM: its gradient went into every replica's update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State
from argus.store import Attempt
from argus.topology import Topology
from argus.vocab import EvidenceKind, GroupKind, Level, Rerun, Sensor
from argus.wire import SENSORS

__all__ = ["Check", "Checkpoints", "ReplicaVerdict", "checkpoints_from_log", "compare_replicas", "sdc_incidents",
           "gemm_incidents"]

_ORDER: dict[str, int] = {s: i for i, s in enumerate(SENSORS)}  # grads before params within a step


@dataclass(frozen=True, slots=True)
class Check:
    """One check of one peer group: every member's digest of one sensor at one step."""

    step: int
    sensor: str
    digests: dict[int, int]  # rank → digest
    nonfinite: dict[int, int]

    @property
    def order(self) -> tuple[int, int]:
        return self.step, _ORDER.get(self.sensor, len(_ORDER))

    def outvoted(self) -> tuple[list[int], bool]:
        """The ranks whose digest differs from the rest, and whether a strict majority that
        agrees says so (False: no majority, the differing set is the candidates)."""
        values, counts = np.unique(np.fromiter(self.digests.values(), np.uint64), return_counts=True)
        if len(values) == 1:
            return [], True
        top = int(np.argmax(counts))
        if counts[top] * 2 > len(self.digests) and (counts == counts[top]).sum() == 1:
            return sorted(r for r, d in self.digests.items() if d != int(values[top])), True
        return sorted(self.digests), False


@dataclass
class Checkpoints:
    """The job's checkpoints by the step they were recorded in, with the paths its log named
    (a checkpoint phase names none)."""

    paths: dict[int, list[str]] = field(default_factory=dict)

    def add(self, step: int, path: str | None = None) -> None:
        got = self.paths.setdefault(int(step), [])
        if path and path not in got and len(got) < 64:
            got.append(path)

    def exposure(self, start: int, last_agreed: dict | None) -> tuple[dict[str, Any], str]:
        """The exposure evidence from ``start`` on, and the sentence that says it."""
        steps = sorted(self.paths)
        tainted = [s for s in steps if s >= start]
        clean = [s for s in steps if s < start]
        resume = clean[-1] if clean else None
        evidence = {"level": Level.SDC, "kind": EvidenceKind.EXPOSURE, "first_step": start, "last_agreed": last_agreed,
                    "checkpoints_after": tainted[:64], "resume_from_step": resume,
                    "checkpoint_paths_after": [p for s in tainted for p in self.paths[s]][:32],
                    "resume_from_paths": self.paths[resume][:8] if resume is not None else []}
        text = f"exposure from step {start}: "
        if tainted:
            text += f"checkpoints recorded in steps {', '.join(map(str, tainted[:8]))} are suspect; "
        if resume is None:
            text += "no checkpoint before it is known"
        else:
            where = self.paths[resume]
            text += f"resume from the checkpoint recorded in step {resume}" + (f" ({where[0]}{', …' * (len(where) > 1)})"
                                                                             if where else "")
        return evidence, text


def checkpoints_from_log(attempt: Attempt, step_of_ts: Callable[[int, int], int]) -> Checkpoints:
    """Saves the job's own log reported (``argus run``'s logs table, kind ``checkpoint``), in the
    step each reporting rank was in, with the path the line named. A line that names no rank
    (trainers print without a prefix) is placed in the latest step any of a few ranks spread over
    the job was in: synchronous ranks are at most a step apart, and the rank that saved after step
    *s* had begun step *s + 1* (placed by rank 0 alone, a save that rank 0 lagged behind read as
    step *s*: then "not suspect" by a step)."""
    from argus.joblog.signatures import SIGNATURES, LogKind

    out = Checkpoints()
    if not attempt.files("logs"):
        return out
    pattern = next(s.pattern for s in SIGNATURES if s.kind == LogKind.CHECKPOINT)
    rows = attempt.read("logs", columns=["rank", "ts_ns", "kind", "text"]).to_pylist()
    world = attempt.layout.world_size
    spread = sorted({int(x) for x in np.linspace(0, world - 1, min(world, 8))})
    for r in rows:
        if r["kind"] != LogKind.CHECKPOINT:
            continue
        ranks = [int(r["rank"])] if r["rank"] is not None and 0 <= r["rank"] < world else spread
        step = max(step_of_ts(rank, int(r["ts_ns"])) for rank in ranks)
        if step >= 0:
            m = pattern.search(str(r["text"] or ""))
            out.add(step, m.group("path") if m else None)
    return out


@dataclass
class ReplicaVerdict:
    """What the checks of one peer group say."""

    group: list[int]
    checks: int = 0  # checks with every member present
    agreed: int = 0
    suspects: list[int] = field(default_factory=list)
    majority: bool = True
    first_bad: Check | None = None
    last_good: Check | None = None
    confirming: list[Check] = field(default_factory=list)  # later checks outvoting the same ranks
    nonfinite_only: list[int] = field(default_factory=list)  # ranks with NaN/Inf their peers lack
    nonfinite_step: int = -1


def _checks(attempt: Attempt) -> dict[tuple[int, str], dict[int, tuple[int, int]]]:
    """(step, sensor) → rank → (digest, nonfinite); several optimizers in a step are combined
    in the order they stepped, as every replica steps them."""
    t = attempt.read("checks", columns=["rank", "step", "ts_ns", "sensor", "tensors", "digest", "nonfinite"])
    if not t.num_rows:
        return {}
    cols = {c: t.column(c).to_numpy(zero_copy_only=False) for c in t.column_names}
    order = np.lexsort((cols["ts_ns"], cols["sensor"], cols["step"], cols["rank"]))
    out: dict[tuple[int, str], dict[int, tuple[int, int]]] = {}
    for i in order.tolist():
        if cols["tensors"][i] <= 0 or cols["sensor"][i] not in _ORDER or cols["sensor"][i] == Sensor.GEMM:
            continue
        key = (int(cols["step"][i]), str(cols["sensor"][i]))
        rank, d, bad = int(cols["rank"][i]), int(cols["digest"][i]) & ((1 << 64) - 1), int(cols["nonfinite"][i])
        prev = out.setdefault(key, {}).get(rank)
        if prev is not None:
            d, bad = hash((prev[0], d)) & ((1 << 64) - 1), prev[1] + bad
        out[key][rank] = (d, bad)
    return out


def compare_replicas(checks: dict[tuple[int, str], dict[int, tuple[int, int]]],
                     group: list[int]) -> ReplicaVerdict:
    """The verdict of one peer group over every check all its members took."""
    v = ReplicaVerdict(group=group)
    members = set(group)
    series = []
    for (step, sensor), by_rank in checks.items():
        if members <= by_rank.keys():
            series.append(Check(step, sensor, {r: by_rank[r][0] for r in group}, {r: by_rank[r][1] for r in group}))
    series.sort(key=lambda c: c.order)
    v.checks = len(series)
    proven: set[str] = set()  # sensors whose state the group was once seen to hold alike
    for c in series:
        odd, majority = c.outvoted()
        if not odd:
            v.agreed += 1
            proven.add(c.sensor)
            if v.first_bad is None:
                v.last_good = c
        elif c.sensor not in proven:  # never alike on this sensor: not replicas of it
            continue
        elif v.first_bad is None:
            v.first_bad, v.suspects, v.majority = c, odd, majority
        elif odd == v.suspects:
            v.confirming.append(c)
        bad = [r for r, n in c.nonfinite.items() if n > 0]
        if bad and len(bad) * 2 < len(group) and not v.nonfinite_only:
            v.nonfinite_only, v.nonfinite_step = sorted(bad), c.step
    return v


def _exposure_start(v: ReplicaVerdict) -> int:
    assert v.first_bad is not None
    if v.last_good is None:
        return v.first_bad.step
    return v.last_good.step + (1 if v.last_good.sensor == Sensor.PARAMS else 0)


def sdc_incidents(attempt: Attempt, topology: Topology, checkpoints: Checkpoints,
                  last_step: int) -> list[Incident]:
    """Incidents of replicas that stopped agreeing, with their exposure and tainted checkpoints."""
    incidents = gemm_incidents(attempt, topology, checkpoints, last_step)
    checks = _checks(attempt)
    if not checks:
        return incidents
    layout = topology.layout
    for row in layout.groups(GroupKind.DP):
        group = [int(r) for r in row]
        if len(group) < 2:
            continue
        v = compare_replicas(checks, group)
        if v.first_bad is not None:
            incidents.append(_incident(v, topology, checkpoints, last_step))
        elif v.nonfinite_only and v.agreed:
            incidents.append(_nonfinite(v, topology, last_step))
    return incidents


def gemm_incidents(attempt: Attempt, topology: Topology, checkpoints: Checkpoints,
                   last_step: int) -> list[Incident]:
    """One incident per rank whose sampled GEMMs broke their bound and were not cleared by the
    host's reference."""
    t = attempt.read("checks", columns=["rank", "step", "sensor", "violations", "rerun"])
    if not t.num_rows:
        return []
    rows = [r for r in t.to_pylist() if r["sensor"] == Sensor.GEMM]
    checked: dict[int, list[dict]] = {}
    for r in rows:
        checked.setdefault(int(r["rank"]), []).append(r)
    incidents = []
    for rank, mine in sorted(checked.items()):
        bad = sorted((r for r in mine if r["violations"] > 0 and r["rerun"] != Rerun.REFERENCE_AGREES),
                     key=lambda r: r["step"])
        if not bad:
            continue
        reproduced = [r for r in bad if r["rerun"] == Rerun.REPRODUCED]
        start = int(bad[0]["step"])
        clean_before = [int(r["step"]) for r in mine if r["violations"] == 0 and r["step"] < start]
        exposure, said = checkpoints.exposure(
            start, None if not clean_before else {"step": clean_before[-1], "sensor": Sensor.GEMM})
        host = str(topology.hosts[rank])
        state = State.CONFIRMED if reproduced else State.INCONCLUSIVE
        what = (f"rank {rank} on {host} computed a linear layer's output wrong at step {start} (column sums "
                f"off its inputs beyond the rounding bound)")
        what += ("; re-run on the device it gave the same wrong bits and the host's float64 reference disagrees: "
                 "confirmed" if reproduced else
                 "; re-run at once it came out right: a transient upset that could not be reproduced, inconclusive")
        what += f". Its gradient went into every replica's update: {said}"
        evidence = [{"level": Level.SDC, "kind": EvidenceKind.GEMM_VIOLATION, "rank": rank, "steps": [int(r["step"]) for r in bad][:16],
                     "columns": [int(r["violations"]) for r in bad][:16], "rerun": [r["rerun"] for r in bad][:16],
                     "checks": len(mine), "clean_before": clean_before[-1] if clean_before else None},
                    exposure]
        incidents.append(Incident(
            klass=IncidentClass.SILENT_DATA_CORRUPTION, culprit_ranks=[rank], hosts=[host],
            gpus=[str(topology.gpu_uuids[rank])], start_step=start, end_step=max(last_step, start), phase="forward",
            kernels=["linear"], state=state, severity=Severity.CRITICAL if reproduced else Severity.WARNING,
            slowdown_pct=None, gpu_hours_lost=None,
            action=Action.CHECKPOINT_AND_RESTART if reproduced else Action.VERIFY, evidence=evidence,
            steps=[int(r["step"]) for r in bad][:64], summary=what))
    return incidents


def _incident(v: ReplicaVerdict, topology: Topology, checkpoints: Checkpoints, last_step: int) -> Incident:
    assert v.first_bad is not None
    start = _exposure_start(v)
    confirmed = v.majority and bool(v.confirming)
    exposure, said = checkpoints.exposure(
        start, None if v.last_good is None else {"step": v.last_good.step, "sensor": v.last_good.sensor})
    first = v.first_bad
    evidence = [{
        "level": Level.SDC, "kind": EvidenceKind.REPLICA_DISAGREEMENT, "group": v.group, "step": first.step, "sensor": first.sensor,
        "outvoted": v.suspects, "majority": v.majority,
        "digests": {str(r): f"{d:016x}" for r, d in first.digests.items()},
        "checks": v.checks, "agreed_before": v.agreed,
        "confirmed_by": [{"step": c.step, "sensor": c.sensor} for c in v.confirming[:8]],
    }, exposure]
    who = ", ".join(map(str, v.suspects))
    hosts = sorted({str(topology.hosts[r]) for r in v.suspects})
    if v.majority:
        summary = (f"rank{'s' * (len(v.suspects) > 1)} {who} on {', '.join(hosts)} no longer hold{'s' * (len(v.suspects) == 1)}"
                   f" the bits {len(v.group) - len(v.suspects)} replicas agree on ({first.sensor} at step {first.step})")
    else:
        summary = (f"the replicas {who} on {', '.join(hosts)} stopped agreeing ({first.sensor} at step {first.step}); "
                   f"with no majority the digests cannot tell which computed wrong")
    if v.nonfinite_only:
        evidence.append({"level": Level.SDC, "kind": EvidenceKind.NONFINITE_OUTLIER, "ranks": v.nonfinite_only,
                         "step": v.nonfinite_step, "group": v.group})
    if confirmed:
        summary += f"; seen again at {len(v.confirming)} later check{'s' * (len(v.confirming) > 1)}: confirmed"
    elif v.majority:
        summary += "; not seen again yet: suspected until a second check outvotes the same rank"
    summary += f". {said[0].upper()}{said[1:]}" + (" on other hardware" if confirmed else "")
    return Incident(
        klass=IncidentClass.SILENT_DATA_CORRUPTION, culprit_ranks=v.suspects, hosts=hosts,
        gpus=[str(topology.gpu_uuids[r]) for r in v.suspects], start_step=start, end_step=max(last_step, start),
        phase="optimizer", kernels=[], state=State.CONFIRMED if confirmed else State.SUSPECTED,
        severity=Severity.CRITICAL if confirmed else Severity.WARNING, slowdown_pct=None, gpu_hours_lost=None,
        action=Action.CHECKPOINT_AND_RESTART if confirmed else Action.VERIFY, evidence=evidence,
        steps=sorted({first.step, *(c.step for c in v.confirming)}), summary=summary)


def _nonfinite(v: ReplicaVerdict, topology: Topology, last_step: int) -> Incident:
    """NaN/Inf on a minority of replicas whose digests still agree elsewhere: a heuristic."""
    hosts = sorted({str(topology.hosts[r]) for r in v.nonfinite_only})
    return Incident(
        klass=IncidentClass.SILENT_DATA_CORRUPTION, culprit_ranks=v.nonfinite_only, hosts=hosts,
        gpus=[str(topology.gpu_uuids[r]) for r in v.nonfinite_only], start_step=v.nonfinite_step,
        end_step=max(last_step, v.nonfinite_step), phase="optimizer", kernels=[], state=State.SUSPECTED,
        severity=Severity.WARNING, slowdown_pct=None, gpu_hours_lost=None, action=Action.OBSERVE,
        evidence=[{"level": Level.SDC, "kind": EvidenceKind.NONFINITE_OUTLIER, "ranks": v.nonfinite_only, "step": v.nonfinite_step,
                   "group": v.group}],
        steps=[v.nonfinite_step],
        summary=(f"NaN/Inf on rank{'s' * (len(v.nonfinite_only) > 1)} {', '.join(map(str, v.nonfinite_only))} only, "
                 f"from step {v.nonfinite_step}: a numerical outlier, a heuristic (the digests did not disagree)"))
