"""What a diagnosis saw when it had little to compare: observations, never claims.

A store of one profiled step, or of one rank, cannot show that ranks *match*: there is no
spread to judge against. What it can show is measured on each rank's own timeline:

* **host time** — a rank's own host phases (data loading, GC, compilation, synchronisation)
  covering ≥ ``HOST_SHARE`` of its steps: the device waits for the host whatever its peers do;
* **device idle** — where raw kernels were kept (Kineto imports), the share of each step in
  which no kernel of the rank ran;
* **waiting** (thin evidence only; otherwise L2 judges it) — each rank's time in collectives per step (device time of its communication
  kernels where recorded, else its collective phases): who waits, and who is waited for;
* **arrival skew** (thin evidence only) — when the members of the same collective started it: the late ones are
  the ones the others wait for.

:class:`Depth` says how much the diagnosis could compare; with fewer than
``MIN_STEADY_STEPS`` steady steps or fewer than two comparable ranks it is ``thin`` and no
one may read "no incident" as "every rank matches its peers".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.analysis.frames import encode
from argus.analysis.rollup import PhaseRollup, load_rollup
from argus.analysis.host_phases import HOST_PHASE_CAUSES
from argus.compress.names import categorize_kernel
from argus.store import Attempt
from argus.vocab import KernelKind, PhaseCategory
from argus.uniques import sorted_unique

__all__ = ["Depth", "Observation", "ObservationKind", "observe", "MIN_STEADY_STEPS", "HOST_SHARE"]

#: Fewer steady steps than this, and "no incident" says nothing about whether the ranks match:
#: L2 needs a finding in two steps of a window to call it persistent, and a window of three.
MIN_STEADY_STEPS = 3
#: A rank's own host phases (or its device idle) covering this share of its steps are named.
HOST_SHARE = 0.2
#: Kernels above this many rows are not read for device idle and arrival (raw kernels are a
#: Kineto import's or a debugging run's; a production store keeps summaries only).
MAX_KERNEL_ROWS = 5_000_000
#: Ranks listed by name in a sentence.
SHOWN = 4


class ObservationKind(StrEnum):
    HOST_TIME = "host_time"
    DEVICE_IDLE = "device_idle"
    WAITING = "waiting"
    ARRIVAL_SKEW = "arrival_skew"
    #: the ranks' step-to-step variance measured by the attribution: legitimate (uneven inputs) or
    #: a noisy host, not told apart or not costly enough to be an incident
    VARIANCE = "variance"


@dataclass(frozen=True, slots=True)
class Depth:
    """How much the diagnosis could compare."""

    steps: int  # steps recorded
    steady_steps: int  # … of which neither warm-up, checkpoint nor unfinished
    ranks: int  # ranks that recorded a step
    comparable: int  # … of which have a peer that recorded too

    @property
    def thin(self) -> bool:
        return self.steady_steps < MIN_STEADY_STEPS or self.comparable < 2

    def sentence(self) -> str:
        """Why "no incident" is not "everything matches", or "" when the evidence suffices."""
        if not self.thin:
            return ""
        why = []
        if self.steady_steps < MIN_STEADY_STEPS:
            why.append(f"{self.steady_steps} steady step{'s' * (self.steady_steps != 1)} "
                       f"(of {self.steps}; at least {MIN_STEADY_STEPS} are needed to judge a spread)")
        if self.comparable < 2:
            why.append(f"{self.comparable} rank{'s' * (self.comparable != 1)} with a peer to compare with")
        return "too little to tell whether the ranks match: " + " and ".join(why)

    def to_json(self) -> dict:
        return {"steps": self.steps, "steady_steps": self.steady_steps, "ranks": self.ranks,
                "comparable": self.comparable, "thin": self.thin}


@dataclass(frozen=True)
class Observation:
    kind: ObservationKind
    ranks: tuple[int, ...]  # the ranks the sentence is about (the most affected first)
    share: float  # of the step (host time, idle, waiting) or the skew in seconds (arrival)
    summary: str
    phase: str = ""
    cause: str = ""
    per_rank: dict[int, float] = field(default_factory=dict)  # the value per rank, a few shown

    def to_json(self) -> dict:
        return {"kind": self.kind, "ranks": list(self.ranks[:64]), "share": round(self.share, 4),
                "phase": self.phase, "cause": self.cause, "summary": self.summary,
                "per_rank": {str(r): round(v, 4) for r, v in list(self.per_rank.items())[:16]}}


def _rank_list(ranks) -> str:
    ranks = list(ranks)
    return ", ".join(map(str, ranks[:SHOWN])) + (f" … ({len(ranks)})" if len(ranks) > SHOWN else "")


def _cause(name: str) -> str:
    low = name.lower()
    return next((cause for word, cause in HOST_PHASE_CAUSES if word in low), "")


def observe(attempt: Attempt, steady: list[int], comparable: int,
            rollup: PhaseRollup | None = None) -> tuple[Depth, list[Observation]]:
    """Depth and observations over the ``steady`` steps (all finished steps if none are steady);
    ``rollup``: the run's phase aggregates, when the diagnosis has them (else they are read)."""
    st = attempt.read("steps", columns=["rank", "step", "start_ns", "end_ns"])
    rank, step = st.column("rank").to_numpy(), st.column("step").to_numpy()
    start, end = st.column("start_ns").to_numpy(), st.column("end_ns").to_numpy()
    world = attempt.layout.world_size
    ok = (rank >= 0) & (rank < world) & (end >= start)
    depth = Depth(len(sorted_unique(step)), len(steady), len(sorted_unique(rank[(rank >= 0) & (rank < world)])), comparable)
    use = np.isin(step, steady) if steady else ok
    use &= ok
    if not use.any():
        return depth, []
    rank, step, start, end = rank[use], step[use], start[use], end[use]
    dur = (end - start).astype(np.float64)
    out: list[Observation] = []
    rollup = rollup if rollup is not None else load_rollup(attempt)
    out += _host_time(rollup, rank, step, dur)
    kernels = _kernels(attempt, set(step.tolist()))
    if kernels is not None:
        out += _device_idle(kernels, rank, step, start, end)
    if not depth.thin:  # enough to compare: L2 judges waiting and arrival against the peers
        return depth, out
    out += _waiting(rollup, kernels, rank, step, dur)
    layout = attempt.layout
    if kernels is not None and layout.dp == layout.world_size and kernels["comm"].any():
        # one communicator (pure data parallel): the n-th communication kernel of a step is the
        # same collective on every rank, timed on the device
        out += _arrival(_starts_of_kernels(kernels), dur)
    else:
        out += _arrival(_starts_of_phases(attempt, sorted(set(step.tolist()))), dur)
    return depth, out


