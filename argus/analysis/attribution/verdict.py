"""From a window's what-ifs to findings: the shape of what explains the slowdown names its
class and its culprits.

For each part (``attribute.Part``) whose slowdown clears ``MIN_SLOWDOWN``, in this order:

* one rank explains it (fixing it recovers ≥ ``EXPLAINS`` of the part), else the fewest top
  candidates that together do (pruned to the ranks whose excess is comparable): they are the
  culprits — a **compute straggler** when their excess is compute that persists, one pass only
  in a pipeline a **pipeline imbalance**, a **host stall** when it is host work, comes and goes,
  or (host part) lies outside every recorded phase;
* one communicator's transfers explain it: **link degradation**, its members the culprits;
* one stage explains the stage part: **pipeline imbalance** of the partition (move layers);
* the ranks' own step-to-step fluctuation explains it, or no small group does: variance on
  every worker — **input imbalance**, no culprit.

Nothing below ``MIN_SLOWDOWN`` is a finding: the peers' typical is a median of noisy steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from argus.analysis.attribution.attribute import GroupKind, Part, Share, WindowAttribution

__all__ = ["Finding", "Shape", "findings", "MIN_SLOWDOWN", "EXPLAINS", "MIN_STAGE_SLOWDOWN"]

#: A part's slowdown (its step against its ideal) below this is noise, not a finding.
MIN_SLOWDOWN = 1.02
#: A pipeline's stage part needs this much: a partition is never perfectly even.
MIN_STAGE_SLOWDOWN = 1.05
#: A group explains a part when fixing it recovers this share of the part.
EXPLAINS = 0.5
#: … a prefix of candidates (several culprits together) must recover this much.
EXPLAINS_SET = 0.6
#: A culprit set keeps the ranks whose excess is at least this share of the largest one's.
COMPARABLE_EXCESS = 0.25
#: A step belongs to a finding when fixing its group gains this share of the step.
STEP_GAIN = 0.02
#: … and a finding present in fewer than this share of the replayed steps comes and goes.
PERSISTENT_STEPS = 0.6
#: A pipeline rank whose excess is this much in one pass has one slow pass.
ONE_PASS = 0.85
# What stands out from noise (the gates L2 was calibrated with, applied to the ranks' own work
# per step against their peers'): a persistent culprit works this much longer than its peers …
MIN_RATIO = 1.2
#: … and this many robust standard deviations (MAD, floored at 1% of the median) from them;
#: with one peer, the faster one is the reference and a rank must be this much above it.
MIN_Z = 4.0
PAIR_RATIO = 1.3
#: An intermittent culprit (a stall): its steps' work this many times its peers' …
SPIKE_RATIO = 2.0
#: … or this share of the step more.
SPIKE_SHARE = 0.2
#: Time outside the recorded phases: this share of the step in at least RECURRING steps, or
#: ONE_OFF_SHARE in one.
RECURRING_SHARE = 0.05
RECURRING = 3
ONE_OFF_SHARE = 0.2
#: A communicator's transfers this many times its family's typical ones.
LINK_RATIO = 1.5
#: Variance on every worker: a worker part this large …
SPREAD_SLOWDOWN = 1.10
#: … most of it the ranks' step-to-step fluctuation …
SPREAD_FLUCTUATION = 0.5
#: … that moves together along a pipeline line (the same inputs pass through every stage).
SPREAD_CORRELATION = 0.3


class Shape(StrEnum):
    RANKS = "ranks"
    COMMUNICATOR = "communicator"
    STAGE = "stage"
    SPREAD = "spread"


@dataclass
class Finding:
    part: Part
    shape: Shape
    klass: str  # an IncidentClass value
    culprits: list[int]
    phase: str
    share: float
    slowdown: float  # the part's step against the step with this group fixed (≥ 1)
    gain_s: float  # mean seconds per step the group costs
    steps: list[int]
    lo: int
    hi: int
    label: str = ""
    detail: dict = field(default_factory=dict)
    step_gain_s: dict[int, float] = field(default_factory=dict)  # each replayed step's gain with the group fixed

    @property
    def persistent(self) -> bool:
        return bool(self.detail.get("persistent", True))


def _gain(s: Share) -> float:
    return float(np.mean(s.per_step_gain_s)) if s.per_step_gain_s else 0.0


def _steps_of(wa: WindowAttribution, s: Share) -> list[int]:
    rec = wa.recorded_s / 1e9
    return [int(k) for k, g, r in zip(wa.steps, s.per_step_gain_s, rec) if r > 0 and g >= STEP_GAIN * r]


def _step_gains(wa: WindowAttribution, f: Finding) -> dict[int, float]:
    share = next((s for s in wa.shares if s.part == f.part and s.label == f.label and s.per_step_gain_s), None)
    if share is None:
        return {}
    return {int(k): float(g) for k, g in zip(wa.steps, share.per_step_gain_s)}


def findings(wa: WindowAttribution, pp: int) -> list[Finding]:
    out = _findings(wa, pp)
    for f in out:
        if not f.step_gain_s and f.shape != Shape.SPREAD and f.shape != Shape.STAGE:
            f.step_gain_s = _step_gains(wa, f)
    return out


def _findings(wa: WindowAttribution, pp: int) -> list[Finding]:
    out: list[Finding] = []
    if wa.s_worker >= MIN_SLOWDOWN:
        out += _worker(wa, pp)
    if pp > 1 and wa.s_stage >= MIN_STAGE_SLOWDOWN:
        stage = _stage(wa)
        if stage is not None:
            out.append(stage)
    if wa.s_host >= MIN_SLOWDOWN:
        out += _host(wa)
    return out


def _culprit_set(wa: WindowAttribution, part: Part, excess: dict[int, float]) -> Share | None:
    """The one rank, or the fewest top candidates, whose fix explains ``part``."""
    ranks = sorted(wa.of(part, GroupKind.RANK), key=lambda s: -s.share)
    if ranks and ranks[0].share >= EXPLAINS:
        return ranks[0]
    sets = sorted((s for s in wa.of(part, GroupKind.RANKS) if s.label.startswith("top ")),
                  key=lambda s: len(s.ranks))
    for s in sets:
        if s.share >= EXPLAINS_SET:
            return s
    hosts = sorted(wa.of(part, GroupKind.HOST), key=lambda s: -s.share)
    if hosts and hosts[0].share >= EXPLAINS_SET:
        return hosts[0]
    return None


def _pruned(ranks: list[int], excess: dict[int, float]) -> list[int]:
    top = max((excess.get(r, 0.0) for r in ranks), default=0.0)
    kept = [r for r in ranks if top > 0 and excess.get(r, 0.0) >= COMPARABLE_EXCESS * top]
    return sorted(kept or ranks)


def _peer_cols(wa: WindowAttribution, col: int, exclude: set[int]) -> np.ndarray:
    same = (wa.stage == wa.stage[col]) & (wa.tp == wa.tp[col])
    same[col] = False
    for c in exclude:
        same[c] = False
    return np.flatnonzero(same)


def _stands_out(value: float, peers: np.ndarray, min_ratio: float) -> bool:
    """A rank's typical ratio against its peers' (robust z, or the faster peer when there is one)."""
    peers = peers[np.isfinite(peers)]
    if not np.isfinite(value) or value < min_ratio:
        return False
    if peers.size == 0:
        return False
    if peers.size == 1:
        return value >= PAIR_RATIO * float(peers[0])
    med = float(np.median(peers))
    mad = float(np.median(np.abs(peers - med)))
    scale = max(1.4826 * mad, 0.01 * abs(med)) + 1e-12
    return (value - med) / scale >= MIN_Z


def _worker_culprits(wa: WindowAttribution, ranks: list[int], steps: list[int], persistent: bool) -> list[int]:
    """The ranks of a set whose own work stands out from their peers' beyond noise."""
    col = {int(r): i for i, r in enumerate(wa.ranks.tolist())}
    cols = {col[r] for r in ranks if r in col}
    rec = wa.recorded_s / 1e9
    hit = np.isin(np.asarray(wa.steps), steps) if steps else np.ones(len(wa.steps), bool)
    kept = []
    for r in ranks:
        c = col.get(r)
        if c is None:
            continue
        row = wa.work_ratio[c]
        peers = _peer_cols(wa, c, cols - {c})
        if persistent:
            if _stands_out(float(np.nanmedian(row)), np.nanmedian(wa.work_ratio[peers], axis=1) if peers.size
                           else np.zeros(0), MIN_RATIO):
                kept.append(r)
        else:  # a stall: its steps far above its peers' in the same steps
            own = row[hit]
            ref = np.nanmedian(wa.work_ratio[peers][:, hit], axis=0) if peers.size else np.ones(int(hit.sum()))
            x = float(wa.excess_s.get(r, 0.0))
            big = (own >= SPIKE_RATIO * ref) | (x >= SPIKE_SHARE * rec[hit])
            if big.any():
                kept.append(r)
    return kept


