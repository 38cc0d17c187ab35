"""Each rank's step as a chain of communication events separated by its own time.

From one window's recorded phases (``PhaseFrame``), vectorised over every rank at once:

* the **events** of a (rank, step) are its finished communication phases in start order;
  an event is **blocking** when the rank starts nothing else (work or another event) while
  it runs — the rank waited for it; otherwise it ran beside the rank's work (a DDP bucket under
  backward, an asynchronous send, the first of a batched send/receive pair);
* the **gap** before an event is the rank's own time since its *cursor* — the end of its last
  blocking event, or the step's origin — measured on its own clock, so no clock alignment is
  needed for it;
* the step's **origin** on a rank is the end of its last blocking event of the previous step
  when that step is in the window (what the rank did after it — an optimizer, a checkpoint
  save, work no phase covers — is the first gap of this step: time between recorded phases is
  a node of the graph, not a hole), else the rank's recorded step start;
* each gap is split into **components**: the time of each top-level work phase (compute or
  host; nested module phases are inside their block) that falls in it, by phase name, and the
  rest — time no phase covers — ``untracked``;
* pipeline events get their **peer stage**: from ``forward``/``backward`` in their name
  (``forward-send`` goes to the next stage), else with two stages the other one, else from the
  block next to them (a receive before a forward block brings activations from the previous
  stage), else unknown (left unpaired).

Cost: a few sorts and ``searchsorted`` over the frame; memory O(events × components)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.collectives import host_clock_offsets, match_instances
from argus.analysis.frames import PhaseFrame
from argus.topology import Layout
from argus.uniques import sorted_unique
from argus.vocab import GroupKind, PhaseCategory

__all__ = ["Chains", "Component", "StepBounds", "build_chains", "UNTRACKED", "MAX_COMPONENTS"]

#: The component of a gap no recorded phase covers.
UNTRACKED = "untracked"
#: Named components kept (by total time); the rest are summed as ``other``.
MAX_COMPONENTS = 8
_SHIFT = 46  # rank in the high bits of a (rank, ns since the frame's first phase) key: 19.5 hours of window
#: An op that starts this close to an event's end (or this share of its duration) starts after it:
#: a profiler's rounded timestamps put the next op a few hundred ns inside the last.
_TOLERANCE_NS = 2_000
_TOLERANCE_SHARE = 0.01
#: A step whose recorded start is within this of the previous step's recorded end follows it directly.
_CONTIGUOUS_NS = 1_000_000


@dataclass(frozen=True, slots=True)
class Component:
    """What a part of a gap is: a phase name (or ``untracked``/``other``), its category, and
    whether it is a forward or backward block (the unit a pipeline's stages are balanced in)."""

    name: str
    category: str  # compute | host | untracked
    block: str | None  # "fwd" | "bwd" | None


@dataclass
class WorkTime:
    """The ranks' top-level work phases, clipped so they do not overlap, sorted by (rank, start):
    a cumulative sum per component gives any interval's work in two lookups."""

    rank: np.ndarray  # int64
    start: np.ndarray  # float64 ns since the frame's base (own clock)
    end: np.ndarray
    comp: np.ndarray  # int64 component of each phase
    cum: np.ndarray  # (components - 1, phases + 1) cumulative durations per named component
    #: per rank (``own_ranks``, sorted), step (``own_steps``, sorted) and named component: the
    #: time of its phases (``own_dur``) and the part of it that was the rank's own work
    #: (``own_busy``) — the rest the run-queue delay and the waits the producer measured inside
    #: them (a CPU job's process preempted by others); None where nothing was measured (GPU
    #: timelines), the phases then counting whole
    own_ranks: np.ndarray | None = None
    own_steps: np.ndarray | None = None
    own_dur: np.ndarray | None = None
    own_busy: np.ndarray | None = None

    def own_share(self, ranks: np.ndarray, steps: np.ndarray | None = None) -> np.ndarray:
        """Each rank's own-work share per named component: (len(ranks), components - 1) over all
        the steps, or per step of ``steps``, (len(ranks), len(steps), components - 1)."""
        n_named = self.cum.shape[0]
        shape = (len(ranks), n_named) if steps is None else (len(ranks), len(steps), n_named)
        out = np.ones(shape)
        if self.own_busy is None or self.own_dur is None or self.own_ranks is None or self.own_steps is None:
            return out
        ri = _lookup(self.own_ranks, ranks)
        hit = ri >= 0
        if steps is None:
            dur, busy = self.own_dur[ri[hit]].sum(axis=1), self.own_busy[ri[hit]].sum(axis=1)
            out[hit] = np.where(dur > 0, busy / np.maximum(dur, 1e-9), 1.0)
            return out
        si = _lookup(self.own_steps, steps)
        sk = si >= 0
        dur = self.own_dur[ri[hit]][:, si[sk]]
        busy = self.own_busy[ri[hit]][:, si[sk]]
        sub = out[hit]
        sub[:, sk] = np.where(dur > 0, busy / np.maximum(dur, 1e-9), 1.0)
        out[hit] = sub
        return out

    def split(self, rank: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Each interval [a, b) of ``rank`` (flat arrays) split into the named components, then
        ``untracked`` (what no phase covers): shape (len(a), components), float32."""
        n_named = self.cum.shape[0]
        out = np.zeros((len(a), n_named + 1), np.float32)
        gap = np.maximum(b - a, 0.0)
        if self.rank.size and n_named:
            hi = np.asarray(rank, np.int64) << _SHIFT
            skey = (self.rank << _SHIFT) | self.start.astype(np.int64)
            ekey = (self.rank << _SHIFT) | self.end.astype(np.int64)
            i0 = np.searchsorted(ekey, hi | np.maximum(a, 0.0).astype(np.int64), side="right")
            i1 = np.searchsorted(skey, hi | np.maximum(b, 0.0).astype(np.int64), side="left")
            has = i1 > i0
            last_i = self.rank.size - 1
            first = np.minimum(i0, last_i)
            last = np.clip(i1 - 1, 0, last_i)
            over_a = np.where(has, np.maximum(a - self.start[first], 0.0), 0.0)
            over_b = np.where(has, np.maximum(self.end[last] - b, 0.0), 0.0)
            lo = np.minimum(i0, i1)
            for j in range(n_named):
                tot = self.cum[j, i1] - self.cum[j, lo]
                tot = tot - np.where(self.comp[first] == j, over_a, 0.0) - np.where(self.comp[last] == j, over_b, 0.0)
                out[:, j] = np.maximum(tot, 0.0)
            covered = out[:, :-1].sum(axis=1)
            over = covered > gap
            if over.any():  # phases counted twice: scaled to the interval
                out[over, :-1] *= (gap[over] / covered[over])[:, None].astype(np.float32)
                covered = out[:, :-1].sum(axis=1)
        else:
            covered = np.zeros(len(a))
        out[:, -1] = np.maximum(gap - covered, 0.0)
        return out


@dataclass
class Chains:
    """Per event (sorted by rank, step, start) and per (rank, step) run of events."""

    rank: np.ndarray  # int64
    step: np.ndarray  # int64
    name: np.ndarray  # int32 into ``names``
    kind: np.ndarray  # int32 into ``kinds`` (group kinds as recorded)
    send: np.ndarray  # bool: a pipeline send
    recv: np.ndarray  # bool: a pipeline receive
    peer: np.ndarray  # int8: pipeline peer's stage offset (+1 next, -1 previous, 0 unknown / not p2p)
    blocking: np.ndarray  # bool, as this rank's recording shows it
    start: np.ndarray  # float64 ns since the frame's base (own clock)
    dur: np.ndarray  # float64 ns
    names: list[str]
    kinds: list[str]
    components: list[Component]
    work: WorkTime
    # per (rank, step) run, in (rank, step) order
    run_rank: np.ndarray
    run_step: np.ndarray
    run_first: np.ndarray  # index of the run's first event
    run_count: np.ndarray
    run_origin: np.ndarray  # float64 ns, own clock (like ``start``): where the step begins on the rank
    origin: np.ndarray  # the same on one clock (host offsets removed), for comparisons across ranks
    final: np.ndarray  # one clock: the end of the run's last event the rank had to finish
    shift: np.ndarray  # per rank (world): add to an own-clock time (``start``) for the one clock

    @property
    def n(self) -> int:
        return len(self.rank)

    def gaps(self, ev: np.ndarray, runs: np.ndarray, blocking: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Gaps (n, C, K) and their components (n, C, K, J) of the events ``ev`` (n, C, K) whose
        runs are ``runs`` (C, K), each rank's cursor moved by the events ``blocking`` (n,) says
        it waited for — the template's, so that a replay and its gaps agree."""
        n = ev.shape[0]
        cursor = self.run_origin[runs].astype(np.float64)
        a = np.empty(ev.shape)
        for i in range(n):
            a[i] = cursor
            if blocking[i]:
                e = ev[i]
                cursor = np.maximum(cursor, self.start[e] + self.dur[e])
        b = np.maximum(self.start[ev], a)
        comp = self.work.split(self.rank[ev].ravel(), a.ravel(), b.ravel())
        return (b - a), comp.reshape(*ev.shape, -1)


def _block(name: str) -> str | None:
    low = name.lower()
    if "backward" in low or low.endswith("-bwd"):
        return "bwd"
    if "forward" in low:
        return "fwd"
    return None


def _peer_from_name(name: str) -> tuple[bool, bool, int]:
    """(send, recv, peer stage offset) from a pipeline op's name."""
    low = name.lower()
    send, recv = "send" in low, "recv" in low
    if send and recv:  # a batched send-and-receive: left unpaired (one event cannot join two units)
        return False, False, 0
    direction = 1 if "forward" in low else -1 if "backward" in low else 0
    if send:
        return True, False, direction
    if recv:
        return False, True, -direction
    return False, False, 0


@dataclass(frozen=True)
class StepBounds:
    """The ``steps`` table's spans (own clock, ns), sorted by (rank, step)."""

    rank: np.ndarray
    step: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray  # -1: never finished

    @classmethod
    def of(cls, rank: np.ndarray, step: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> StepBounds:
        order = np.lexsort((step, rank))
        return cls(*(np.asarray(a, np.int64)[order] for a in (rank, step, start_ns, end_ns)))

    def lookup(self, rank: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of each (rank, step) as float64; nan where the table has no row."""
        start = np.full(len(rank), np.nan)
        end = np.full(len(rank), np.nan)
        if self.rank.size == 0:
            return start, end
        key = self.rank * (1 << 40) + self.step
        want = np.asarray(rank, np.int64) * (1 << 40) + np.asarray(step, np.int64)
        i = np.minimum(np.searchsorted(key, want), key.size - 1)
        hit = key[i] == want
        start[hit] = self.start_ns[i[hit]]
        end[hit] = np.where(self.end_ns[i[hit]] >= 0, self.end_ns[i[hit]], np.nan)
        return start, end


def build_chains(f: PhaseFrame, layout: Layout, hosts: np.ndarray, bounds: StepBounds | None = None) -> Chains | None:
    """The chains of every (rank, step) in ``f``. ``bounds``: the recorded step spans. A step
    begins where the rank's previous step finished waiting when the two steps are contiguous
    (the previous one's recorded end is this one's start, as ``argus run`` records them), else
    at its recorded start (steps sampled apart, as a profiler's are). None without a finished
    communication phase."""
    if f.n == 0:
        return None
    comm_cat = f.cat_id(PhaseCategory.COMM)
    finished = f.dur >= 0
    c = np.flatnonzero((f.cat == comm_cat) & finished)
    if c.size == 0:
        return None
    base = int(f.start.min())
    rel = (f.start - base).astype(np.int64)
    dur = np.maximum(f.dur, 0).astype(np.int64)
    rank = f.rank.astype(np.int64)
    key = (rank << _SHIFT) | rel
    work = np.flatnonzero((f.cat != comm_cat) & finished)
    wkey = np.sort(key[work])
    names = list(f.names)
    lname = [n.lower() for n in names]
    pp_id = f.groups.index(GroupKind.PP) if GroupKind.PP in f.groups else -1
    # events in time order per rank; those starting at one instant (a batched send/receive) in
    # name order, so every rank's sequence reads the same
    c = _time_order(c, key, f.name)
    is_p2p = f.group[c] == pp_id
    send_name = np.array(["send" in n for n in lname], bool)[f.name[c]]
    # -- blocking: nothing else of the rank starts while the event runs ----------------------
    # (timestamps rounded by a profiler put the next op a few ns inside the last: ignored)
    tol = np.maximum(_TOLERANCE_NS, (dur[c] * _TOLERANCE_SHARE).astype(np.int64))
    ckey = key[c]
    ekey = (rank[c] << _SHIFT) | np.maximum(rel[c] + dur[c] - tol, rel[c])
    # work starting at the very instant of a collective is the block enclosing it; at a send's
    # instant it is the next block, computed while the send is in flight
    lo = np.where(send_name, np.searchsorted(wkey, ckey, side="left"), np.searchsorted(wkey, ckey, side="right"))
    hi = np.searchsorted(wkey, ekey, side="left")
    work_inside = hi > lo
    # another event starting inside (or at the same instant, ordered after it: a batched pair)
    nxt_key = np.r_[ckey[1:], np.iinfo(np.int64).max]
    same_rank_next = np.r_[rank[c][1:] == rank[c][:-1], False]
    comm_inside = same_rank_next & ((nxt_key < ekey) | (nxt_key == ckey))
    blocking = ~(work_inside | comm_inside)
    # -- runs of (rank, step) --------------------------------------------------------------
    step = f.step[c].astype(np.int64)
    order = np.lexsort((np.arange(c.size), step, rank[c]))  # runs of (rank, step), time order inside
    c, blocking, is_p2p, send_name = c[order], blocking[order], is_p2p[order], send_name[order]
    step = step[order]
    ev_rank = rank[c]
    run_key = ev_rank * (int(step.max()) - int(step.min()) + 2) + (step - int(step.min()))
    new_run = np.r_[True, run_key[1:] != run_key[:-1]]
    run_first = np.flatnonzero(new_run)
    run_count = np.diff(np.r_[run_first, c.size])
    run_rank, run_step = ev_rank[run_first], step[run_first]
    start_ev = rel[c].astype(np.float64)
    end_ev = start_ev + dur[c]
    # where each run ends: the last event the rank had to finish (its sends aside)
    must = np.where(blocking | ~send_name, end_ev, -np.inf)
    run_end = np.maximum.reduceat(must, run_first)
    first_start = start_ev[run_first]
    # origin: the previous step's end on this rank, when that step is here and contiguous with this one
    if bounds is not None:
        rec_start, _ = bounds.lookup(run_rank, run_step)
        _, prev_rec_end = bounds.lookup(run_rank, run_step - 1)
        rec_start = rec_start - base
        prev_rec_end = prev_rec_end - base
    else:
        rec_start = np.full(run_first.size, np.nan)
        prev_rec_end = np.full(run_first.size, np.nan)
    prev_idx = np.maximum(np.arange(run_first.size) - 1, 0)
    has_prev = (np.arange(run_first.size) > 0) & (run_rank[prev_idx] == run_rank) & (run_step[prev_idx] == run_step - 1)
    contiguous = np.isnan(rec_start) | np.isnan(prev_rec_end) | (np.abs(prev_rec_end - rec_start) <= _CONTIGUOUS_NS)
    origin = np.where(has_prev & contiguous & np.isfinite(run_end[prev_idx]), run_end[prev_idx], rec_start)
    origin = np.where(np.isfinite(origin), origin, first_start)
    origin = np.minimum(origin, first_start)
    # -- pipeline peers -----------------------------------------------------------------------
    send = np.zeros(c.size, bool)
    recv = np.zeros(c.size, bool)
    peer = np.zeros(c.size, np.int8)
    if pp_id >= 0 and layout.pp > 1:
        by_name = [_peer_from_name(n) for n in names]
        send = np.array([b[0] for b in by_name], bool)[f.name[c]] & is_p2p
        recv = np.array([b[1] for b in by_name], bool)[f.name[c]] & is_p2p
        npeer = np.array([b[2] for b in by_name], np.int8)[f.name[c]]
        peer = np.where(is_p2p, npeer, 0).astype(np.int8)
        stage = layout.stage_of(ev_rank)
        if layout.pp == 2:
            peer = np.where(is_p2p & (peer == 0), np.where(stage == 0, 1, -1), peer).astype(np.int8)
        unknown = is_p2p & (peer == 0) & (send | recv)
        if unknown.any():
            peer[unknown] = _peer_from_blocks(f, work, key, rank, c[unknown], send[unknown])
    # -- one clock for what crosses ranks: origins and ends ----------------------------------
    inst = match_instances(f, layout, np.zeros(f.n, np.int64), named=True)  # Megatron's model-parallel group crosses the stages' hosts
    offsets = host_clock_offsets(f, inst, hosts) if inst is not None else {}
    off_rank = np.array([offsets.get(str(h), 0.0) for h in np.asarray(hosts).astype(str)])
    final = np.maximum(run_end, origin)
    shift = float(base) - off_rank[run_rank]
    components, worktime = _work_time(f, work, rel, dur, rank)
    return Chains(ev_rank, step, f.name[c].astype(np.int32), f.group[c].astype(np.int32), send, recv, peer,
                  blocking, start_ev, dur[c].astype(np.float64), names, list(f.groups), components, worktime,
                  run_rank, run_step, run_first, run_count, origin, origin + shift, final + shift,
                  float(base) - off_rank)


def _time_order(rows: np.ndarray, key: np.ndarray, name: np.ndarray) -> np.ndarray:
    """``rows`` in (rank, start, name) order (``key``: rank and start in one int64). A frame is
    read in (rank, start) order, so only the rows sharing an instant need sorting by name: a
    three-key sort of every row was a tenth of the chains at 10,240 ranks. Rows in any other
    order get the full sort."""
    k = key[rows]
    if rows.size < 2 or (k[1:] < k[:-1]).any():
        return rows[np.lexsort((name[rows], k))]
    tie = k[1:] == k[:-1]
    if not tie.any():
        return rows
    sub = np.flatnonzero(np.r_[tie, False] | np.r_[False, tie])  # every row of an instant shared
    out = rows.copy()
    out[sub] = rows[sub][np.lexsort((name[rows[sub]], k[sub]))]
    return out


def _work_time(f: PhaseFrame, work: np.ndarray, rel: np.ndarray, dur: np.ndarray,
               rank: np.ndarray) -> tuple[list[Component], WorkTime]:
    """The top-level work phases (not inside an earlier one of the same rank: the frame is in
    (rank, start, longer first) order) and the components they are summed in."""
    w_rank = rank[work]
    w_start = rel[work].astype(np.float64)
    w_end = w_start + dur[work]
    seg_new = np.r_[True, w_rank[1:] != w_rank[:-1]] if work.size else np.zeros(0, bool)
    seg = np.cumsum(seg_new)
    lift = (float(w_end.max(initial=0.0)) + 1.0) * seg
    run_max = np.maximum.accumulate(w_end + lift) - lift if work.size else w_end
    prev_max = np.r_[-np.inf, run_max[:-1]] if work.size else w_end
    if work.size:
        prev_max[seg_new] = -np.inf
    # contained in an earlier phase (beyond rounding: a profiler's next op can start a few ns
    # before the last one's rounded end) — partial overlaps stay, clipped below
    tol = np.maximum(_TOLERANCE_NS, _TOLERANCE_SHARE * dur[work])
    contained = (w_start < prev_max - tol) & (w_end <= prev_max + tol)
    t = work[~contained]
    t_rank, t_start = rank[t], rel[t].astype(np.float64)
    t_end = t_start + dur[t]
    same_next = np.r_[t_rank[1:] == t_rank[:-1], False] if t.size else np.zeros(0, bool)
    nxt_start = np.r_[t_start[1:], np.inf] if t.size else t_start
    t_end = np.where(same_next, np.minimum(t_end, nxt_start), t_end)
    t_dur = np.maximum(t_end - t_start, 0.0)
    t_name = f.name[t]
    totals = np.bincount(t_name, weights=t_dur, minlength=len(f.names))
    ranked = [int(i) for i in np.argsort(-totals, kind="stable") if totals[i] > 0]
    kept = ranked[:MAX_COMPONENTS]
    cat_of = np.zeros(len(f.names), np.int64)
    cat_of[t_name] = f.cat[t]
    comps = []
    for i in kept:
        category = str(f.cats[int(cat_of[i])])
        comps.append(Component(f.names[i], category, _block(f.names[i]) if category == "compute" else None))
    if len(ranked) > len(kept):
        comps.append(Component("other", "compute", None))
    comps.append(Component(UNTRACKED, UNTRACKED, None))
    comp_of = np.full(len(f.names), len(comps) - 2 if len(ranked) > len(kept) else -1, np.int64)
    for j, i in enumerate(kept):
        comp_of[i] = j
    t_comp = comp_of[t_name]
    n_named = len(comps) - 1
    cum = np.zeros((n_named, t.size + 1))
    for j in range(n_named):
        cum[j, 1:] = np.cumsum(np.where(t_comp == j, t_dur, 0.0))
    return comps, WorkTime(t_rank, t_start, t_end, t_comp, cum, *_own_shares(f, t, t_rank, t_comp, n_named))


def _own_shares(f: PhaseFrame, t: np.ndarray, t_rank: np.ndarray, t_comp: np.ndarray, n_named: int) -> tuple:
    """Per rank, step and named component, Σ dur and Σ busy over the top-level phases ``t``
    (busy: dur less the waiting the producer measured inside, ``wait_ns`` ≥ 0 — a CPU job's
    run-queue delay; the others count whole: a GPU timeline has no such delay inside its spans)."""
    if f.wait is None or t.size == 0 or not (f.wait[t] > 0).any():
        return None, None, None, None
    new = np.r_[True, t_rank[1:] != t_rank[:-1]]  # t is in (rank, start) order
    ranks, r_idx = t_rank[new], np.cumsum(new) - 1
    steps = sorted_unique(f.step[t])
    s_idx = np.searchsorted(steps, f.step[t])
    named = t_comp >= 0
    d = np.maximum(f.dur[t].astype(np.float64), 0.0)
    measured = (f.wait[t] >= 0) & np.isfinite(f.busy[t])
    b = np.where(measured, np.clip(np.nan_to_num(f.busy[t]), 0.0, d), d)
    key = (r_idx[named] * steps.size + s_idx[named]) * n_named + t_comp[named]
    size = ranks.size * steps.size * n_named
    shape = (ranks.size, steps.size, n_named)
    return (ranks.astype(np.int64), steps.astype(np.int64),
            np.bincount(key, weights=d[named], minlength=size).reshape(shape),
            np.bincount(key, weights=b[named], minlength=size).reshape(shape))


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each key's index in ``sorted_keys``, -1 where absent."""
    keys = np.asarray(keys, np.int64)
    if not sorted_keys.size:
        return np.full(keys.size, -1, np.int64)
    i = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return np.where(sorted_keys[i] == keys, i, -1)


def _peer_from_blocks(f: PhaseFrame, work: np.ndarray, key: np.ndarray, rank: np.ndarray, ev: np.ndarray,
                      is_send: np.ndarray) -> np.ndarray:
    """Peer stage offsets of pipeline events from the blocks next to them: a receive brings what
    the next block needs (activations before a forward: from the previous stage), a send carries
    what the last block made (activations after a forward: to the next stage)."""
    blocks = np.array([_block(n) for n in f.names], object)
    b = work[np.isin(f.name[work], np.flatnonzero(blocks != None))]  # noqa: E711 - element-wise
    out = np.zeros(ev.size, np.int8)
    if b.size == 0:
        return out
    bkey = np.sort(key[b])
    border = np.argsort(key[b], kind="stable")
    b = b[border]
    k = key[ev]
    nxt = np.searchsorted(bkey, k, side="left")
    prv = np.searchsorted(bkey, k, side="left") - 1
    ok_n = (nxt < b.size) & (rank[b[np.minimum(nxt, b.size - 1)]] == rank[ev])
    ok_p = (prv >= 0) & (rank[b[np.maximum(prv, 0)]] == rank[ev])
    fwd_n = blocks[f.name[b[np.minimum(nxt, b.size - 1)]]] == "fwd"
    fwd_p = blocks[f.name[b[np.maximum(prv, 0)]]] == "fwd"
    recv_peer = np.where(ok_n, np.where(fwd_n, -1, 1), 0)
    send_peer = np.where(ok_p, np.where(fwd_p, 1, -1), 0)
    return np.where(is_send, send_peer, recv_peer).astype(np.int8)
