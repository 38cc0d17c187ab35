"""The vectorised replay: every scenario of a what-if at once.

A **scenario** says which durations each node and unit takes: a base set (``rec``, ``own``,
``peer``, ``ideal``: ``durations.py``) and an overlay set applied on some ranks (columns), some
gap components and some communicators. ``fix`` scenarios put the overlay on a group of a
recorded step (what the job gains without that group's excess); ``add`` scenarios put a group's
recorded durations into the ideal step (what that group alone costs).

The replay walks the graph's schedule once; each node's values are arrays of shape
(columns, steps, scenarios):

* ARRIVE — the rank reaches the event at its cursor plus its gap;
* COMPLETE — a family's units end at their last member's arrival plus the unit's transfer;
* PASS — a blocking event moves the rank's cursor to its end and to the end of every event it
  had not waited for since (a DDP bucket, the first of a batched pair); sends are never waited
  for by their rank.

The step time is the last rank's end after the step's reference origin. Cost: O(nodes ×
columns × steps × scenarios) with a few numpy calls per node; arrays are dropped as soon as
their values are consumed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus.analysis.attribution.durations import Durations
from argus.analysis.attribution.graph import ARRIVE, COMPLETE, StepGraph

__all__ = ["Scenario", "replay"]

#: Values of one chunk of gaps: 8 M ≈ 32 MB (float32: the recorded durations' own precision —
#: the replay's memory traffic halved, the bench's S and verdicts unchanged).
_CHUNK_VALUES = 8_000_000


@dataclass(frozen=True)
class Scenario:
    label: str
    gap_base: str = "rec"
    gap_over: str = "rec"
    cols: np.ndarray | None = None  # bool over the graph's ranks (stage rows concatenated); None = all
    comps: np.ndarray | None = None  # bool over components; None = all
    tr_base: str = "rec"
    tr_over: str = "rec"
    comms: np.ndarray | None = None  # bool over the graph's communicators; None = all
    meta: dict = field(default_factory=dict, compare=False)


def _weights(mask: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n, np.float32) if mask is None else mask.astype(np.float32)


def _masks(scen: list[Scenario], n_cols: int, n_comp: int, n_comm: int):
    """Per (gap_base, gap_over, few) group: scenario indices, column weights (Z, cols), component
    weights (J, Z) and, for scenarios that each change a few columns (``_gap_key``), the columns any
    of them changes; per (tr_base, tr_over): indices and communicator weights (Z, comms)."""
    gap_pairs: dict[tuple[str, str, bool], list[int]] = {}
    tr_pairs: dict[tuple[str, str], list[int]] = {}
    for z, s in enumerate(scen):
        gap_pairs.setdefault(_gap_key(s, n_cols), []).append(z)
        tr_pairs.setdefault((s.tr_base, s.tr_over), []).append(z)
    gaps = []
    for (b, o, few), zs in gap_pairs.items():
        cols = np.stack([_weights(scen[z].cols, n_cols) for z in zs])
        comps = np.stack([_weights(scen[z].comps, n_comp) for z in zs], axis=1)
        support = np.flatnonzero(cols.any(axis=0)) if few else None
        if support is not None and support.size > FEW_COLUMNS * n_cols:  # a stage each: together, every column
            support = None
        gaps.append((b, o, _index(zs), cols, comps, support))
    trs = []
    for (b, o), zs in tr_pairs.items():
        comms = np.stack([_weights(scen[z].comms, n_comm) for z in zs])
        trs.append((b, o, _index(zs), comms))
    return gaps, trs


#: Scenarios whose overlays cover at most this share of the replayed columns, each and together (a
#: rank, a host, a few candidates), have their gaps computed on those columns only; the others keep
#: the base values (at 10,240 ranks most scenarios change one to eight of 1,536 columns).
FEW_COLUMNS = 1 / 8


def _gap_key(s: Scenario, n_cols: int) -> tuple[str, str, bool]:
    few = s.gap_base != s.gap_over and s.cols is not None and int(np.count_nonzero(s.cols)) <= FEW_COLUMNS * n_cols
    return s.gap_base, s.gap_over, few


def _index(zs: list[int]) -> slice | np.ndarray:
    """Scenario indices as a slice where they are a run: assigning into the last axis of a
    (nodes, columns, steps, scenarios) block by an index array took 45% of the replay at
    10,240 ranks; a slice is a strided copy."""
    if zs == list(range(zs[0], zs[-1] + 1)):
        return slice(zs[0], zs[-1] + 1)
    return np.array(zs)


def _by_pair(scenarios: list[Scenario], n_cols: int) -> np.ndarray:
    """The scenarios' order with each gap group's (``_gap_key``) in one run (stable)."""
    first: dict[tuple[str, str, bool], int] = {}
    key = [first.setdefault(_gap_key(s, n_cols), len(first)) for s in scenarios]
    return np.argsort(np.array(key, np.int64), kind="stable")


def replay(g: StepGraph, d: Durations, scenarios: list[Scenario]) -> np.ndarray:
    """Step times (K steps, Z scenarios) in ns."""
    offsets = np.r_[0, np.cumsum([st.columns for st in g.stages])]
    order = _by_pair(scenarios, int(offsets[-1]))
    if not np.array_equal(order, np.arange(len(scenarios))):
        out = np.empty((g.steps.size, len(scenarios)))
        out[:, order] = replay(g, d, [scenarios[z] for z in order])
        return out
    Z = len(scenarios)
    K = g.steps.size
    n_comp = d.gaps["rec"][0].shape[-1]
    gap_pairs, tr_pairs = _masks(scenarios, int(offsets[-1]), n_comp, len(g.communicators))
    cursor = [np.broadcast_to(o[:, :, None], (o.shape[0], K, Z)).astype(np.float64) for o in g.origin]
    pending: dict[tuple[int, int], np.ndarray] = {}  # (stage, join node) → ends awaited there
    arrivals: dict[tuple[int, int], np.ndarray] = {}
    ends: dict[tuple[int, int], np.ndarray] = {}

    # gaps are computed for a chunk of a stage's nodes at once (the schedule walks each template
    # in order), bounded in memory: a chunk is (nodes, C, K, Z) float32
    chunk = max(1, min(64, _CHUNK_VALUES // max(1, max(st.columns for st in g.stages) * K * Z)))
    cache: dict[tuple[int, int], np.ndarray] = {}
    buffers: dict[int, np.ndarray] = {}

    def gap_chunk(si: int, c0: int) -> np.ndarray:
        st = g.stages[si]
        c1 = min(c0 + chunk, st.n)
        C = st.columns
        # one block per stage, reused: a fresh 50 MB array a chunk was page faults on first touch
        full = buffers.get(si)
        if full is None:
            full = buffers[si] = np.empty((chunk, C, K, Z), np.float32)  # the durations' own precision
        out = full[: c1 - c0]
        lo, hi = int(offsets[si]), int(offsets[si + 1])
        sums: dict[str, np.ndarray] = {}  # each base set's gaps summed once a chunk (several groups share one)
        for b, o, zs, cols, comps, few in gap_pairs:
            base = d.gaps[b][si][c0:c1]  # (m, C, K|1, J)
            val = sums.get(b)
            if val is None:
                val = sums[b] = base.sum(axis=-1, dtype=np.float64)[..., None]  # (m, C, K|1, 1)
            if b == o:
                out[..., zs] = val
                continue
            if few is not None and isinstance(zs, slice):  # each scenario changes a few columns: the others keep the base
                out[..., zs] = val
                cs = few[(few >= lo) & (few < hi)] - lo
                if cs.size:
                    diff = d.gaps[o][si][c0:c1, cs] - base[:, cs]
                    w = cols[:, lo + cs].T  # (cs, zs)
                    out[:, cs, :, zs] = np.multiply(diff @ comps, w[None, :, None, :]) + val[:, cs]
                continue
            diff = d.gaps[o][si][c0:c1] - base
            w = cols[:, lo:hi].T  # (C, zs)
            dst = out[..., zs]  # a view where zs is a slice (always, after _by_pair)
            np.multiply(diff @ comps, w[None, :, None, :], out=dst)  # (m, C, K', zs)
            dst += val
            if not isinstance(zs, slice):
                out[..., zs] = dst
        return out

    def gap(si: int, i: int) -> np.ndarray:
        key = (si, i - i % chunk)
        block = cache.get(key)
        if block is None:
            for old in [k for k in cache if k[0] == si]:  # each stage walks its template forward
                del cache[old]
            block = cache[key] = gap_chunk(si, key[1])
        return block[i - key[1]]

    def transfer(fi: int) -> np.ndarray:
        fam = g.families[fi]
        U = fam.grouping.n_groups
        out = np.empty((U, K, Z))
        for b, o, zs, comms in tr_pairs:
            base = d.transfers[b][fi]  # (U, K|1)
            n = zs.stop - zs.start if isinstance(zs, slice) else zs.size
            val = np.broadcast_to(base[:, :, None], (U, K, n))
            if b != o:
                over = d.transfers[o][fi]
                w = comms[:, fam.unit_comm].T  # (U, zs)
                val = val + (over - base)[:, :, None] * w[:, None, :]
            out[:, :, zs] = val
        return out

    # a member's late notice of a unit's end is its own untracked time: recorded where the
    # scenario keeps that rank's recorded untracked time, none where it sets it to a typical one
    unt = np.zeros(Z)
    late_w = np.zeros((int(offsets[-1]), Z))
    for b, o, zs, cols, comps, _ in gap_pairs:
        wu = comps[-1]  # (zs,) weight of the untracked component
        base = 1.0 if b == "rec" else 0.0
        over = 1.0 if o == "rec" else 0.0
        late_w[:, zs] = base + (over - base) * (cols * wu[:, None]).T
        unt[zs] = wu

    def latency(fi: int) -> np.ndarray | None:
        fam = g.families[fi]
        if fam.latency is None or not fam.latency.any():
            return None
        rows = np.concatenate([offsets[si] + np.arange(g.stages[si].columns) for si, _ in fam.members])
        return fam.latency[:, :, None] * late_w[rows][:, None, :]

    for op, a, b in g.ops:
        if op == ARRIVE:
            arrivals[(a, b)] = cursor[a] + gap(a, b)
        elif op == COMPLETE:
            fam = g.families[a]
            stacked = np.concatenate([arrivals.pop(m) for m in fam.members], axis=0)
            unit_end = fam.grouping.max(stacked) + transfer(a)
            member_end = unit_end[fam.grouping.inverse]
            late = latency(a)
            if late is not None:
                member_end = member_end + late
            row = 0
            for si, i in fam.members:
                C = g.stages[si].columns
                end = member_end[row:row + C]
                row += C
                st = g.stages[si]
                if st.blocking[i]:
                    ends[(si, i)] = end
                elif not st.send[i]:
                    _await_at(pending, st, si, i, end)
        else:  # PASS
            end = ends.pop((a, b))
            held = pending.pop((a, b), None)
            cursor[a] = end if held is None else np.maximum(end, held)
    finals = np.stack([_last(c, pending, si, g.stages[si].n).max(axis=0) for si, c in enumerate(cursor)])  # (S, K, Z)
    return finals.max(axis=0)


def critical_path(g: StepGraph, d: Durations) -> dict[int, dict[int, float]]:
    """Each rank's share of each recorded step's critical path (step → rank → share): from the
    rank that finished last, walk back through the member that arrived last at each event it
    waited for; the own time before each such arrival is that rank's. Per step, so that a fault
    in some steps of a window is judged on those steps, not diluted by (or lost among) the rest."""
    K = g.steps.size
    offsets = np.r_[0, np.cumsum([st.columns for st in g.stages])]
    cursor = [o.astype(np.float64).copy() for o in g.origin]
    pending: dict[tuple[int, int], np.ndarray] = {}
    gaps = {}
    arrivals: dict[tuple[int, int], np.ndarray] = {}
    last: dict[int, np.ndarray] = {}  # family → (U, K) row of the member that arrived last
    ends: dict[tuple[int, int], np.ndarray] = {}
    for op, a, b in g.ops:
        if op == ARRIVE:
            gp = d.gaps["rec"][a][b].sum(axis=-1, dtype=np.float64)  # (C, K)
            gaps[(a, b)] = gp
            arrivals[(a, b)] = cursor[a] + gp
        elif op == COMPLETE:
            fam = g.families[a]
            stacked = np.concatenate([arrivals.pop(m) for m in fam.members], axis=0)  # (R, K)
            last[a] = fam.grouping.argmax(stacked)  # per unit and step, the row that arrived last
            unit_end = fam.grouping.max(stacked) + d.transfers["rec"][a]
            member_end = unit_end[fam.grouping.inverse]
            if fam.latency is not None:
                member_end = member_end + fam.latency
            row = 0
            for si, i in fam.members:
                C = g.stages[si].columns
                end = member_end[row:row + C]
                row += C
                st = g.stages[si]
                if st.blocking[i]:
                    ends[(si, i)] = end
                elif not st.send[i]:
                    _await_at(pending, st, si, i, end)
        else:
            end = ends.pop((a, b))
            held = pending.pop((a, b), None)
            cursor[a] = end if held is None else np.maximum(end, held)
    # where each stacked family row sits: (stage row, node, column)
    where: dict[int, list[tuple[int, int, int]]] = {}
    for fi, fam in enumerate(g.families):
        where[fi] = [(si, i, c) for si, i in fam.members for c in range(g.stages[si].columns)]
    prev_blocking = []
    for st in g.stages:
        pb, p = [], -1
        for i in range(st.n):
            pb.append(p)
            if st.blocking[i]:
                p = i
        prev_blocking.append(pb + [p])  # index n: the last blocking node
    finals = [_last(c, pending, si, g.stages[si].n) for si, c in enumerate(cursor)]  # per stage (C, K)
    by_step: dict[int, dict[int, float]] = {}
    ranks = g.ranks
    for k in range(K):
        best = max(((si, int(np.argmax(f[:, k])), float(np.max(f[:, k]))) for si, f in enumerate(finals)),
                   key=lambda x: x[2])
        si, c = best[0], best[1]
        node = prev_blocking[si][g.stages[si].n]
        own: dict[int, float] = {}
        hops = 0
        while node >= 0 and hops < 100_000:
            hops += 1
            fi = g.family_of[(si, node)]
            u = g.families[fi].grouping.inverse[_row_of(g, fi, si, node, c)]
            r = int(last[fi][u, k])
            si2, node2, c2 = where[fi][r]
            rank = int(ranks[offsets[si2] + c2])
            own[rank] = own.get(rank, 0.0) + float(gaps[(si2, node2)][c2, k])
            si, c, node = si2, c2, prev_blocking[si2][node2]
        total = sum(own.values())
        by_step[int(g.steps[k])] = {rank: (v / total if total > 0 else 0.0) for rank, v in own.items()}
    return by_step


def _await_at(pending: dict[tuple[int, int], np.ndarray], st, si: int, i: int, end: np.ndarray) -> None:
    """Node ``i``'s end awaited where each of its columns and steps waited for it (``end``: (C, K)
    or (C, K, Z))."""
    for j, cells in st.joins_of(i):
        if cells is None:
            _await(pending, (si, j), end)
        else:
            mask = cells if end.ndim == 2 else cells[:, :, None]
            _await(pending, (si, j), np.where(mask, end, -np.inf))


def _await(pending: dict[tuple[int, int], np.ndarray], key: tuple[int, int], end: np.ndarray) -> None:
    held = pending.get(key)
    pending[key] = end.copy() if held is None else np.maximum(held, end)


def _last(cursor: np.ndarray, pending: dict[tuple[int, int], np.ndarray], si: int, n: int) -> np.ndarray:
    """A stage's end: its cursor and what it awaits at the step's end."""
    held = pending.get((si, n))
    return cursor if held is None else np.maximum(cursor, held)


def _row_of(g: StepGraph, fi: int, si: int, node: int, col: int) -> int:
    row = 0
    for s2, i2 in g.families[fi].members:
        if (s2, i2) == (si, node):
            return row + col
        row += g.stages[s2].columns
    raise ValueError("node not in its family")