def _worker(wa: WindowAttribution, pp: int) -> list[Finding]:
    best = _culprit_set(wa, Part.WORKER, wa.excess_s)
    base = wa.mean("u0")
    n = int(wa.ranks.size)
    if best is not None and len(best.ranks) > max(1, (n - 1) // 2):
        best = None  # "culprits" that are most of the job are the job
    if best is not None:
        culprits = _pruned(best.ranks, wa.excess_s)
        steps = _steps_of(wa, best)
        persistent = len(steps) >= PERSISTENT_STEPS * len(wa.steps)
        culprits = _worker_culprits(wa, culprits, steps, persistent)
    if best is not None and culprits:
        klass, phase = _class_of(wa, culprits, persistent, pp)
        return [Finding(Part.WORKER, Shape.RANKS, klass, culprits, phase, best.share, _slowdown(base, best),
                        _gain(best), steps or list(wa.steps), wa.lo, wa.hi, best.label,
                        {"persistent": persistent, "group": best.kind})]
    comms = sorted(wa.of(Part.WORKER, GroupKind.COMMUNICATOR), key=lambda s: -s.share)
    if comms and comms[0].share >= EXPLAINS and _link_stands_out(wa, comms[0]):
        c = comms[0]
        steps = _steps_of(wa, c)
        return [Finding(Part.WORKER, Shape.COMMUNICATOR, "link_degradation", sorted(c.ranks), "transfers", c.share,
                        _slowdown(base, c), _gain(c), steps or list(wa.steps), wa.lo, wa.hi, c.label,
                        {"persistent": len(steps) >= PERSISTENT_STEPS * len(wa.steps)})]
    # no small group: variance on every worker (the ranks' own fluctuation, or many a little) —
    # worth a finding when it is large, the ranks' fluctuation, and (in a pipeline) the inputs'
    if wa.s_worker < SPREAD_SLOWDOWN or wa.fluctuation_share < SPREAD_FLUCTUATION:
        return []
    if pp > 1 and (wa.stage_correlation is None or wa.stage_correlation < SPREAD_CORRELATION):
        return []
    # in a pipeline, block time that moves together along a line says the inputs; without one,
    # uneven inputs and a noisy host look alike: shown, never graded above info
    inputs = pp > 1
    gain = base - wa.mean("peer")
    replicas = sorted(wa.of(Part.WORKER, GroupKind.REPLICA), key=lambda s: -(s.add_share or 0.0))
    return [Finding(Part.WORKER, Shape.SPREAD, "input_imbalance", [], "every worker", 1.0,
                    wa.s_worker, gain, list(wa.steps), wa.lo, wa.hi, "every worker",
                    {"persistent": True, "inputs_told": inputs, "fluctuation_share": round(wa.fluctuation_share, 3),
                     "stage_correlation": None if wa.stage_correlation is None else round(wa.stage_correlation, 3),
                     "replicas": [{"replica": s.label, "alone_slowdown": round(
                         1.0 + (s.add_share or 0.0) * (wa.s_worker - 1.0), 3)} for s in replicas[:8]]})]


def _link_stands_out(wa: WindowAttribution, s: Share) -> bool:
    """A communicator's transfers well above its family's, and above the other communicators' of
    its kind."""
    mine = [v for k, v in wa.comm_ratio.items() if _comm_label_of(k) == s.label]
    if not mine or mine[0] < LINK_RATIO:
        return False
    kind = s.label.split()[0]
    others = np.array([v for k, v in wa.comm_ratio.items() if _comm_label_of(k) != s.label
                       and _comm_label_of(k).split()[0] == kind])
    return _stands_out(mine[0], others, LINK_RATIO) if others.size else True


def _comm_label_of(key: tuple) -> str:
    from argus.analysis.attribution.attribute import _comm_label

    return _comm_label(key)


def _slowdown(base_s: float, s: Share) -> float:
    return base_s / s.fix_s if s.fix_s > 0 else float("nan")


def _class_of(wa: WindowAttribution, culprits: list[int], persistent: bool, pp: int) -> tuple[str, str]:
    """The class and the phase from where the culprits' excess lies."""
    comps = np.zeros(len(wa.components))
    for r in culprits:
        v = wa.excess_by_component_s.get(r)
        if v is not None:
            comps += np.asarray(v)
    total = comps.sum()
    if total <= 0:
        return ("compute_straggler" if persistent else "host_stall"), "compute"
    cats = np.array(wa.categories)
    host = comps[cats == "host"].sum() / total
    top = wa.components[int(np.argmax(comps))]
    if host >= 0.6:
        return "host_stall", top
    if not persistent:
        return "host_stall", top
    blocks = np.array([b or "" for b in wa.blocks])
    fwd, bwd = comps[blocks == "fwd"].sum(), comps[blocks == "bwd"].sum()
    if pp > 1 and fwd + bwd > 0 and max(fwd, bwd) >= ONE_PASS * (fwd + bwd) and max(fwd, bwd) >= 0.5 * total:
        name = next((c for c, b in zip(wa.components, wa.blocks) if b == ("bwd" if bwd > fwd else "fwd")), top)
        return "pipeline_imbalance", name
    return "compute_straggler", top


def _stage(wa: WindowAttribution) -> Finding | None:
    stages = sorted(wa.of(Part.STAGE, GroupKind.STAGE), key=lambda s: -s.share)
    if not stages or stages[0].share < EXPLAINS:
        return None
    s = stages[0]
    stage = int(s.label.split()[-1])
    factors = wa.balance.get(stage, {})
    heavier = {b: round(1.0 / f, 3) for b, f in factors.items() if f > 0}
    return Finding(Part.STAGE, Shape.STAGE, "pipeline_imbalance", sorted(s.ranks), f"stage {stage}",
                   s.share, wa.s_stage, wa.mean("peer") - wa.mean("ideal"), list(wa.steps), wa.lo, wa.hi, s.label,
                   {"persistent": True, "stage": stage, "work_vs_mean": heavier,
                    "stages": {x.label: round(x.share, 3) for x in stages}})


def _host_culprits(wa: WindowAttribution, ranks: list[int]) -> list[int]:
    """Ranks whose time outside the recorded phases recurs (or once is large) and stands out."""
    col = {int(r): i for i, r in enumerate(wa.ranks.tolist())}
    rec = wa.recorded_s / 1e9
    kept = []
    for r in ranks:
        c = col.get(r)
        if c is None:
            continue
        share = wa.host_excess_steps_s[c] / np.maximum(rec, 1e-12)
        if not ((share >= RECURRING_SHARE).sum() >= min(RECURRING, len(rec)) or (share >= ONE_OFF_SHARE).any()):
            continue
        peers = _peer_cols(wa, c, {col[q] for q in ranks if q in col and q != r})
        mine = float(wa.host_excess_steps_s[c].mean())
        others = wa.host_excess_steps_s[peers].mean(axis=1) if peers.size else np.zeros(0)
        # excess over the least any peer needed: a peer's own is ~0, so the bar is the step's share
        if others.size and mine <= np.median(others) + RECURRING_SHARE * float(np.median(rec)):
            continue
        kept.append(r)
    return kept


def _host(wa: WindowAttribution) -> list[Finding]:
    best = _culprit_set(wa, Part.HOST, wa.host_excess_s)
    n = int(wa.ranks.size)
    if best is None or len(best.ranks) > max(1, (n - 1) // 2):
        return []  # untracked time everywhere alike is the job's own overhead, no one's fault
    culprits = _host_culprits(wa, _pruned(best.ranks, wa.host_excess_s))
    if not culprits:
        return []
    steps = _steps_of(wa, best)
    persistent = len(steps) >= PERSISTENT_STEPS * len(wa.steps)
    return [Finding(Part.HOST, Shape.RANKS, "host_stall", culprits, "outside the recorded phases", best.share,
                    _slowdown(wa.mean("rec"), best), _gain(best), steps or list(wa.steps), wa.lo, wa.hi,
                    best.label, {"persistent": persistent, "group": best.kind})]
