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
    """Per (gap_base, gap_over) pair: scenario indices, column weights (Z, cols), component
    weights (J, Z); per (tr_base, tr_over): indices and communicator weights (Z, comms)."""
    gap_pairs: dict[tuple[str, str], list[int]] = {}
    tr_pairs: dict[tuple[str, str], list[int]] = {}
    for z, s in enumerate(scen):
        gap_pairs.setdefault((s.gap_base, s.gap_over), []).append(z)
        tr_pairs.setdefault((s.tr_base, s.tr_over), []).append(z)
    gaps = []
    for (b, o), zs in gap_pairs.items():
        cols = np.stack([_weights(scen[z].cols, n_cols) for z in zs])
        comps = np.stack([_weights(scen[z].comps, n_comp) for z in zs], axis=1)
        gaps.append((b, o, np.array(zs), cols, comps))
    trs = []
    for (b, o), zs in tr_pairs.items():
        comms = np.stack([_weights(scen[z].comms, n_comm) for z in zs])
        trs.append((b, o, np.array(zs), comms))
    return gaps, trs


def replay(g: StepGraph, d: Durations, scenarios: list[Scenario]) -> np.ndarray:
    """Step times (K steps, Z scenarios) in ns."""
    Z = len(scenarios)
    K = g.steps.size
    offsets = np.r_[0, np.cumsum([st.columns for st in g.stages])]
    n_comp = d.gaps["rec"][0].shape[-1]
    gap_pairs, tr_pairs = _masks(scenarios, int(offsets[-1]), n_comp, len(g.communicators))
    cursor = [np.broadcast_to(o[:, :, None], (o.shape[0], K, Z)).astype(np.float64) for o in g.origin]
    pending = [np.full((st.columns, K, Z), -np.inf) for st in g.stages]
    arrivals: dict[tuple[int, int], np.ndarray] = {}
    ends: dict[tuple[int, int], np.ndarray] = {}

    def gap(si: int, i: int) -> np.ndarray:
        C = g.stages[si].columns
        out = np.empty((C, K, Z))
        for b, o, zs, cols, comps in gap_pairs:
            base = d.gaps[b][si][i]  # (C, K|1, J)
            val = np.broadcast_to(base.sum(axis=-1, dtype=np.float64)[:, :, None], (C, K, zs.size))
            if b != o:
                over = d.gaps[o][si][i]
                diff = over - base
                w = cols[:, offsets[si]:offsets[si + 1]].T  # (C, zs)
                contrib = diff.astype(np.float64) @ comps  # (C, K', zs)
                val = val + contrib * w[:, None, :]
            out[:, :, zs] = val
        return out

    def transfer(fi: int) -> np.ndarray:
        fam = g.families[fi]
        U = fam.grouping.n_groups
        out = np.empty((U, K, Z))
        for b, o, zs, comms in tr_pairs:
            base = d.transfers[b][fi]  # (U, K|1)
            val = np.broadcast_to(base[:, :, None], (U, K, zs.size))
            if b != o:
                over = d.transfers[o][fi]
                w = comms[:, fam.unit_comm].T  # (U, zs)
                val = val + (over - base)[:, :, None] * w[:, None, :]
            out[:, :, zs] = val
        return out

    for op, a, b in g.ops:
        if op == ARRIVE:
            arrivals[(a, b)] = cursor[a] + gap(a, b)
        elif op == COMPLETE:
            fam = g.families[a]
            stacked = np.concatenate([arrivals.pop(m) for m in fam.members], axis=0)
            unit_end = fam.grouping.max(stacked) + transfer(a)
            row = 0
            for si, i in fam.members:
                C = g.stages[si].columns
                end = unit_end[fam.grouping.inverse[row:row + C]]
                row += C
                st = g.stages[si]
                if st.blocking[i]:
                    ends[(si, i)] = end
                elif not st.send[i]:
                    np.maximum(pending[si], end, out=pending[si])
        else:  # PASS
            end = ends.pop((a, b))
            cursor[a] = np.maximum(end, pending[a])
            pending[a] = np.full_like(pending[a], -np.inf)
    finals = np.stack([np.maximum(c, p).max(axis=0) for c, p in zip(cursor, pending)])  # (S, K, Z)
    return finals.max(axis=0)
