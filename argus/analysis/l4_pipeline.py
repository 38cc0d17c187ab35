"""L4 pipeline analysis: per stage and microbatch, busy time against bubble time in the
culprit's pipeline, compared with the same stages of the other pipelines.

The stage whose own work grew is where the bubbles originate; every other stage of its
pipeline idles waiting for it. The **amplification** is the idle time the other stages
gained per unit of extra work at the origin — how far one slow stage's cost spreads along
the pipeline (production case 3: one stage's backward at 173 ms instead of 92 ms while the
step totals of all stages still align).
"""

from __future__ import annotations

import numpy as np

from argus.analysis.frames import WindowFrames, load_phases
from argus.store import Attempt
from argus.vocab import EvidenceKind, GroupKind, Level

__all__ = ["pipeline_bubbles"]


def _block_kind(name: str) -> str | None:
    low = name.lower()
    if "backward" in low:
        return "bwd"
    if "forward" in low:
        return "fwd"
    return None


def _stage_rows(f, rank: int, mbs: int, kinds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(busy fwd per mb, busy bwd per mb, pipeline wait per mb, step span) of one rank, ms."""
    m = f.rank == rank
    fwd, bwd, wait = np.zeros(mbs), np.zeros(mbs), np.zeros(mbs)
    if not m.any():
        return fwd, bwd, wait, 0.0
    mb = f.mb[m]
    ok = (mb >= 0) & (mb < mbs)
    kind = kinds[f.name[m]]
    busy = np.nan_to_num(f.busy[m]) / 1e6
    np.add.at(fwd, mb[ok & (kind == 1)], busy[ok & (kind == 1)])
    np.add.at(bwd, mb[ok & (kind == 2)], busy[ok & (kind == 2)])
    pp = f.groups.index(GroupKind.PP) if GroupKind.PP in f.groups else -1
    recv = np.array(["recv" in n.lower() for n in f.names])[f.name[m]]
    is_wait = ok & f.is_comm[m] & (f.group[m] == pp) & recv
    np.add.at(wait, mb[is_wait], np.maximum(f.dur[m][is_wait], 0) / 1e6)
    span = float((f.start[m] + np.maximum(f.dur[m], 0)).max() - f.start[m].min()) / 1e6
    return fwd, bwd, wait, span


def pipeline_bubbles(attempt: Attempt, culprits: list[int], step: int,
                     frames: WindowFrames | None = None) -> dict | None:
    """Busy/bubble per stage (and microbatch) of the first culprit's pipeline in ``step``,
    against the median of the same stage in the other pipelines (phases from the shared
    ``frames`` when given)."""
    layout = attempt.layout
    if layout.pp < 2 or not culprits:
        return None
    line = [int(r) for r in layout.group_of(GroupKind.PP, culprits[0])]
    bad = set(culprits)
    peers = {r: [int(p) for p in layout.peer_set(r) if int(p) not in bad][:16] for r in line}
    ranks = sorted(set(line) | {p for ps in peers.values() for p in ps})
    f = frames.phases(step, step, ranks) if frames is not None else load_phases(attempt, step, step, np.asarray(ranks))
    if f.n == 0:
        return None
    kinds = np.array([{"fwd": 1, "bwd": 2}.get(_block_kind(n) or "", 0) for n in f.names])
    work = ~f.is_comm
    if not (work & (kinds[f.name] > 0)).any():
        return None
    mbs = int(f.mb.max()) + 1 if (f.mb >= 0).any() else 0
    if mbs == 0:
        return None
    stages, busy_mb, bubble_mb = [], [], []
    for stage, r in enumerate(line):
        fwd, bwd, wait, span = _stage_rows(f, r, mbs, kinds)
        ref = [_stage_rows(f, p, mbs, kinds) for p in peers[r]]
        busy = float(fwd.sum() + bwd.sum())
        peer_busy = float(np.median([x[0].sum() + x[1].sum() for x in ref])) if ref else float("nan")
        peer_span = float(np.median([x[3] for x in ref])) if ref else float("nan")
        peer_bwd = np.median(np.stack([x[1] for x in ref]), axis=0) if ref else np.full(mbs, np.nan)
        peer_fwd = np.median(np.stack([x[0] for x in ref]), axis=0) if ref else np.full(mbs, np.nan)
        # bubbles: time blocked receiving from the neighbour stages (the end-of-step wait for
        # the slowest pipeline is the same for every pipeline and says nothing about this one)
        bubble = float(wait.sum())
        peer_bubble = float(np.median([x[2].sum() for x in ref])) if ref else float("nan")
        stages.append({"stage": stage, "rank": r, "busy_ms": round(busy, 3), "bubble_ms": round(bubble, 3),
                       "peer_busy_ms": round(peer_busy, 3), "peer_bubble_ms": round(peer_bubble, 3),
                       "span_ms": round(span, 3), "peer_span_ms": round(peer_span, 3),
                       "fwd_ms_per_mb": round(float(np.median(fwd)), 3),
                       "bwd_ms_per_mb": round(float(np.median(bwd)), 3),
                       "peer_fwd_ms_per_mb": round(float(np.median(peer_fwd)), 3),
                       "peer_bwd_ms_per_mb": round(float(np.median(peer_bwd)), 3)})
        busy_mb.append((fwd + bwd).round(3).tolist())
        bubble_mb.append(wait.round(3).tolist())
    excess = [s["busy_ms"] - s["peer_busy_ms"] for s in stages]
    origin = int(np.nanargmax(excess))
    gained = sum(max(s["bubble_ms"] - s["peer_bubble_ms"], 0.0) for i, s in enumerate(stages) if i != origin)
    amplification = gained / excess[origin] if excess[origin] > 0 else float("nan")
    o = stages[origin]
    worst = "bwd" if o["bwd_ms_per_mb"] - o["peer_bwd_ms_per_mb"] >= o["fwd_ms_per_mb"] - o["peer_fwd_ms_per_mb"] \
        else "fwd"
    return {"level": Level.L4, "kind": EvidenceKind.PIPELINE, "step": int(step), "pipeline_ranks": line, "stages": stages,
            "microbatches": {"busy_ms": busy_mb, "pipeline_wait_ms": bubble_mb},
            "origin_stage": origin, "origin_rank": int(line[origin]),
            "amplification": None if not np.isfinite(amplification) else round(float(amplification), 3),
            "note": f"stage {origin} (rank {line[origin]}) {'backward' if worst == 'bwd' else 'forward'} "
                    f"{o[worst + '_ms_per_mb']:.1f} ms per microbatch vs peers' {o['peer_' + worst + '_ms_per_mb']:.1f} ms; "
                    f"the other stages idle {gained:.1f} ms more than their peers for its {excess[origin]:.1f} ms "
                    f"of extra work"}