def _per_rank_share(values: dict[tuple[int, int], float], rank: np.ndarray, step: np.ndarray,
                    dur: np.ndarray) -> dict[int, float]:
    """Per rank: the median over its steps of value / step duration."""
    ok = dur > 0
    v = np.array([values.get((r, s), 0.0) for r, s in zip(rank[ok].tolist(), step[ok].tolist())], np.float64)
    return _grouped_median(rank[ok].astype(np.int64), v / dur[ok]) if v.size else {}


def _host_time(rollup: PhaseRollup, rank: np.ndarray, step: np.ndarray, dur: np.ndarray) -> list[Observation]:
    by_name: dict[str, dict[tuple[int, int], float]] = {}
    r_, s_, n_, ns = rollup.outside_microbatches(PhaseCategory.HOST)
    for r, st, n, v in zip(r_.tolist(), s_.tolist(), n_.tolist(), ns.tolist()):
        by_name.setdefault(rollup.names[n], {})[(r, st)] = v
    out = []
    for name, values in sorted(by_name.items()):
        share = _per_rank_share(values, rank, step, dur)
        hit = sorted((r for r, v in share.items() if v >= HOST_SHARE), key=lambda r: -share[r])
        if not hit:
            continue
        lo, hi = min(share[r] for r in hit), max(share[r] for r in hit)
        pct = f"{100 * hi:.0f}%" if hi - lo < 0.02 else f"{100 * lo:.0f}–{100 * hi:.0f}%"
        cause = _cause(name)
        what = f" ({cause.replace('_', ' ')})" if cause else ""
        out.append(Observation(
            ObservationKind.HOST_TIME, tuple(hit), hi,
            f"rank{'s' * (len(hit) > 1)} {_rank_list(hit)} spend{'s' * (len(hit) == 1)} {pct} of each step in "
            f"{name}{what}: the device waits for the host there, whatever its peers do", name, cause,
            {r: share[r] for r in hit}))
    return out


def _kernels(attempt: Attempt, steps: set[int]) -> dict[str, np.ndarray] | None:
    """The raw device kernels of ``steps`` (not CPU ops, nor copies), or None when not kept."""
    stats = attempt.stats().get("kernels")
    if stats is None or stats.rows == 0 or stats.rows > MAX_KERNEL_ROWS:
        return None
    t = attempt.read("kernels", columns=["rank", "step", "kind", "name", "start_ns", "dur_ns"])
    t = t.filter(pc.and_(pc.equal(t.column("kind"), KernelKind.KERNEL), pc.is_in(t.column("step"), pa.array(sorted(steps)))))
    if t.num_rows == 0:
        return None
    inv, uniq = encode(t.column("name"))  # names as codes: a million strings are never sorted
    cats = np.array([categorize_kernel(str(n))[0] for n in uniq])
    return {"rank": t.column("rank").to_numpy().astype(np.int64), "step": t.column("step").to_numpy(),
            "start": t.column("start_ns").to_numpy().astype(np.float64),
            "dur": np.maximum(t.column("dur_ns").to_numpy(), 0).astype(np.float64),
            "comm": cats[inv] == PhaseCategory.COMM, "name": inv.astype(np.int64), "names": np.array(uniq, dtype=object)}


