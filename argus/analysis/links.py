"""Per-step link checks from collective transfer times (L2 evidence for link faults).

All members of a collective end together and the last to arrive does not wait, so the
fastest member's duration is the transfer time; over a step, the fastest duration any
member of a group saw is that group's transfer time for the step. Per step and per
collective the groups' transfer times are compared: a minority of groups well above the
rest, with little spread among the others, are crossing a slow link. Pipeline sends and
receives (two phase names for one transfer) are pooled per pipeline group. Unlike the
window-level kernel floors of L3 this sees a link that flaps for a step or two, and it
needs only per-(rank, step, phase) minima: cheap at 10,000 ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.collectives import P2PTransfers
from argus.analysis.frames import PhaseTotals
from argus.analysis.strata import center_within, group_strata
from argus.topology import Layout
from argus.vocab import GroupKind, PhaseCategory
from argus.uniques import sorted_unique

__all__ = ["LinkFinding", "detect_link_shifts"]

MIN_SHIFT = 0.3  # transfer ≥ 30% longer than the healthy groups'
SEPARATION = 4.0  # … and this many robust spreads above them
MAX_SHARE = 0.5  # a minority of the groups
PAIR_SHIFT = 1.0  # with only two groups (no spread to estimate): one ≥ 2× the other …
FEW_GROUPS = 5  # with 3–4 groups: one group ≥ 1 + FEW_SHIFT × every other …
FEW_SHIFT = 2.0
FEW_MIN_EXTRA_NS = 1e6  # … and ≥ 1 ms longer
PP_PAIR_FLOOR = 4.0  # two pipeline lines: one line's fastest transfer of the step this × the other's
_KINDS = (GroupKind.TP, GroupKind.CP, GroupKind.EP, GroupKind.DP, GroupKind.EDP, GroupKind.PP)


@dataclass
class LinkFinding:
    collective: str
    group_kind: GroupKind
    step: int
    ranks: list[int]
    hosts: list[str]
    shift: float  # transfer / healthy transfer − 1
    extra_ns: float  # how much longer each transfer of the shifted groups took
    narrow_only: bool = False  # … a two-group comparison: narrows other findings' hosts, never alone
    per_step: float = 1.0  # transfers of this collective per rank and step in the shifted groups
    pair_only: bool = False  # two pipeline lines, one far slower: no spread to judge by, stands only if persistent

    def to_json(self) -> dict:
        return {"collective": self.collective, "group_kind": self.group_kind, "step": self.step,
                "n_ranks": len(self.ranks), "hosts": self.hosts, "shift": round(self.shift, 3),
                "extra_ms": round(self.extra_ns / 1e6, 3), "per_step": round(self.per_step, 2)}

    @property
    def extra_per_step_ns(self) -> float:
        """What the slow link adds to each of the shifted ranks' steps: every transfer's extra."""
        return self.extra_ns * self.per_step


def detect_link_shifts(t: PhaseTotals, layout: Layout, hosts: np.ndarray,
                       p2p: P2PTransfers | None = None) -> list[LinkFinding]:
    """Link findings of one window. ``p2p``: the pipeline's paired transfer times (receive end
    minus the later post); without them pipeline receives stand in, which also wait for their
    sender's compute — fine when compute is steady, not on a busy host."""
    out: list[LinkFinding] = []
    comm = np.array([c == PhaseCategory.COMM for c in t.cats])[t.cat] & (t.microbatch < 0) & np.isfinite(t.min_ns) & (t.min_ns > 0)
    kind_code = np.array([_KINDS.index(g) if g in _KINDS else -1 for g in t.groups], np.int64)[t.group]
    sel = comm & (kind_code >= 0)
    # Pipeline sends may return once the data is buffered (gloo, NCCL eager): only receives
    # end when the data has arrived, so the pipeline transfer time is read from receives.
    is_recv = np.array(["recv" in n for n in t.names])[t.name]
    pp_code = _KINDS.index(GroupKind.PP)
    sel &= (kind_code != pp_code) | (is_recv & (p2p is None))
    rank, step, kind = t.rank[sel], t.step[sel], kind_code[sel]
    min_ns, total_ns, count = t.min_ns[sel], t.total_ns[sel], t.count[sel].astype(np.float64)
    name = np.where(kind == pp_code, len(t.names), t.name[sel].astype(np.int64))  # pool all pipeline receives
    if p2p is not None and p2p.rank.size:
        ok_ = p2p.min_ns > 0
        rank = np.r_[rank, p2p.rank[ok_]]
        step = np.r_[step, p2p.step[ok_]]
        kind = np.r_[kind, np.full(int(ok_.sum()), pp_code)]
        min_ns = np.r_[min_ns, p2p.min_ns[ok_]]
        total_ns = np.r_[total_ns, p2p.sum_ns[ok_]]
        count = np.r_[count, p2p.count[ok_].astype(np.float64)]
        name = np.r_[name, np.full(int(ok_.sum()), len(t.names))]
    if rank.size == 0:
        return out
    names = [*t.names, "pp-send/recv"]
    group = np.zeros(rank.size, np.int64)
    for k in sorted_unique(kind):
        m = kind == k
        if layout.group_size(_KINDS[k]) > 1:
            group[m] = layout.group_index(_KINDS[k])[rank[m]]
        else:
            group[m] = -1
    ok = group >= 0
    steps = sorted_unique(step)
    W = layout.world_size + 1
    series = (name * len(_KINDS) + kind) * (len(steps) + 1) + np.searchsorted(steps, step)
    key = (series * W + group)[ok]
    uniq, inv = np.unique(key, return_inverse=True)
    floor = np.full(len(uniq), np.inf)
    np.minimum.at(floor, inv, min_ns[ok])
    total = np.full(len(uniq), np.inf)  # the member that waited least: its total is ~transfer time
    np.minimum.at(total, inv, total_ns[ok])
    # Transfers per step that a slow link lengthens on the step's critical path: a collective's
    # members share each instance (per member); a pipeline's transfers follow one another along
    # the schedule — each stage waits for its predecessor's activations and its successor's
    # gradients — so all of a pipeline group's receives count (per group).
    events = np.bincount(inv, weights=count[ok], minlength=len(uniq))
    members = np.bincount(sorted_unique(inv * W + rank[ok]) // W, minlength=len(uniq))  # pooled names: per rank
    per_step = np.where(np.isin(uniq // W // (len(steps) + 1) % len(_KINDS), [_KINDS.index(GroupKind.PP)]),
                        events, events / np.maximum(members, 1))
    logt = np.log(floor)
    grp, ser = uniq % W, uniq // W
    hosts = np.asarray(hosts).astype(str)
    strata = {k: group_strata(layout, _KINDS[k]) for k in sorted_unique(kind)}
    null = _null_spreads(ser, grp, logt, strata, len(steps))
    for s in sorted_unique(ser):
        m = ser == s
        k = int(s) // (len(steps) + 1) % len(_KINDS)
        g = grp[m]
        if m.sum() == 2:  # two groups of one stage do the same work; of two stages, they only narrow
            # (two pipeline lines are not: their transfers follow each stage's compute, and on
            # a shared CPU host one line's receives run twice the other's by scheduling alone —
            # but not their *fastest* transfer ``PP_PAIR_FLOOR``× the other's, step after step:
            # scheduling delays some transfers, never every one of them)
            if _KINDS[k] == GroupKind.PP and _pair(out, int(s), logt[m], g, steps, names, layout, hosts,
                                                   narrow_only=False, shift=np.log(PP_PAIR_FLOOR),
                                                   per_step=per_step[m], pair_only=True):
                continue
            same = bool(strata[k][g[0]] == strata[k][g[1]]) and _KINDS[k] != GroupKind.PP
            _pair(out, int(s), np.log(np.maximum(total[m], 1.0)), g, steps, names, layout, hosts,
                  narrow_only=not same)
            continue
        if m.sum() < 3:
            continue
        spread0 = null.get(int(s) // (len(steps) + 1), 0.0)
        found = _compare(out, int(s), logt[m], per_step[m], g, strata[k][g], steps, names, layout, hosts, spread0)
        if not found:  # stages holding two groups each (two TP shards): each pair on its own
            tot = np.log(np.maximum(total[m], 1.0))
            for st in sorted_unique(strata[k][g]):
                two = np.flatnonzero(strata[k][g] == st)
                if len(two) == 2:
                    found |= _pair(out, int(s), tot[two], g[two], steps, names, layout, hosts, narrow_only=False)
        if not found and layout.pp > 1 and _KINDS[k] != GroupKind.PP:
            # a whole stage's groups shifted alike (a slow host that every group of the stage
            # crosses): only the other stages show it, and they may move other sizes — so this
            # narrows like-with-like findings' hosts down and never stands alone
            _compare(out, int(s), logt[m], per_step[m], g, np.zeros(len(g), np.int64), steps, names, layout, hosts,
                     spread0, narrow_only=True)
    return out


def _null_spreads(ser: np.ndarray, grp: np.ndarray, logt: np.ndarray, strata: dict[int, np.ndarray],
                  n_steps: int) -> dict[int, float]:
    """The job's own step-to-step variation of each collective's transfer floors, pooled over
    the window's steps: per step, each group's log floor against its stratum's median; the
    robust spread of the lower half (a slow link only lengthens transfers, so the healthy
    groups sit there). A step's own three or four groups say little about the spread; real
    jobs' receives and all-reduces wander with CPU scheduling, and this is the null a finding
    is measured against. Keyed by series (collective, kind)."""
    low: dict[int, list[np.ndarray]] = {}
    for s in sorted_unique(ser):
        m = ser == s
        if m.sum() < 3:
            continue
        k = int(s) // (n_steps + 1) % len(_KINDS)
        v, size = center_within(logt[m], strata[k][grp[m]])
        v = v[size >= 3]
        if v.size:
            low.setdefault(int(s) // (n_steps + 1), []).append(v[v <= 0])
    out = {}
    for key, parts in low.items():
        v = np.concatenate(parts)
        if v.size >= 6:  # a spread from fewer values is noise itself
            out[key] = 1.4826 * float(np.median(np.abs(v - np.median(v))))
    return out


def _compare(out: list[LinkFinding], s: int, logt: np.ndarray, per_step: np.ndarray, g: np.ndarray,
             strata: np.ndarray, steps: np.ndarray, names: list[str], layout: Layout, hosts: np.ndarray,
             null_spread: float = 0.0, narrow_only: bool = False) -> bool:
    """One series (collective, kind, step): groups whose transfer floor stands above their
    stratum's by ``SEPARATION`` spreads (the step's own, or the window's pooled ``null_spread``
    when larger); appends a finding and says whether it did."""
    v, size = center_within(logt, strata)  # like with like: each group against its own stage's
    keep = size >= 2
    v, g, raw, n = v[keep], g[keep], logt[keep], per_step[keep]
    if len(v) < 3:
        return False
    center = float(np.quantile(v, 0.25))  # faults only lengthen transfers: the low side is healthy
    low = v[v <= np.median(v)]
    spread = max(1.4826 * float(np.median(np.abs(low - np.median(low)))), null_spread) + 1e-3
    shifted = (v - center >= np.log1p(MIN_SHIFT)) & (v - center >= SEPARATION * spread)
    # how much longer than its own stage's healthy transfer each group took, in ns
    extra = lambda c: np.exp(raw) * -np.expm1(-(v - c))  # noqa: E731
    if len(v) < FEW_GROUPS:
        # too few groups for a trustworthy spread (two values in the low half): only the
        # slowest group alone, standing far above every other one and by more than scheduler
        # noise
        shifted = np.zeros(len(v), bool)
        order = np.sort(v)
        top = v == order[-1]
        if (order[-1] - order[-2] >= max(np.log1p(FEW_SHIFT), SEPARATION * null_spread)
                and extra(order[-2])[top].max() >= FEW_MIN_EXTRA_NS):
            shifted, center = top, float(order[-2])
    if not shifted.any() or shifted.sum() > MAX_SHARE * len(v):
        return False
    name_kind, si = divmod(int(s), len(steps) + 1)
    name_id, k = divmod(name_kind, len(_KINDS))
    table = layout.groups(_KINDS[k])
    ranks = sorted(int(r) for r in table[g[shifted]].ravel())
    out.append(LinkFinding(names[name_id], _KINDS[k], int(steps[si]), ranks,
                           sorted({str(hosts[r]) for r in ranks}), float(np.expm1(np.median(v[shifted] - center))),
                           float(np.median(extra(center)[shifted])), narrow_only,
                           float(np.median(n[shifted]))))
    return True


def _pair(out: list[LinkFinding], s: int, v: np.ndarray, g: np.ndarray, steps: np.ndarray, names: list[str],
          layout: Layout, hosts: np.ndarray, narrow_only: bool, shift: float = float(np.log1p(PAIR_SHIFT)),
          per_step: np.ndarray | None = None, pair_only: bool = False) -> bool:
    """Two groups of one kind, compared on per-step communication totals (collectives of
    varied sizes: the fastest op says little): the slower one, if ≥ 1 + PAIR_SHIFT times the
    other. Two groups of one stage (the data-parallel groups of two TP shards) do the same
    work and the finding stands like any other; groups of different stages (the data-parallel
    groups of a two-stage pipeline) may move different amounts of data, so then it only
    narrows down the hosts of a finding from a comparable set of groups."""
    slow, fast = (0, 1) if v[0] > v[1] else (1, 0)
    if v[slow] - v[fast] < shift or np.exp(v[slow]) - np.exp(v[fast]) < FEW_MIN_EXTRA_NS:
        return False
    name_kind, si = divmod(s, len(steps) + 1)
    name_id, k = divmod(name_kind, len(_KINDS))
    ranks = sorted(int(r) for r in layout.groups(_KINDS[k])[g[slow]].ravel())
    out.append(LinkFinding(names[name_id], _KINDS[k], int(steps[si]), ranks, sorted({str(hosts[r]) for r in ranks}),
                           float(np.expm1(v[slow] - v[fast])), float(np.exp(v[slow]) - np.exp(v[fast])),
                           narrow_only=narrow_only,  # extra: of the step's total, or (floors) of each transfer …
                           per_step=1.0 if per_step is None else float(per_step[slow]),  # … × transfers a step
                           pair_only=pair_only))
    return True
