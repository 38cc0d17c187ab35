"""L4 replay: the step's dependencies re-run from what every rank recorded, for the critical
path across ranks and for the **what-if** (the step with the culprits' work at their peers'
medians).

A rank's step is a chain of communication events separated by its own work (compute, host
time): the *gap* before each event is measured on the rank's own clock from the end of its
previous blocking event. Events synchronise ranks:

* a collective ends for all members at the last arrival plus its transfer time (the shortest
  member duration — the last to arrive waits for no one);
* a pipeline receive ends at the later of its own start and the matching send's start, plus
  the transfer; sends and receives are paired by pipeline group, microbatch, direction and
  stage (a receive before the rank's forward of that microbatch carries activations from the
  previous stage, one after it carries gradients from the next);
* an event during which the rank starts other work (an asynchronous send, a DDP bucket
  reduction under backward) does not block the rank.

Replaying with the recorded gaps reproduces the step; replacing the culprits' gaps by the
median of their peers' gaps at the same position gives the step without the fault. The
what-if is reported as the recorded step time scaled by (replay without fault / replay as
recorded), which cancels most of the model's own error. Host clocks are aligned first with
the offsets the collectives imply.

Above ``FULL_REPLAY_RANKS`` the replay runs on what the culprits touch, not the world: the
model replicas (every rank of one data-parallel index: its TP, CP, EP groups and pipeline
neighbours) that hold a culprit, and a few healthy replicas spread over the data-parallel
axis standing for the others (enough for ``REPLAY_PEERS`` peers of each culprit). Every group inside a replica is whole; the
data-parallel collectives keep one member per replayed replica — the culprit's and its
peers', enough for the last arrival and the transfer. Cost and memory are those of a few
replicas at any world size.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from argus.analysis.collectives import host_clock_offsets, match_instances, pair_p2p
from argus.analysis.frames import PhaseFrame, WindowFrames, load_phases
from argus.store import Attempt
from argus.topology import Layout
from argus.vocab import EvidenceKind, Level

__all__ = ["StepReplay", "WhatIf", "replay_step", "replay_ranks", "what_if", "FULL_REPLAY_RANKS", "REPLAY_PEERS"]

#: Up to this world size every rank is replayed (what L2 compares exactly, ``DiagnoseConfig.exact_ranks``):
#: the replay, a Python event loop, costs ~4 s per 2 M events, a few seconds at 2,048 ranks.
FULL_REPLAY_RANKS = 2048
#: Above ``FULL_REPLAY_RANKS``: healthy peers (same work, other replicas) replayed per culprit, for
#: the median its work is set to; each healthy replica brings cp × ep of them.
REPLAY_PEERS = 8
#: … and at least this many healthy replicas, so that one slow replica is not the whole reference
#: and the data-parallel collectives' last arrival is typical of the healthy ones.
MIN_HEALTHY_REPLICAS = 2


@dataclass
class StepReplay:
    step: int
    recorded_s: float  # job step time as recorded (median over ranks)
    asis_s: float  # the replay with the recorded gaps
    fixed_s: float  # the replay with the culprits' gaps at their peers' medians
    critical: dict[int, float]  # rank → share of the critical path spent in its own work
    forced: int = 0  # events completed without all their members (matching gaps)

    @property
    def without_fault_s(self) -> float:
        return self.recorded_s * (self.fixed_s / self.asis_s) if self.asis_s > 0 else self.recorded_s

    @property
    def fidelity_pct(self) -> float:
        return 100.0 * (self.asis_s / self.recorded_s - 1.0) if self.recorded_s > 0 else float("nan")


@dataclass
class WhatIf:
    steps: list[int]  # steps the impact covers
    replays: list[StepReplay]  # the sampled steps actually replayed
    extra_s: float  # job time the fault cost over ``steps``
    slowdown_pct: float  # extra time relative to the job without the fault
    gpu_hours_lost: float
    critical: dict[int, float] = field(default_factory=dict)  # mean share per rank over the replays

    def to_json(self) -> dict:
        return {"level": Level.L4, "kind": EvidenceKind.WHAT_IF, "steps": [r.step for r in self.replays],
                "step_s": [round(r.recorded_s, 6) for r in self.replays],
                "without_fault_s": [round(r.without_fault_s, 6) for r in self.replays],
                "replay_error_pct": [round(r.fidelity_pct, 2) for r in self.replays],
                "covers_steps": len(self.steps), "extra_s": round(self.extra_s, 6),
                "slowdown_pct": round(self.slowdown_pct, 3), "gpu_hours_lost": round(self.gpu_hours_lost, 6),
                "note": "culprits' work between communication events replaced by their peers' medians, "
                        "the step's collective and pipeline dependencies replayed"}

    def critical_json(self, top: int = 8) -> dict:
        ranked = sorted(self.critical.items(), key=lambda kv: -kv[1])[:top]
        return {"level": Level.L4, "kind": EvidenceKind.CRITICAL_PATH, "step": self.replays[0].step if self.replays else None,
                "by_rank": [{"rank": int(r), "share": round(s, 4)} for r, s in ranked],
                "note": "share of the step's critical path spent in each rank's own work (the rank the "
                        "others waited for at each synchronisation)"}


# -- events -----------------------------------------------------------------------------------
@dataclass
class _Events:
    rank: np.ndarray  # per event
    gap: np.ndarray  # own work before the event (ns)
    blocking: np.ndarray
    unit: np.ndarray  # synchronisation unit of each event
    unit_size: np.ndarray
    unit_transfer: np.ndarray
    by_rank: dict[int, list[int]]  # rank → its events in order
    step_start: dict[int, float]
    tail: dict[int, float]  # own work after the last blocking event


def _events(f: PhaseFrame, layout: Layout, hosts: np.ndarray, starts: dict[int, int],
            ends: dict[int, int]) -> _Events | None:
    comm = f.is_comm & (f.dur >= 0)
    c = np.flatnonzero(comm)
    if c.size == 0:
        return None
    # clock alignment: collectives end together on every member
    inst = match_instances(f, layout, np.zeros(f.n, np.int64))
    offsets = host_clock_offsets(f, inst, hosts) if inst is not None else {}
    off_rank = np.array([offsets.get(str(h), 0.0) for h in np.asarray(hosts).astype(str)])
    start = f.start.astype(np.float64) - off_rank[f.rank]
    end = start + np.maximum(f.dur, 0)
    # blocking: no other work of the rank starts inside the event (exact integer keys on the
    # rank's own clock: rank in the high bits, ns since the frame's first phase below)
    work = np.flatnonzero(~f.is_comm)
    rel = (f.start - f.start.min()).astype(np.int64)
    wkey = np.sort((f.rank[work] << 46) | rel[work])
    # Work starting at the very instant of a collective is the block that encloses it; at the
    # instant of a send it is the next microbatch, computed while the send is in flight.
    send = np.array(["send" in n.lower() for n in f.names])[f.name[c]]
    ckey = (f.rank[c] << 46) | rel[c]
    lo = np.where(send, np.searchsorted(wkey, ckey, side="left"), np.searchsorted(wkey, ckey, side="right"))
    hi = np.searchsorted(wkey, (f.rank[c] << 46) | (rel[c] + np.maximum(f.dur[c], 0)), side="left")
    blocking = hi <= lo
    # units: collective instances, then pipeline pairs, the rest alone
    unit = np.full(f.n, -1, np.int64)
    transfer: list[float] = []
    if inst is not None:
        unit[inst.rows] = inst.inv
        transfer = list(inst.transfer_ns)
    n_units = len(transfer)
    n_units = _pair_p2p(f, layout, start, end, unit, transfer, n_units)
    alone = c[unit[c] < 0]
    unit[alone] = np.arange(n_units, n_units + alone.size)
    transfer += list(f.dur[alone].astype(np.float64))
    unit_c = unit[c]
    _, dense = np.unique(unit_c, return_inverse=True)
    size = np.bincount(dense)
    tr = np.zeros(size.size)
    tr[dense] = np.asarray(transfer, np.float64)[unit_c]
    # Gaps, vectorised: the cursor before an event is the later of the rank's step start and
    # the end of its previous blocking event (a running max within each rank's run of rows).
    ev_rank = f.rank[c]
    base = float(start[c].min())
    rel = start[c] - base
    ranks, first, counts = np.unique(ev_rank, return_index=True, return_counts=True)
    seg = np.repeat(np.arange(ranks.size), counts)
    s0 = np.array([starts.get(int(r), np.nan) for r in ranks], np.float64) - off_rank[ranks] - base
    ss = np.fmin(np.where(np.isnan(s0), rel[first], s0), rel[first])
    floor = float(min(rel.min(), ss.min())) - 1.0
    ends_b = np.where(blocking, rel + np.maximum(f.dur[c], 0), floor)
    lift = (float(np.abs(ends_b).max()) + float(np.abs(floor)) + 1.0) * seg
    running = np.maximum.accumulate(ends_b + lift) - lift
    prev = np.r_[floor, running[:-1]]
    prev[first] = floor  # nothing before a rank's first event
    cursor = np.maximum(ss[seg], prev)
    gap = np.maximum(rel - cursor, 0.0)
    final = np.maximum(ss, running[first + counts - 1])
    end_ns = np.array([ends.get(int(r), -1) for r in ranks], np.float64)
    tail_v = np.where(end_ns >= 0, np.maximum(end_ns - off_rank[ranks] - base - final, 0.0), 0.0)
    rl = ranks.tolist()
    by_rank = {r: list(range(a, a + n)) for r, a, n in zip(rl, first.tolist(), counts.tolist())}
    return _Events(ev_rank, gap, blocking, dense, size, tr, by_rank, dict(zip(rl, ss.tolist())),
                   dict(zip(rl, tail_v.tolist())))


def _pair_p2p(f: PhaseFrame, layout: Layout, start: np.ndarray, end: np.ndarray, unit: np.ndarray,
              transfer: list[float], n_units: int) -> int:
    """Pair pipeline sends with receives into units; returns the new unit count."""
    recv, send = pair_p2p(f, layout, start)
    for r_i, s_i in zip(recv.tolist(), send.tolist()):
        unit[r_i] = unit[s_i] = n_units
        transfer.append(max(end[r_i] - max(start[r_i], start[s_i]), 0.0))
        n_units += 1
    return n_units


# -- the replay -------------------------------------------------------------------------------
def _replay(ev: _Events, gap: np.ndarray, tail: dict[int, float]) -> tuple[dict[int, float], dict[int, float], int]:
    """Returns (rank → replayed step duration, rank → critical-path share, forced units).
    Plain Python lists: the loop is per event, and numpy scalar indexing would triple its cost."""
    n_units = ev.unit_size.size
    unit, blocking, size = ev.unit.tolist(), ev.blocking.tolist(), ev.unit_size.tolist()
    transfer, gaps = ev.unit_transfer.tolist(), gap.tolist()
    arrived = [0] * n_units
    max_arr = [-math.inf] * n_units
    last = [-1] * n_units  # event that arrived last
    unit_end: list[float | None] = [None] * n_units
    arr: list[float | None] = [None] * len(unit)
    cursor = dict(ev.step_start)
    ptr = {r: 0 for r in ev.by_rank}
    waiters: dict[int, list[int]] = {}
    active = deque(ev.by_rank)
    done: dict[int, float] = {}
    forced = 0

    def complete(u: int) -> None:
        unit_end[u] = max_arr[u] + transfer[u]
        active.extend(waiters.pop(u, ()))

    while len(done) < len(ev.by_rank):
        while active:
            r = active.popleft()
            if r in done:
                continue
            events, i, cur = ev.by_rank[r], ptr[r], cursor[r]
            n = len(events)
            while i < n:
                e = events[i]
                u = unit[e]
                if arr[e] is None:
                    a = arr[e] = cur + gaps[e]
                    arrived[u] += 1
                    if a >= max_arr[u]:
                        max_arr[u], last[u] = a, e
                    if arrived[u] == size[u]:
                        complete(u)
                if blocking[e]:
                    end = unit_end[u]
                    if end is None:
                        waiters.setdefault(u, []).append(r)
                        break
                    if end > cur:
                        cur = end
                i += 1
            ptr[r], cursor[r] = i, cur
            if i >= n:
                done[r] = cur + tail[r] - ev.step_start[r]
        if len(done) < len(ev.by_rank):  # members missing (unmatched calls): release the earliest unit
            if not waiters:
                break
            u = min(waiters, key=lambda x: max_arr[x])
            forced += 1
            complete(u)
    critical = _critical_path(ev, gaps, tail, last, done)
    return done, critical, forced


def _critical_path(ev: _Events, gap: list[float], tail: dict[int, float], last: list[int],
                   done: dict[int, float]) -> dict[int, float]:
    """Walk back from the rank that finished last: at each blocking event, follow the member
    that arrived last; a rank's own gaps on that walk are its share of the critical path."""
    if not done:
        return {}
    r = max(done, key=lambda x: done[x] + ev.step_start[x])
    own: dict[int, float] = {r: tail[r]}
    pos = {q: {e: i for i, e in enumerate(events)} for q, events in ev.by_rank.items()}
    i = len(ev.by_rank[r]) - 1
    guard = ev.rank.size + 1
    while i >= 0 and guard > 0:
        guard -= 1
        e = ev.by_rank[r][i]
        if not ev.blocking[e]:
            own[r] = own.get(r, 0.0) + gap[e]
            i -= 1
            continue
        u = int(ev.unit[e])
        q_e = last[u] if last[u] >= 0 else e
        q = int(ev.rank[q_e])
        own[q] = own.get(q, 0.0) + gap[q_e]
        r, i = q, pos[q][q_e] - 1
    total = sum(own.values())
    return {k: v / total for k, v in own.items() if v > 0} if total > 0 else {}


