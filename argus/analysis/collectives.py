"""Collective instances: the same collective call matched across the members of its group.

A member's phase belongs to instance (name, step, microbatch, group kind, group, occurrence)
where *occurrence* counts that collective within the rank's (step, microbatch) in start
order. From instances follow two facts the detectors need, both on each rank's own clock:

* the **transfer time** of an instance is its shortest member duration — all members end
  together and the last to arrive waits for no one;
* a member's **gap** is the time since its own previous collective ended (its work and host
  time); the member whose gap is longest is the one the group waited for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.frames import PhaseFrame
from argus.topology import Layout

__all__ = ["Instances", "match_instances", "host_clock_offsets"]

_KINDS = ("tp", "cp", "ep", "dp", "edp", "world", "pp")


@dataclass
class Instances:
    rows: np.ndarray  # phase-frame row of each member
    inv: np.ndarray  # instance index of each member
    size: np.ndarray  # members per instance
    name: np.ndarray  # per instance: phase-name id
    kind: str | None
    kinds: np.ndarray  # per instance: group kind (index into _KINDS)
    group: np.ndarray  # per instance: group index within its kind
    step_i: np.ndarray  # per instance: step index
    transfer_ns: np.ndarray  # per instance: shortest member duration
    gap_ns: np.ndarray  # per member: time since its previous collective ended (nan if none)

    @staticmethod
    def kind_name(code: int) -> str:
        return _KINDS[code]


def _prev_comm_end(f: PhaseFrame) -> np.ndarray:
    """For each comm row: the end of the same rank's previous finished comm phase (nan if none)."""
    out = np.full(f.n, np.nan)
    c = np.flatnonzero(f.is_comm & (f.dur >= 0))
    if c.size == 0:
        return out
    end = (f.start[c] + f.dur[c]).astype(np.float64)
    rank = f.rank[c]
    new_rank = np.ones(c.size, bool)
    new_rank[1:] = rank[1:] != rank[:-1]
    # running max of ends within each rank's run (rows are in (rank, start) order)
    seg = np.cumsum(new_rank)
    lift = (np.abs(end).max() * 2 + 1) * seg
    running = np.maximum.accumulate(end + lift) - lift
    prev = np.concatenate([[np.nan], running[:-1]])
    out[c] = np.where(new_rank, np.nan, prev)
    return out


def match_instances(f: PhaseFrame, layout: Layout, step_i: np.ndarray, with_pp: bool = False) -> Instances | None:
    """Group finished collective phases into instances (pipeline p2p only if ``with_pp``)."""
    kinds_ok = _KINDS if with_pp else _KINDS[:-1]
    code = np.array([kinds_ok.index(g) if g in kinds_ok else -1 for g in f.groups], np.int64)
    if code.size == 0:
        return None
    sel = f.is_comm & (f.dur >= 0) & (code[f.group] >= 0)
    rows = np.flatnonzero(sel)
    if rows.size == 0:
        return None
    rank, name = f.rank[rows], f.name[rows].astype(np.int64)
    mb = f.mb[rows].astype(np.int64) + 1
    si = step_i[rows].astype(np.int64)
    kind = code[f.group[rows]]
    gidx = np.zeros(rows.size, np.int64)
    for k in np.unique(kind):
        m = kind == k
        gidx[m] = layout.group_index(_KINDS[k])[rank[m]]
    n_mb, n_names, S = int(mb.max()) + 1, len(f.names), int(si.max()) + 1
    occ_key = ((rank * S + si) * n_mb + mb) * n_names + name
    order = np.argsort(occ_key, kind="stable")  # rows are already in (rank, start) order
    run_start = np.ones(rows.size, bool)
    run_start[1:] = occ_key[order][1:] != occ_key[order][:-1]
    pos = np.arange(rows.size) - np.maximum.accumulate(np.where(run_start, np.arange(rows.size), 0))
    seq = np.empty(rows.size, np.int64)
    seq[order] = pos
    key = ((((name * S + si) * n_mb + mb) * len(_KINDS) + kind) * (layout.world_size + 1) + gidx) \
        * (int(seq.max()) + 1) + seq
    uniq, inv = np.unique(key, return_inverse=True)
    size = np.bincount(inv, minlength=len(uniq))
    first = np.full(len(uniq), rows.size, np.int64)
    np.minimum.at(first, inv, np.arange(rows.size))
    transfer = np.full(len(uniq), np.inf)
    np.minimum.at(transfer, inv, f.dur[rows].astype(np.float64))
    gap = f.start[rows] - _prev_comm_end(f)[rows]
    gap = np.where(np.isfinite(gap) & (gap >= 0), gap, np.nan)
    return Instances(rows, inv, size, name[first], None, kind[first], gidx[first], si[first], transfer, gap)


def host_clock_offsets(f: PhaseFrame, inst: Instances, hosts: np.ndarray) -> dict[str, float]:
    """Per-host clock offsets (ns, median zero): members of an instance end at the same true
    time, so each host's median residual against its instances' mean end is its offset."""
    rows = inst.rows
    host_ids, host_of_rank = np.unique(np.asarray(hosts).astype(str), return_inverse=True)
    if len(host_ids) < 2:
        return {str(h): 0.0 for h in host_ids}
    end = (f.start[rows] + f.dur[rows]).astype(np.float64)
    multi = inst.size[inst.inv] > 1
    mean_end = np.bincount(inst.inv, weights=end, minlength=len(inst.size)) / np.maximum(inst.size, 1)
    h = host_of_rank[f.rank[rows]][multi]
    resid = (end - mean_end[inst.inv])[multi]
    # median residual per host, for all hosts at once: sort by (host, residual), take the middles
    order = np.lexsort((resid, h))
    h, resid = h[order], resid[order]
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    counts = np.diff(np.r_[starts, h.size])
    med = 0.5 * (resid[starts + (counts - 1) // 2] + resid[starts + counts // 2])
    offset = np.zeros(len(host_ids))
    offset[h[starts]] = med
    offset -= np.median(offset)
    return {str(host_ids[i]): float(offset[i]) for i in range(len(host_ids))}