def _covered(k: dict[str, np.ndarray], mask: np.ndarray) -> dict[tuple[int, int], float]:
    """(rank, step) → ns covered by at least one of the ``mask`` kernels (overlapping streams
    counted once): intervals sorted by start, a running maximum of their ends, gaps summed."""
    order = np.flatnonzero(mask)
    order = order[np.lexsort((k["start"][order], k["step"][order], k["rank"][order]))]
    r, s, a, b = k["rank"][order], k["step"][order], k["start"][order], (k["start"] + k["dur"])[order]
    if r.size == 0:
        return {}
    new = np.r_[True, (r[1:] != r[:-1]) | (s[1:] != s[:-1])]
    seg = np.cumsum(new) - 1
    lift = (np.abs(b).max() + 1.0) * seg  # running max of ends within each (rank, step), all at once
    hi = np.maximum.accumulate(b + lift) - lift
    gap = np.where(new[1:], 0.0, np.maximum(a[1:] - hi[:-1], 0.0))
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, r.size - 1]
    gaps = np.bincount(seg[1:], weights=gap, minlength=len(first))
    span = hi[last] - a[first] - gaps
    return {(int(r[i]), int(s[i])): float(v) for i, v in zip(first, span)}


def _device_idle(k: dict[str, np.ndarray], rank: np.ndarray, step: np.ndarray, start: np.ndarray,
                 end: np.ndarray) -> list[Observation]:
    """Share of each step no kernel of the rank covered."""
    busy = _covered(k, np.ones(len(k["rank"]), bool))
    have = set(busy)
    sel = np.array([(int(x), int(y)) in have for x, y in zip(rank, step)], bool)
    if not sel.any():
        return []
    idle = {key: 0.0 for key in busy}
    for x, y, d in zip(rank[sel].tolist(), step[sel].tolist(), (end - start)[sel].tolist()):
        idle[(x, y)] = max(d - busy[(x, y)], 0.0)
    share = _per_rank_share(idle, rank[sel], step[sel], (end - start)[sel].astype(np.float64))
    hit = sorted((x for x, v in share.items() if v >= HOST_SHARE), key=lambda x: -share[x])
    if not hit:
        return []
    return [Observation(ObservationKind.DEVICE_IDLE, tuple(hit), share[hit[0]],
                        f"the device of rank{'s' * (len(hit) > 1)} {_rank_list(hit)} is idle "
                        f"{100 * share[hit[-1]]:.0f}–{100 * share[hit[0]]:.0f}% of each step (no kernel running): "
                        "the host does not keep it fed", per_rank={x: share[x] for x in hit})]


def _waiting(rollup: PhaseRollup, k: dict[str, np.ndarray] | None, rank: np.ndarray, step: np.ndarray,
             dur: np.ndarray) -> list[Observation]:
    """Each rank's collective time per step; the spread says who waits and who is waited for."""
    values: dict[tuple[int, int], float] = {}
    if k is not None and k["comm"].any():
        values = _covered(k, k["comm"])
        source = "communication kernels"
    else:
        r_, s_, _, ns = rollup.outside_microbatches(PhaseCategory.COMM)
        for r, st, v in zip(r_.tolist(), s_.tolist(), ns.tolist()):
            values[(r, st)] = values.get((r, st), 0.0) + v
        source = "collectives"
    if not values:
        return []
    share = _per_rank_share(values, rank, step, dur)
    if len(share) < 2:
        return []
    order = sorted(share, key=lambda r: -share[r])
    top, bottom = share[order[0]], share[order[-1]]
    if top - bottom < 0.1 or top < 0.1:  # every rank waits alike: nothing to say about who
        return []
    waits = [r for r in order if share[r] - bottom >= 0.5 * (top - bottom)]
    waited = [r for r in reversed(order) if top - share[r] >= 0.5 * (top - bottom)]
    return [Observation(
        ObservationKind.WAITING, tuple(waits), top,
        f"time in {source} per step ranges {100 * bottom:.0f}–{100 * top:.0f}% over the ranks: "
        f"rank{'s' * (len(waits) > 1)} {_rank_list(waits)} wait{'s' * (len(waits) == 1)} the most, "
        f"rank{'s' * (len(waited) > 1)} {_rank_list(waited)} the least (waited for, or on a faster path)",
        per_rank={r: share[r] for r in order})]


