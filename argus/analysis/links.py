"""Per-step link checks from collective transfer times (L2 evidence for link faults).

Each collective instance's transfer time is its shortest member duration (everyone ends
together; the last to arrive does not wait). Per step and per collective, the groups'
transfer times are compared: a minority of groups well above the rest — every one of them,
with little spread among the others — are crossing a slow link. Unlike the window-level
kernel floors of L3 this sees a link that flaps for a step or two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.collectives import Instances
from argus.analysis.frames import PhaseFrame
from argus.topology import Layout

__all__ = ["LinkFinding", "detect_link_shifts"]

MIN_SHIFT = 0.3  # transfer ≥ 30% longer than the healthy groups'
SEPARATION = 4.0  # … and this many robust spreads above them
MAX_SHARE = 0.5  # a minority of the groups


@dataclass
class LinkFinding:
    collective: str
    group_kind: str
    step: int
    ranks: list[int]
    hosts: list[str]
    shift: float  # transfer / healthy transfer − 1
    extra_ns: float  # how much longer each transfer of the shifted groups took

    def to_json(self) -> dict:
        return {"collective": self.collective, "group_kind": self.group_kind, "step": self.step,
                "n_ranks": len(self.ranks), "hosts": self.hosts, "shift": round(self.shift, 3),
                "extra_ms": round(self.extra_ns / 1e6, 3)}


_PP = 6  # kind code of pipeline p2p in ``Instances.kind_name``


def _p2p_transfer(f: PhaseFrame, layout: Layout, step_i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pipeline send/receive, which pair different phase names: per (step, pp group) the
    fastest send or receive of the step — in every step some transfer finds its peer ready."""
    pp = f.groups.index("pp") if "pp" in f.groups else -1
    rows = np.flatnonzero(f.is_comm & (f.group == pp) & (f.dur > 0))
    if rows.size == 0 or layout.pp < 2:
        return np.empty(0, np.int64), np.empty(0)
    g = layout.group_index("pp")[f.rank[rows]]
    key = step_i[rows].astype(np.int64) * (layout.world_size + 1) + g
    uniq, inv = np.unique(key, return_inverse=True)
    best = np.full(len(uniq), np.inf)
    np.minimum.at(best, inv, f.dur[rows].astype(np.float64))
    return uniq, np.log(best)


def detect_link_shifts(f: PhaseFrame, inst: Instances | None, layout: Layout, hosts: np.ndarray,
                       steps: np.ndarray, step_i: np.ndarray) -> list[LinkFinding]:
    out: list[LinkFinding] = []
    W = layout.world_size + 1
    keys, logs = [], []
    if inst is not None:
        ok = np.isfinite(inst.transfer_ns) & (inst.size > 1) & (inst.transfer_ns > 0)
        # Mean log transfer per (name, kind, step, group).
        key = ((inst.name.astype(np.int64) * 8 + inst.kinds) * (len(steps) + 1) + inst.step_i) * W + inst.group
        uniq, inv = np.unique(key[ok], return_inverse=True)
        keys.append(uniq)
        logs.append(np.bincount(inv, weights=np.log(inst.transfer_ns[ok]), minlength=len(uniq)) / np.bincount(inv))
    pk, pl = _p2p_transfer(f, layout, step_i)
    if pk.size:
        pp_name = len(f.names)  # a pseudo name for "pipeline p2p"
        keys.append(((pp_name * 8 + _PP) * (len(steps) + 1) + pk // W) * W + pk % W)
        logs.append(pl)
    if not keys:
        return out
    uniq, logt = np.concatenate(keys), np.concatenate(logs)
    group = uniq % W
    series = uniq // W  # (name, kind, step)
    hosts = np.asarray(hosts).astype(str)
    names = [*f.names, "pp-send/recv"]
    for s in np.unique(series):
        m = series == s
        if m.sum() < 3:
            continue
        v, g = logt[m], group[m]
        center = float(np.quantile(v, 0.25))
        low = v[v <= np.median(v)]
        spread = 1.4826 * float(np.median(np.abs(low - np.median(low)))) + 1e-3
        shifted = (v - center >= np.log1p(MIN_SHIFT)) & (v - center >= SEPARATION * spread)
        if not shifted.any() or shifted.sum() > MAX_SHARE * m.sum():
            continue
        name_id, rest = divmod(int(s), 8 * (len(steps) + 1))
        kind_code, si = divmod(rest, len(steps) + 1)
        kind = Instances.kind_name(kind_code)
        table = layout.groups(kind)
        ranks = sorted(int(r) for r in table[g[shifted]].ravel())
        healthy = float(np.exp(center))
        out.append(LinkFinding(names[name_id], kind, int(steps[si]), ranks, sorted({str(hosts[r]) for r in ranks}),
                               float(np.expm1(np.median(v[shifted] - center))),
                               float(np.exp(np.median(v[shifted])) - healthy)))
    return out
