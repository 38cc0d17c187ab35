"""The durations a replay can use for every node and unit of a step graph: as recorded, and the
typical values that define the step without stragglers.

* **recorded** — each (node, column, step)'s gap by component; each unit's transfer: its
  members' shortest duration (the last to arrive waits for no one).
* **own** — each rank's own mean over the replayed steps, per node: the step without its
  step-to-step fluctuation (a sequence-length draw, an intermittent stall), with its work kept.
* **peer** — per node, the median over the rank's like-with-like peers (same stage, same
  tensor-parallel position) of their own means (of two, the faster: faults only add time): a
  rank with a persistent excess is set to what its peers take. A transfer: the median over the family's units (the same collective on every
  communicator of its kind and size).
* **ideal** — ``peer`` with each stage's forward and backward blocks scaled to the stages'
  mean, and the collectives that move with a stage's layers (data-, tensor-, context-, expert-
  parallel) to their stages' mean total: the same total work, partitioned evenly (a pipeline
  whose last stage holds more layers is slower than its ideal by its imbalance). Without a
  pipeline, ``ideal`` is ``peer``.

Beside them, **work**: ``peer`` of the ranks' own work, the waiting the producer measured inside
their phases (``wait_ns``: a CPU job's run-queue delay) taken off — what stages are balanced on
and ranks compared on, since a shared CPU stretches a phase with whatever else runs.

Means within a rank conserve its work (a variable input averages out); medians across peers
do not let one straggler set the reference."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.attribution.chains import Chains
from argus.analysis.attribution.graph import StepGraph
from argus.topology import Layout
from argus.uniques import sorted_unique

__all__ = ["Durations", "durations", "GAP_SETS", "TRANSFER_SETS"]

GAP_SETS = ("rec", "rec0", "upeer", "own", "peer", "ideal")
TRANSFER_SETS = ("rec", "own", "peer", "ideal")


@dataclass
class Durations:
    """Per stage row: ``gaps[set][si]`` of shape (n, C, K or 1, J) float32; per family:
    ``transfers[set][fi]`` of shape (U, K or 1) float64."""

    gaps: dict[str, list[np.ndarray]]
    transfers: dict[str, list[np.ndarray]]
    #: per stage row, (n, C, 1, J): ``peer`` of the ranks' own work — the run-queue delay and
    #: waits the producer measured inside their phases taken off (``peer`` where none was)
    work: list[np.ndarray]
    balance: dict[int, dict[str, float]]  # stage → block → factor its blocks were scaled by in ``ideal``
    block_share: dict[int, float]  # stage → share of its gaps in forward/backward blocks (peer values)


def durations(ch: Chains, g: StepGraph, layout: Layout) -> Durations:
    comps = ch.components
    J = len(comps)
    untracked = np.zeros(J, bool)
    untracked[-1] = True
    block_j = {b: np.array([c.block == b for c in comps]) for b in ("fwd", "bwd")}
    rec, rec0, upeer, own, peer = [], [], [], [], []
    work = []
    for st in g.stages:
        r = st.comp  # (n, C, K, J)
        rec.append(r)
        r0 = r.copy()
        r0[..., -1] = 0.0
        rec0.append(r0)
        o = r.mean(axis=2, keepdims=True, dtype=np.float64).astype(np.float32)
        tp = layout.coords(st.ranks)["tp"]
        p = _peer(o, tp)
        if ch.work.own_busy is not None:
            share = np.ones((st.ranks.size, J), np.float32)  # the untracked column counts whole
            share[:, :-1] = ch.work.own_share(st.ranks)
            work.append(_peer(o * share[None, :, None, :], tp))
        else:
            work.append(p)
        low = np.empty(r.shape[:-1], np.float32)  # (n, C, K)
        for t in sorted_unique(tp):
            sel = tp == t
            low[:, sel] = r[..., -1][:, sel].min(axis=1, keepdims=True)
        u = r.copy()
        u[..., -1] = low  # the least any peer needed in that step: unrecorded waits land in untracked time
        upeer.append(u)
        o[..., -1] = 0.0
        p[..., -1] = 0.0
        work[-1][..., -1] = 0.0
        own.append(o)
        peer.append(p)
    ideal = [p.copy() for p in peer]
    balance: dict[int, dict[str, float]] = {}
    block_share: dict[int, float] = {}
    if len(g.stages) > 1:
        for b, mask in block_j.items():
            if not mask.any():
                continue
            # per stage, its block work per column (each own-time interval once: the gaps before
            # the events the ranks waited for, as the template says), less the run-queue delay
            # measured inside it: on a CPU shared by several ranks a stage's blocks stretch with
            # what else runs beside them (6 ranks on one vCPU: one stage's backward 9.3 ms of
            # wall for 6.0 ms of its own, the other's 5.4 for 5.3), which no partition changes
            totals = np.array([float(np.einsum("n,nc->c", _once(st), p[..., mask].sum(axis=(2, 3))).mean())
                               for st, p in zip(g.stages, work)])
            if not (totals > 0).all():
                continue
            target = float(totals.mean())
            for si, st in enumerate(g.stages):
                factor = target / totals[si]
                balance.setdefault(st.stage, {})[b] = factor
                ideal[si][..., mask] *= np.float32(factor)
    for si, st in enumerate(g.stages):
        p = peer[si]
        blocks = block_j["fwd"] | block_j["bwd"]
        w = _once(st)
        total = float(np.einsum("n,ncj->", w, p[:, :, 0, :]))
        block_share[st.stage] = float(np.einsum("n,ncj->", w, p[:, :, 0, blocks])) / total if total > 0 else 0.0
    t_rec, t_own, t_peer = [], [], []
    for fam in g.families:
        unit = fam.transfer if fam.transfer is not None else fam.grouping.min(
            np.concatenate([ch.dur[g.stages[si].ev[i]] for si, i in fam.members], axis=0))  # (U, K)
        t_rec.append(unit)
        mean = unit.mean(axis=1, keepdims=True)
        t_own.append(mean)
        t_peer.append(np.full_like(mean, float(np.median(mean))))
    t_ideal = [t.copy() for t in t_peer]
    if len(g.stages) > 1:
        # the collectives that move with a stage's layers (its parameters' data-parallel reductions,
        # its tensor/context/expert-parallel exchanges): their total per stage evened out too
        for kind in _MOVES_WITH_LAYERS:
            per_stage: dict[int, list[int]] = {}
            for fi, fam in enumerate(g.families):
                stages = {si for si, _ in fam.members}
                if fam.kind == kind and len(stages) == 1 and not fam.alone:
                    per_stage.setdefault(next(iter(stages)), []).append(fi)
            if len(per_stage) != len(g.stages):
                continue
            kind_totals = {si: float(sum(t_peer[fi][0, 0] for fi in fis)) for si, fis in per_stage.items()}
            if not all(v > 0 for v in kind_totals.values()):
                continue
            target = float(np.mean(list(kind_totals.values())))
            for si, fis in per_stage.items():
                factor = target / kind_totals[si]
                # no heavier (or lighter) than the stage's layers: a reduction that outweighs the
                # compute it belongs to is slowed by something else (a link in its group)
                comp = [f for b, f in balance.get(g.stages[si].stage, {}).items() if b in ("fwd", "bwd")]
                if comp:
                    factor = float(np.clip(factor, min(min(comp), 1.0), max(max(comp), 1.0)))
                balance.setdefault(g.stages[si].stage, {})[str(kind)] = factor
                for fi in fis:
                    t_ideal[fi] = t_ideal[fi] * factor
    return Durations({"rec": rec, "rec0": rec0, "upeer": upeer, "own": own, "peer": peer, "ideal": ideal},
                     {"rec": t_rec, "own": t_own, "peer": t_peer, "ideal": t_ideal}, work, balance, block_share)


def _peer(o: np.ndarray, tp: np.ndarray) -> np.ndarray:
    """Per node, the typical own mean of each column's like-with-like peers (same tensor-parallel
    position): the median; of two, the faster (faults only add time)."""
    p = np.empty_like(o)
    for t in sorted_unique(tp):
        sel = tp == t
        if sel.sum() == 2:
            p[:, sel] = np.min(o[:, sel], axis=1, keepdims=True)
        else:
            p[:, sel] = np.median(o[:, sel], axis=1, keepdims=True)
    return p


#: Group kinds whose collectives scale with the layers a stage holds.
_MOVES_WITH_LAYERS = ("dp", "edp", "tp", "cp", "ep")


def _once(st) -> np.ndarray:
    """Weights that count each own-time interval of a stage's template once: a gap before an event
    the rank did not wait for lies inside the next gap (both are measured from the same cursor)."""
    w = st.blocking.astype(np.float64)
    return w if w.any() else np.ones(st.n)
