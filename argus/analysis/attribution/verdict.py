"""From a window's what-ifs to findings: the shape of what explains the slowdown names its
class and its culprits.

For each part (``attribute.Part``) whose slowdown clears ``MIN_SLOWDOWN``, in this order:

* the ranks that stand out from their peers (``MIN_Z`` and ``MIN_RATIO``, persistently and not
  following their inputs; or a stall's spike their pipeline line does not share), pruned to
  those whose excess is comparable, whose set's fix recovers ≥ ``SHARE_STANDING`` of the part
  and gains ≥ ``MIN_GAIN_PCT``: they are the culprits — a **compute straggler** when their
  excess is compute that persists, one pass only in a pipeline a **pipeline imbalance**, a
  **host stall** when it is host work, comes and goes, or (host part) lies outside every
  recorded phase;
* one communicator's transfers explain it: **link degradation**, its members the culprits;
* one stage explains the stage part: **pipeline imbalance** of the partition (move layers);
* the ranks' own step-to-step fluctuation explains it, or no small group does: variance on
  every worker — **input imbalance**, no culprit.

Nothing below ``MIN_SLOWDOWN`` is a finding: the peers' typical is a median of noisy steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from argus.analysis.attribution.attribute import MAX_CANDIDATES, GroupKind, Part, Share, WindowAttribution

__all__ = ["Finding", "Shape", "findings", "MIN_SLOWDOWN", "EXPLAINS", "MIN_STAGE_SLOWDOWN"]

#: A part's slowdown (its step against its ideal) below this is noise, not a finding.
MIN_SLOWDOWN = 1.02
#: A pipeline's stage part needs this much: a partition is never perfectly even.
MIN_STAGE_SLOWDOWN = 1.05
#: A group explains a part when fixing it recovers this share of the part.
EXPLAINS = 0.5
#: A long stage's forward or backward blocks are at least this many times the stages' mean.
HEAVIER_BLOCKS = 1.1
#: Ranks that stand out from their peers are culprits when fixing them recovers this share of
#: their part (noise elsewhere may hold the rest) …
SHARE_STANDING = 0.25
#: … and gains the job at least this much (% of the step).
MIN_GAIN_PCT = 1.0
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


def _peer_cols(wa: WindowAttribution, col: int, exclude: set[int]) -> np.ndarray:
    same = (wa.stage == wa.stage[col]) & (wa.tp == wa.tp[col])
    same[col] = False
    for c in exclude:
        same[c] = False
    return np.flatnonzero(same)


def _stands_out(value: float, peers: np.ndarray, min_ratio: float) -> bool:
    """A rank's typical value against its peers' (robust z, or the faster peer when there is one)."""
    peers = peers[np.isfinite(peers)]
    if not np.isfinite(value) or value < min_ratio or peers.size == 0:
        return False
    if peers.size == 1:
        return value >= PAIR_RATIO * float(peers[0])
    med = float(np.median(peers))
    mad = float(np.median(np.abs(peers - med)))
    scale = max(1.4826 * mad, 0.01 * abs(med)) + 1e-12
    return (value - med) / scale >= MIN_Z


def _candidates(excess: dict[int, float]) -> list[int]:
    return [r for r, _ in sorted(excess.items(), key=lambda kv: -kv[1])[:MAX_CANDIDATES]]


def _worker_standing(wa: WindowAttribution) -> dict[int, bool]:
    """Ranks whose own work stands out from their peers' beyond noise → persistent or not:
    persistently (their typical ratio, robust z against the peers'), or in some steps far above
    their peers (a stall)."""
    col = {int(r): i for i, r in enumerate(wa.ranks.tolist())}
    rec = wa.recorded_s / 1e9
    out: dict[int, bool] = {}
    for r in _candidates(wa.excess_s):
        c = col[r]
        row = wa.work_ratio[c]
        peers = _peer_cols(wa, c, set())
        ref = np.nanmedian(wa.work_ratio[peers], axis=1) if peers.size else np.zeros(0)
        if _stands_out(float(np.nanmedian(row)), ref, MIN_RATIO):
            if not _inputs(wa, c, row):
                out[r] = True
            continue
        step_ref = np.nanmedian(wa.work_ratio[peers], axis=0) if peers.size else np.ones(len(rec))
        big = (row >= SPIKE_RATIO * step_ref) | (wa.work_excess_steps_s[c] >= SPIKE_SHARE * rec)
        big &= ~_line_moves_too(wa, c, row)
        if big.any():
            out[r] = False
    return out


def _inputs(wa: WindowAttribution, c: int, row: np.ndarray) -> bool:
    """Whether a rank's longer work is its inputs': its pipeline line partners are longer in the
    same steps, and the excess comes and goes from step to step (a slow device is slow in every
    step; a long microbatch lengthens every stage it passes through)."""
    excess = row - 1.0
    steps = excess > 0.1
    if steps.sum() < 2:
        return False
    moves = _line_moves_too(wa, c, row)
    varies = float(np.std(row)) >= 0.5 * max(float(np.mean(row)) - 1.0, 1e-9)
    return bool(moves[steps].mean() >= 2 / 3 and varies)


def _line_moves_too(wa: WindowAttribution, c: int, row: np.ndarray) -> np.ndarray:
    """Per step: whether the rank's pipeline line partners (its column in the other stages) were
    long in the same step too — a long input passes through every stage; a stall stays on one rank."""
    partners = np.flatnonzero((wa.stage != wa.stage[c]) & (wa.line == wa.line[c])) if wa.line.size else \
        np.zeros(0, np.int64)
    if partners.size == 0:
        return np.zeros(len(row), bool)
    other = np.nanmax(wa.work_ratio[partners], axis=0)
    return (other - 1.0) >= 0.5 * (row - 1.0)


def _host_standing(wa: WindowAttribution) -> dict[int, bool]:
    """Ranks whose time outside the recorded phases recurs (or once is large) and stands out from
    their peers' → whether it is in most steps."""
    col = {int(r): i for i, r in enumerate(wa.ranks.tolist())}
    rec = wa.recorded_s / 1e9
    out: dict[int, bool] = {}
    for r in _candidates(wa.host_excess_s):
        c = col[r]
        share = wa.host_excess_steps_s[c] / np.maximum(rec, 1e-12)
        recurring = (share >= RECURRING_SHARE).sum()
        if not (recurring >= min(RECURRING, len(rec)) or (share >= ONE_OFF_SHARE).any()):
            continue
        peers = _peer_cols(wa, c, set())
        mine = float(wa.host_excess_steps_s[c].mean())
        others = wa.host_excess_steps_s[peers].mean(axis=1) if peers.size else np.zeros(0)
        if others.size and not _stands_out(mine, others, 0.0) and \
                mine <= float(np.median(others)) + RECURRING_SHARE * float(np.median(rec)):
            continue
        out[r] = bool(recurring >= PERSISTENT_STEPS * len(rec))
    return out


def _comparable(standing: dict[int, bool], excess: dict[int, float]) -> dict[int, bool]:
    """The standing ranks whose excess is comparable to the largest one's (a noisy rank that
    happens to clear the bar beside a real culprit is not a second culprit)."""
    top = max((excess.get(r, 0.0) for r in standing), default=0.0)
    return {r: p for r, p in standing.items() if top > 0 and excess.get(r, 0.0) >= COMPARABLE_EXCESS * top}


def _set_share(wa: WindowAttribution, part: Part, ranks: list[int]) -> Share | None:
    """The fix what-if of exactly ``ranks`` in ``part``: a rank's own, or one evaluated for the set
    (a second replay when the first did not hold it)."""
    want = sorted(ranks)
    for s in wa.of(part):
        if s.kind in (GroupKind.RANK, GroupKind.RANKS) and sorted(s.ranks) == want and s.per_step_gain_s:
            return s
    made = wa.evaluate([(part, f"ranks {', '.join(map(str, want[:8]))}{'…' if len(want) > 8 else ''}", want)])
    return made[0] if made else None


def _worker(wa: WindowAttribution, pp: int) -> list[Finding]:
    base = wa.mean("u0")
    n = int(wa.ranks.size)
    standing = _comparable(_worker_standing(wa), wa.excess_s)
    if standing and len(standing) <= max(1, (n - 1) // 2):
        culprits = sorted(standing)
        best = _set_share(wa, Part.WORKER, culprits)
        if best is not None and best.share >= SHARE_STANDING and best.gain_pct >= MIN_GAIN_PCT:
            steps = _steps_of(wa, best)
            persistent = any(standing.values()) and len(steps) >= PERSISTENT_STEPS * len(wa.steps)
            klass, phase = _class_of(wa, culprits, persistent, pp)
            col = {int(r): i for i, r in enumerate(wa.ranks.tolist())}
            ratio = float(np.nanmedian([np.nanmax(wa.work_ratio[col[r]]) if not persistent
                                        else np.nanmedian(wa.work_ratio[col[r]]) for r in culprits]))
            return [Finding(Part.WORKER, Shape.RANKS, klass, culprits, phase, best.share, _slowdown(base, best),
                            _gain(best), steps or list(wa.steps), wa.lo, wa.hi, best.label,
                            {"persistent": persistent, "group": best.kind, "ratio": round(ratio, 3)})]
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
    blocks = [f for b, f in factors.items() if b in ("fwd", "bwd") and f > 0]
    if not blocks or 1.0 / min(blocks) < HEAVIER_BLOCKS:
        return None  # its layers are not heavier than the others': what differs is not the partition (a link)
    heavier = {b: round(1.0 / f, 3) for b, f in factors.items() if f > 0}
    return Finding(Part.STAGE, Shape.STAGE, "pipeline_imbalance", sorted(s.ranks), f"stage {stage}",
                   s.share, wa.s_stage, wa.mean("peer") - wa.mean("ideal"), list(wa.steps), wa.lo, wa.hi, s.label,
                   {"persistent": True, "stage": stage, "work_vs_mean": heavier,
                    "stages": {x.label: round(x.share, 3) for x in stages}})


def _host(wa: WindowAttribution) -> list[Finding]:
    n = int(wa.ranks.size)
    standing = _comparable(_host_standing(wa), wa.host_excess_s)
    if not standing or len(standing) > max(1, (n - 1) // 2):
        return []  # untracked time everywhere alike is the job's own overhead, no one's fault
    culprits = sorted(standing)
    best = _set_share(wa, Part.HOST, culprits)
    if best is None or best.share < SHARE_STANDING or best.gain_pct < MIN_GAIN_PCT:
        return []
    steps = _steps_of(wa, best)
    persistent = len(steps) >= PERSISTENT_STEPS * len(wa.steps)
    col = {int(r): i for i, r in enumerate(wa.ranks.tolist())}
    rec = np.maximum(wa.recorded_s / 1e9, 1e-12)
    step_share = float(max(np.max(wa.host_excess_steps_s[col[r]] / rec) for r in culprits))
    return [Finding(Part.HOST, Shape.RANKS, "host_stall", culprits, "outside the recorded phases", best.share,
                    _slowdown(wa.mean("rec"), best), _gain(best), steps or list(wa.steps), wa.lo, wa.hi,
                    best.label, {"persistent": persistent, "group": best.kind, "step_share": round(step_share, 3)})]
