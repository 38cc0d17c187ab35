"""L4 GPU idle gaps: inside a phase that took far longer than its peers', was the device
working or waiting for the host?

With raw device records (small runs, evidence) the answer is measured: the union of kernel
intervals inside the phase, the launch rate and the longest gap between kernels, against a
few peers running the same phase. Without them, kernel summaries already told L3 that the
rank's kernels are normal, so the phase's excess over its peers is the idle share — reported
as an estimate (``method: summaries``). Sparse launches with a mostly idle device mean the
host stalled (production case 4: one microbatch's backward 40× longer, GPU mostly idle).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.compute as pc

from argus.analysis.frames import WindowFrames
from argus.store import Attempt
from argus.vocab import EvidenceKind, KernelKind, Level

__all__ = ["gpu_idle", "IDLE_STALL_PCT"]

IDLE_STALL_PCT = 50.0  # a phase whose device idled more than this share was a host stall


def _union_ns(start: np.ndarray, end: np.ndarray) -> tuple[float, float]:
    """(covered ns, longest uncovered gap ns) of intervals, assumed within one window."""
    if start.size == 0:
        return 0.0, 0.0
    order = np.argsort(start)
    s, e = start[order].astype(np.float64), end[order].astype(np.float64)
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])  # each merged busy stretch begins here
    seg_lo, seg_hi = s[first], np.maximum.reduceat(e, first)
    gaps = seg_lo[1:] - seg_hi[:-1]
    return float((seg_hi - seg_lo).sum()), float(gaps.max()) if gaps.size else 0.0


def _instances(attempt: Attempt, ranks: list[int], steps: list[int], phase: str, mb: int,
               frames: WindowFrames | None) -> tuple[np.ndarray, ...]:
    """(rank, step, start ns, dur ns, wait ns) of the finished instances of ``phase``."""
    if frames is None:
        filt = pc.field("rank").isin(ranks) & pc.field("step").isin(steps) & (pc.field("name") == phase) \
            & (pc.field("dur_ns") >= 0)
        if mb >= 0:
            filt &= pc.field("microbatch") == mb
        t = attempt.read("phases", columns=["rank", "step", "microbatch", "start_ns", "dur_ns", "wait_ns"],
                         filter=filt)
        return tuple(t.column(c).to_numpy() for c in ("rank", "step", "start_ns", "dur_ns")) + (
            t.column("wait_ns").fill_null(-1).to_numpy(),)
    f = frames.of_steps(steps, ranks)
    sel = (f.name == f.name_id(phase)) & (f.dur >= 0)
    if mb >= 0:
        sel &= f.mb == mb
    wait = f.wait if f.wait is not None else np.full(f.n, -1, np.int64)
    return f.rank[sel], f.step[sel], f.start[sel], f.dur[sel], wait[sel]


def _device(attempt: Attempt, rank: int, step: int, lo: int, hi: int) -> tuple[int, float, float] | None:
    """(kernels, busy ns, longest gap ns) of ``rank``'s device records inside [lo, hi)."""
    t = attempt.read("kernels", columns=["rank", "step", "kind", "start_ns", "dur_ns"],
                     filter=(pc.field("rank") == rank) & (pc.field("step") == step))
    if t.num_rows == 0:
        return None
    kind = np.asarray(t.column("kind").to_pylist(), dtype=object)
    start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
    m = (kind != KernelKind.CPU_OP) & (start >= lo) & (start < hi)
    if not (kind != KernelKind.CPU_OP).any():
        return None  # CPU-op stand-ins say nothing about a device
    busy, gap = _union_ns(start[m], np.minimum(start[m] + dur[m], hi))
    edges = np.sort(np.r_[lo, start[m], hi]) if m.any() else np.array([lo, hi])
    return int(m.sum()), busy, max(gap, float(np.diff(edges).max()))


def gpu_idle(attempt: Attempt, rank: int, steps: list[int], phase: str, mb: int = -1,
             frames: WindowFrames | None = None) -> dict | None:
    """Device activity inside ``rank``'s longest ``phase`` (microbatch ``mb``) over ``steps``
    (phases from the shared ``frames`` when given)."""
    if not steps or not phase:
        return None
    peers = [int(p) for p in attempt.layout.peer_set(rank) if int(p) != rank][:8]
    r, s, start, dur, wait = _instances(attempt, [rank, *peers], steps, phase, mb, frames)
    if r.size == 0:
        return None
    # work: the duration less the time the producer saw the phase blocked in communication
    # (a DDP backward waits for the stalled rank's gradients: that is not its own work)
    work = (dur - np.maximum(wait, 0)).astype(np.float64)
    mine = np.flatnonzero(r == rank)
    if mine.size == 0:
        return None
    i = mine[np.argmax(work[mine])]
    step, lo, d = int(s[i]), int(start[i]), float(work[i])
    ref = (r != rank) & (s == step)
    peer_d = float(np.median(work[ref])) if ref.any() else float("nan")
    out: dict[str, Any] = {"level": Level.L4, "kind": EvidenceKind.GPU_IDLE, "rank": int(rank), "step": step, "phase": phase,
           "microbatch": int(mb), "phase_ms": round(d / 1e6, 3),
           "peer_phase_ms": None if not np.isfinite(peer_d) else round(peer_d / 1e6, 3)}
    dev = _device(attempt, rank, step, lo, lo + int(dur[i]))
    if dev is not None:
        n, busy, gap = dev
        peer_dev = [x for x in (_device(attempt, int(r[j]), step, int(start[j]), int(start[j] + dur[j]))
                                for j in np.flatnonzero(ref)[:3]) if x is not None]
        out.update(method="raw_kernels", kernels=n, gpu_busy_ms=round(busy / 1e6, 3),
                   idle_pct=round(100.0 * (1.0 - busy / d), 2) if d > 0 else None,
                   longest_gap_ms=round(gap / 1e6, 3),
                   launches_per_ms=round(n / (d / 1e6), 4) if d > 0 else None)
        if peer_dev:
            pn = float(np.median([x[0] for x in peer_dev]))
            pb = float(np.median([x[1] for x in peer_dev]))
            out.update(peer_kernels=pn, peer_gpu_busy_ms=round(pb / 1e6, 3),
                       peer_launches_per_ms=round(pn / (peer_d / 1e6), 4) if peer_d > 0 else None)
    elif np.isfinite(peer_d) and d > 0:
        out.update(method="summaries", idle_pct=round(100.0 * max(d - peer_d, 0.0) / d, 2),
                   gpu_busy_ms=round(min(peer_d, d) / 1e6, 3),
                   note="kernel summaries are normal for this rank: the phase's excess over its peers is "
                        "device idle time (estimate; raw kernel records give the exact gaps)")
    else:
        return None
    idle = out.get("idle_pct")
    out["host_stall"] = bool(idle is not None and idle >= IDLE_STALL_PCT)
    return out