def _fixed_gaps(ev: _Events, culprits: list[int], layout: Layout) -> tuple[np.ndarray, dict[int, float]]:
    gap, tail = ev.gap.copy(), dict(ev.tail)
    bad = set(culprits)
    for r in culprits:
        if r not in ev.by_rank:
            continue
        mine = ev.by_rank[r]
        peers = [int(p) for p in layout.peer_set(r) if int(p) not in bad and int(p) in ev.by_rank]
        if not peers:
            continue
        same = [p for p in peers if len(ev.by_rank[p]) == len(mine)]
        if len(same) >= max(1, len(peers) // 2):
            gap[mine] = np.median(np.stack([ev.gap[ev.by_rank[p]] for p in same]), axis=0)
        else:  # different event sequences: scale the rank's work to its peers' total
            own = ev.gap[mine].sum()
            ref = np.median([ev.gap[ev.by_rank[p]].sum() for p in peers])
            if own > 0:
                gap[mine] *= ref / own
        tail[r] = float(np.median([ev.tail[p] for p in peers]))
    return gap, tail


def replay_ranks(layout: Layout, culprits: list[int]) -> np.ndarray | None:
    """The ranks a replay of ``culprits`` needs: None (every rank) up to ``FULL_REPLAY_RANKS``,
    else the replicas holding a culprit and a few healthy ones evenly spread over the dp axis."""
    if layout.world_size <= FULL_REPLAY_RANKS:
        return None
    dp = layout.coords()["dp"]
    bad = np.unique(dp[np.asarray(culprits, np.int64)]) if culprits else np.empty(0, np.int64)
    healthy = np.setdiff1d(np.arange(layout.dp), bad)
    n = min(max(MIN_HEALTHY_REPLICAS, math.ceil(REPLAY_PEERS / (layout.cp * layout.ep))), healthy.size)
    pick = healthy[np.unique(np.linspace(0, healthy.size - 1, n).round().astype(np.int64))] if n else healthy
    return np.flatnonzero(np.isin(dp, np.union1d(bad, pick)))


def replay_step(attempt: Attempt, step: int, culprits: list[int], hosts: np.ndarray,
                recorded_s: float, frames: WindowFrames | None = None) -> StepReplay | None:
    """Replay one step as recorded and with the culprits' work at their peers' medians
    (phases from the shared ``frames`` when given; see :func:`replay_ranks` for which ranks)."""
    layout = attempt.layout
    ranks = replay_ranks(layout, culprits)
    f = frames.phases(step, step, ranks) if frames is not None else load_phases(attempt, step, step, ranks)
    if f.n == 0 or (f.dur < 0).any():
        return None
    where = "" if ranks is None else f" AND rank IN ({','.join(str(int(r)) for r in ranks)})"
    st = attempt.sql(f"SELECT rank, start_ns, end_ns FROM steps WHERE step = {int(step)}{where}")
    starts = dict(zip(st.column("rank").to_pylist(), st.column("start_ns").to_pylist()))
    ends = dict(zip(st.column("rank").to_pylist(), st.column("end_ns").to_pylist()))
    ev = _events(f, layout, hosts, starts, ends)
    if ev is None:
        return None
    asis, critical, forced = _replay(ev, ev.gap, ev.tail)
    gap, tail = _fixed_gaps(ev, culprits, layout)
    fixed, _, _ = _replay(ev, gap, tail)
    if not asis or not fixed:
        return None
    return StepReplay(step, recorded_s, float(np.median(list(asis.values()))) / 1e9,
                      float(np.median(list(fixed.values()))) / 1e9, critical, forced)


def what_if(attempt: Attempt, steps: list[int], culprits: list[int], hosts: np.ndarray,
            step_time: dict[int, float], max_replays: int = 4, replay_from: list[int] | None = None,
            event_budget: int = 0, frames: WindowFrames | None = None) -> WhatIf | None:
    """Impact of the culprits over ``steps``: a few of them replayed, the median time saved
    applied to the others (intermittent faults: every affected step replayed, up to the cap)."""
    usable = [s for s in steps if np.isfinite(step_time.get(s, np.nan))]
    if not usable:
        return None
    pool = [s for s in (replay_from or usable) if s in set(usable)] or usable  # e.g. normal steps only
    if event_budget:  # small jobs: replay more steps, each is cheap; large ones: one
        ranks = replay_ranks(attempt.layout, culprits)
        if frames is not None:
            per_step = int(frames.phases(pool[0], pool[0], ranks).is_comm.sum()) or 1
        else:
            where = "" if ranks is None else f" AND rank IN ({','.join(str(int(r)) for r in ranks)})"
            per_step = attempt.sql(f"SELECT count(*) AS n FROM phases WHERE step = {int(pool[0])} "
                                   f"AND category = 'comm'{where}").column("n")[0].as_py() or 1
        max_replays = max(max_replays, min(len(pool), event_budget // per_step))
        if per_step * max_replays > 4 * event_budget:
            max_replays = 1
    pick = pool if len(pool) <= max_replays else [pool[int(i)] for i in np.linspace(0, len(pool) - 1,
                                                                                  max_replays).round()]
    replays = [r for r in (replay_step(attempt, s, culprits, hosts, step_time[s], frames) for s in pick)
               if r is not None]
    if not replays:
        return None
    # seconds saved, not shares: a fault costs about the same time in a long checkpoint step
    saved = {r.step: max(r.recorded_s - r.without_fault_s, 0.0) for r in replays}
    typical = float(np.median(list(saved.values())))
    extra = float(sum(saved.get(s, typical) for s in usable))
    total = float(sum(step_time[s] for s in usable))
    world = attempt.layout.world_size
    critical: dict[int, float] = {}
    for r in replays:
        for k, v in r.critical.items():
            critical[k] = critical.get(k, 0.0) + v / len(replays)
    return WhatIf(usable, replays, extra, 100.0 * extra / max(total - extra, 1e-12), world * extra / 3600.0,
                  critical)