def _grouped_median(group: np.ndarray, value: np.ndarray) -> dict[int, float]:
    """Median of ``value`` per distinct ``group``, all groups in one sort."""
    order = np.lexsort((value, group))
    g, v = group[order], value[order]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    n = np.diff(np.r_[first, g.size])
    med = 0.5 * (v[first + (n - 1) // 2] + v[first + n // 2])
    return {int(x): float(m) for x, m in zip(g[first], med)}


def _starts_of_kernels(k: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rank, instance key, start) of every communication kernel: the n-th launch of a kernel
    in a step, matched across the ranks that launched as many."""
    c = k["comm"]
    r, s, name, a = k["rank"][c], k["step"][c], k["name"][c], k["start"][c]
    if r.size == 0:
        return None
    order = np.lexsort((a, name, s, r))
    r, s, name, a = r[order], s[order], name[order], a[order]
    grp = np.r_[True, (r[1:] != r[:-1]) | (s[1:] != s[:-1]) | (name[1:] != name[:-1])]
    occ = np.arange(len(r)) - np.maximum.accumulate(np.where(grp, np.arange(len(r)), 0))
    key = (s.astype(np.int64) * (int(name.max()) + 1) + name) * (int(occ.max()) + 1) + occ
    # an instance needs every rank (a kernel some ranks launch more often is not one collective)
    present = len(sorted_unique(r))
    uniq, inv = np.unique(key, return_inverse=True)
    whole = (np.bincount(inv, minlength=len(uniq)) == present)[inv]
    return r[whole], inv[whole], a[whole]


#: Phases read for the arrival of collectives on their groups (beyond: no arrival observation).
MAX_PHASE_ROWS = 4_000_000


def _starts_of_phases(attempt: Attempt, steps: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rank, instance, start) of every collective phase matched to its instance on its group
    (``collectives.match_instances``), starts on one clock (hosts aligned by common ends)."""
    from argus.analysis.collectives import aligned_starts, match_instances
    from argus.analysis.frames import load_phases

    stats = attempt.stats().get("phases")
    if not steps or stats is None or stats.rows == 0 or stats.rows > MAX_PHASE_ROWS:
        return None
    f = load_phases(attempt, steps[0], steps[-1])
    if f.n == 0:
        return None
    f = f.take(np.flatnonzero(np.isin(f.step, steps)))
    inst = match_instances(f, attempt.layout, np.searchsorted(sorted_unique(f.step), f.step))
    if inst is None:
        return None
    start = aligned_starts(f, attempt.layout, attempt.topology().hosts)
    multi = inst.size[inst.inv] > 1
    return f.rank[inst.rows][multi].astype(np.int64), inst.inv[multi], start[inst.rows][multi]


def _arrival(starts: tuple[np.ndarray, np.ndarray, np.ndarray] | None, dur: np.ndarray) -> list[Observation]:
    """Members of one collective start it at different times: the latest are waited for."""
    step_ns = float(np.median(dur)) if dur.size else 0.0
    if starts is None or step_ns <= 0 or len(sorted_unique(starts[0])) < 2:
        return []
    r, inst, a = starts
    uniq, inv = np.unique(inst, return_inverse=True)
    first = np.full(len(uniq), np.inf)
    np.minimum.at(first, inv, a)
    last = np.full(len(uniq), -np.inf)
    np.maximum.at(last, inv, a)
    skew = last - first
    real = skew >= 0.05 * step_ns  # members further apart than scheduling noise
    m = real[inv]
    if not m.any():
        return []
    med = _grouped_median(r[m], a[m] - first[inv][m])
    typical, n = float(np.median(skew[real])), int(real.sum())
    lo, hi = min(med.values()), max(med.values())
    if hi - lo <= 0:
        return []
    latest = sorted((x for x, v in med.items() if v - lo >= 0.5 * (hi - lo)), key=lambda x: -med[x])
    earliest = sorted((x for x, v in med.items() if v - lo <= 0.1 * (hi - lo)), key=lambda x: med[x])
    return [Observation(
        ObservationKind.ARRIVAL_SKEW, tuple(latest), typical / 1e9,
        f"the members of {n} collective{'s' * (n > 1)} started {typical / 1e6:.1f} ms apart (median, "
        f"{100 * typical / step_ns:.0f}% of a step; up to {float(skew[real].max()) / 1e6:.1f} ms): rank{'s' * (len(latest) > 1)} {_rank_list(latest)} "
        f"arrive{'s' * (len(latest) == 1)} last, {(hi - lo) / 1e6:.1f} ms after rank{'s' * (len(earliest) > 1)} "
        f"{_rank_list(earliest)}, which wait{'s' * (len(earliest) == 1)} for them",
        per_rank={x: med[x] / 1e9 for x in sorted(med, key=lambda x: -med[x])})]
