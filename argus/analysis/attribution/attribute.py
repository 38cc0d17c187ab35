"""What-if attribution of one window: the step with and without each group's excess, every
scenario in one replay.

Three slowdowns are measured, each against its own baseline (``T`` = mean replayed step):

* **durations** — ``S = T(recorded, untracked time removed) / T(ideal)``: what the ranks' work and
  transfers cost beyond the ideal step (the straggler slowdown of the OSDI 2025 what-if
  analysis). It splits into a **worker** part, ``T(recorded) / T(peer)`` — ranks slower than
  their peers, steps slower than the rank's own mean — and a **stage** part, ``T(peer) /
  T(ideal)`` — a pipeline whose stages hold unequal work.
* **host** — ``T(recorded) / T(untracked time at the least any peer needed)``: time a rank
  spends between its recorded phases (a checkpoint save, a busy thread, work after the
  optimizer) that its peers do not.

Each part is attributed by **fixing** one group at a time — its values set to the typical ones,
everything else as recorded — and by **adding** it — its recorded values put into the ideal
step. A group's share is the part of the slowdown its fix recovers. Groups: each candidate rank
(the ranks with the most excess, and any the rules named), each host and replica holding one,
prefixes of the candidates (several culprits), each stage, each gap component (forward,
backward, a host phase, untracked time), each communicator's transfers, and every rank's
step-to-step fluctuation at once."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from argus.analysis.attribution.chains import Chains
from argus.analysis.attribution.durations import durations
from argus.analysis.attribution.graph import StepGraph
from argus.analysis.attribution.replay import Scenario, critical_path, replay
from argus.topology import Layout
from argus.vocab import GroupKind as GK
from argus.uniques import sorted_unique

__all__ = ["GroupKind", "Share", "WindowAttribution", "attribute_graph", "MAX_CANDIDATES"]

#: Candidate ranks per part (the most excess first); small jobs evaluate every rank.
MAX_CANDIDATES = 16
#: Jobs up to this many replayed ranks have every rank evaluated alone.
ALL_RANKS = 32


class GroupKind(StrEnum):
    """What a group of a what-if is."""

    RANK = "rank"
    RANKS = "ranks"  # several ranks together (the top candidates, or a rule's culprits)
    HOST = "host"
    REPLICA = "replica"  # one data-parallel replica: every rank with the same (cp, ep, dp)
    STAGE = "stage"
    COMPONENT = "component"  # one kind of work in every rank's gaps (forward, a host phase, untracked)
    COMMUNICATOR = "communicator"  # one communicator's transfers
    TRANSFERS = "transfers"  # every transfer
    FLUCTUATION = "fluctuation"  # every rank at its own mean over the steps


class Part(StrEnum):
    WORKER = "worker"  # durations against the peers (baseline: recorded without untracked time)
    STAGE = "stage"  # stage balance (baseline: the peers' durations)
    HOST = "host"  # untracked time against the peers (baseline: recorded)


@dataclass
class Share:
    """One group's what-if: the mean step with it fixed (and added), and the share of its
    part's slowdown that fixing it recovers."""

    part: Part
    kind: GroupKind
    label: str
    ranks: list[int]
    fix_s: float
    share: float  # (T_base − T_fix) / (T_base − T_ideal)
    add_s: float | None = None
    add_share: float | None = None  # (T_add − T_ideal) / (T_base − T_ideal)
    per_step_gain_s: list[float] = field(default_factory=list)  # T_base − T_fix per replayed step

    @property
    def gain_pct(self) -> float:
        """How much faster the job runs with this group fixed (% of the fixed step)."""
        gain = float(np.mean(self.per_step_gain_s)) if self.per_step_gain_s else 0.0
        return 100.0 * gain / self.fix_s if self.fix_s > 0 else 0.0

    def to_json(self) -> dict:
        out = {"part": self.part, "group": self.kind, "label": self.label, "share": round(self.share, 3),
               "fixed_step_s": round(self.fix_s, 6), "gain_pct": round(self.gain_pct, 2)}
        if self.ranks and len(self.ranks) <= 16:
            out["ranks"] = self.ranks
        elif self.ranks:
            out["ranks_count"] = len(self.ranks)
        if self.add_share is not None:
            out["alone_share"] = round(self.add_share, 3)
        return out


@dataclass
class WindowAttribution:
    """One window's (one set of template-sharing steps') attribution."""

    lo: int
    hi: int
    steps: list[int]
    ranks: np.ndarray  # replayed ranks
    recorded_s: np.ndarray  # (K,) recorded step times
    replay_s: np.ndarray  # (K,) as-is replay
    base_s: dict[str, np.ndarray]  # scenario name → (K,) step times: u0, peer, ideal, own, upeer
    shares: list[Share]
    components: list[str]
    balance: dict[int, dict[str, float]]
    irregular_steps: list[int] = field(default_factory=list)
    hidden_joins: list[str] = field(default_factory=list)
    excess_s: dict[int, float] = field(default_factory=dict)  # rank → worker excess per step (s)
    host_excess_s: dict[int, float] = field(default_factory=dict)  # rank → untracked excess per step (s)
    excess_by_component_s: dict[int, list[float]] = field(default_factory=dict)  # rank → worker excess per component
    categories: list[str] = field(default_factory=list)  # each component's category (compute, host, untracked)
    blocks: list[str | None] = field(default_factory=list)  # each component's block (fwd, bwd) or None
    #: (ranks, K): each rank's own work per step over its peers' typical (1 = like its peers)
    work_ratio: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    #: (ranks, K) seconds: untracked time per step beyond the least any peer needed
    host_excess_steps_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    comm_ratio: dict[tuple, float] = field(default_factory=dict)  # communicator → transfer / its family's typical
    stage_correlation: float | None = None  # block time moving together across a line's stages (inputs)
    tp: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # each replayed rank's tp coordinate
    stage: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # … and stage
    #: step → rank → its share of that step's critical path
    critical: dict[int, dict[int, float]] = field(default_factory=dict)
    line: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # each replayed rank's pipeline line
    #: (ranks, K) seconds: each rank's own work per step beyond its peers' typical
    work_excess_steps_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    #: what a second pass needs (``evaluate``); dropped once the window's findings are made
    _model: tuple | None = field(default=None, repr=False, compare=False)

    def evaluate(self, sets: list[tuple[Part, str, list[int]]]) -> list[Share]:
        """The fix what-ifs of further rank sets — (part, label, ranks) — in a second replay of
        this window's graph (the first pass's baselines stand); appended to ``shares``."""
        if self._model is None or not sets:
            return []
        ch, g, d = self._model
        col_of = {int(r): i for i, r in enumerate(self.ranks.tolist())}
        J = len(ch.components)
        untracked = np.zeros(J, bool)
        untracked[-1] = True
        groups = []
        for part, label, rs in sets:
            m = np.zeros(self.ranks.size, bool)
            for r in rs:
                if r in col_of:
                    m[col_of[r]] = True
            groups.append(_Group(part, GroupKind.RANKS, label, list(rs), m,
                                 comps=untracked if part == Part.HOST else None))
        T = replay(g, d, [_scenario(grp) for grp in groups])
        named = self.base_s
        t_mean = {k: float(v.mean()) for k, v in named.items()}
        out = [_share(grp, T[:, i], named, t_mean) for i, grp in enumerate(groups)]
        self.shares += out
        return out

    @property
    def error_pct(self) -> float:
        """Median |replay / recorded − 1| over the steps, %: how well the graph holds the job."""
        ok = self.recorded_s > 0
        if not ok.any():
            return float("nan")
        return 100.0 * float(np.median(np.abs(self.replay_s[ok] / self.recorded_s[ok] - 1.0)))

    def mean(self, name: str) -> float:
        return float(np.mean(self.base_s[name])) / 1e9

    @property
    def s_durations(self) -> float:
        return _ratio(self.mean("u0"), self.mean("ideal"))

    @property
    def s_worker(self) -> float:
        return _ratio(self.mean("u0"), self.mean("peer"))

    @property
    def s_stage(self) -> float:
        return _ratio(self.mean("peer"), self.mean("ideal"))

    @property
    def s_host(self) -> float:
        return _ratio(self.mean("rec"), self.mean("upeer"))

    @property
    def fluctuation_share(self) -> float:
        """The worker part the ranks' step-to-step fluctuation explains."""
        d = self.mean("u0") - self.mean("peer")
        return (self.mean("u0") - self.mean("own")) / d if d > 0 else 0.0

    def of(self, part: Part, kind: GroupKind | None = None) -> list[Share]:
        return [s for s in self.shares if s.part == part and (kind is None or s.kind == kind)]

    def to_json(self) -> dict:
        return {"steps": self.steps, "ranks_replayed": int(self.ranks.size),
                "recorded_step_s": round(float(np.mean(self.recorded_s)) / 1e9, 6),
                "replay_error_pct": round(self.error_pct, 2),
                "slowdown": {"durations": round(self.s_durations, 4), "worker": round(self.s_worker, 4),
                             "stage": round(self.s_stage, 4), "host": round(self.s_host, 4),
                             "fluctuation_share": round(self.fluctuation_share, 3)},
                "ideal_step_s": round(self.mean("ideal"), 6)}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


@dataclass
class _Group:
    part: Part
    kind: GroupKind
    label: str
    ranks: list[int]
    cols: np.ndarray | None  # bool over replayed columns
    comps: np.ndarray | None = None
    comms: np.ndarray | None = None
    add: bool = False


def attribute_graph(ch: Chains, g: StepGraph, layout: Layout, hosts: np.ndarray, lo: int, hi: int,
                    extra: list[tuple[str, list[int]]] | None = None) -> WindowAttribution:
    """Every what-if of one graph. ``extra``: rank sets to evaluate as well (label, ranks) — the
    culprits the rules named, so their impact is measured, not inferred."""
    d = durations(ch, g, layout)
    ranks = g.ranks
    col_of = {int(r): i for i, r in enumerate(ranks.tolist())}
    n_cols = ranks.size
    J = len(ch.components)
    untracked = np.zeros(J, bool)
    untracked[-1] = True
    K = g.steps.size
    # -- excess per rank: worker (gaps beyond the peers', untracked time aside) and host ----------
    # Sums over a rank's nodes count each own-time interval once: only the gaps before the
    # events it waited for (a gap before an event it did not wait for lies inside the next one's)
    excess_w = np.zeros(n_cols)
    excess_h = np.zeros(n_cols)
    excess_c = np.zeros((n_cols, J))  # worker excess by component
    work_rec = np.zeros((n_cols, K))  # own work per step (untracked time aside)
    work_peer = np.zeros(n_cols)  # … its peers' typical
    host_x = np.zeros((n_cols, K))  # untracked time beyond the least any peer needed, per step
    blocks_rec = np.zeros((n_cols, K))  # forward and backward block time per step
    block_j = np.array([c.block is not None for c in ch.components])
    off = 0
    for si, st in enumerate(g.stages):
        wgt = st.blocking.astype(np.float64)
        if not wgt.any():
            wgt = np.ones(st.n)
        rec0k = d.gaps["rec0"][si].astype(np.float64)  # (n, C, K, J)
        rec0c = rec0k.mean(axis=2)  # (n, C, J)
        peerc = d.gaps["peer"][si][:, :, 0, :].astype(np.float64)
        sl = slice(off, off + st.columns)
        excess_w[sl] = np.einsum("n,nc->c", wgt, np.maximum(rec0c.sum(-1) - peerc.sum(-1), 0.0))
        excess_c[sl] = np.einsum("n,ncj->cj", wgt, np.maximum(rec0c - peerc, 0.0))
        # the work a rank is compared on is its own: the run-queue delay (another process had its
        # CPU) and the waits the producer measured inside its phases are not (CI's netns pipeline,
        # 6 ranks on one vCPU: one rank's backward 252 ms of wall in 5 steps for 34 ms of its own)
        if ch.work.own_busy is not None:
            share = np.ones((st.columns, K, J))
            share[..., :-1] = ch.work.own_share(st.ranks, g.steps)
            work_rec[sl] = np.einsum("n,nckj,ckj->ck", wgt, rec0k, share)
        else:
            work_rec[sl] = np.einsum("n,nck->ck", wgt, rec0k.sum(-1))
        work_peer[sl] = np.einsum("n,nc->c", wgt, d.work[si][:, :, 0, :].astype(np.float64).sum(-1))
        blocks_rec[sl] = np.einsum("n,nck->ck", wgt, rec0k[..., block_j].sum(-1))
        rec_u = d.gaps["rec"][si][..., -1].astype(np.float64)  # (n, C, K)
        low_u = d.gaps["upeer"][si][..., -1].astype(np.float64)
        hx = np.einsum("n,nck->ck", wgt, np.maximum(rec_u - low_u, 0.0))
        host_x[sl] = hx
        excess_h[sl] = hx.mean(axis=1)
        off += st.columns

    def top(score: np.ndarray) -> list[int]:
        if n_cols <= ALL_RANKS:
            order = np.argsort(-score, kind="stable")
            return [int(ranks[i]) for i in order]
        order = np.argsort(-score, kind="stable")[:MAX_CANDIDATES]
        return [int(ranks[i]) for i in order if score[i] > 0]

    def mask(rs: list[int]) -> np.ndarray:
        m = np.zeros(n_cols, bool)
        for r in rs:
            if r in col_of:
                m[col_of[r]] = True
        return m

    groups: list[_Group] = []
    cand_w = top(excess_w)
    cand_h = top(excess_h)
    for r in cand_w:
        groups.append(_Group(Part.WORKER, GroupKind.RANK, f"rank {r}", [r], mask([r])))
        groups.append(_Group(Part.WORKER, GroupKind.RANK, f"rank {r}", [r], mask([r]), add=True))
    ranked = [r for r in cand_w if excess_w[col_of[r]] > 0]
    for k in (2, 4, 8, 16, 32):
        if k < len(ranked) and k <= max(2, n_cols // 2):
            rs = ranked[:k]
            groups.append(_Group(Part.WORKER, GroupKind.RANKS, f"top {k} ranks", rs, mask(rs)))
    host_arr = np.asarray(hosts).astype(str)
    held = Counter(host_arr[r] for r in set(cand_w[:MAX_CANDIDATES] + cand_h[:MAX_CANDIDATES]))
    # in a large job, a host with one candidate is that rank's own what-if (its scenarios were
    # 66 of 166 at 10,240 ranks, each a full replay); a host with several is asked as a host
    alone = 1 if n_cols <= ALL_RANKS else 2
    for h in sorted(h for h, n in held.items() if n >= alone):
        rs = [int(r) for r in ranks if host_arr[r] == h]
        if len(rs) > 1:
            groups.append(_Group(Part.WORKER, GroupKind.HOST, h, rs, mask(rs)))
            groups.append(_Group(Part.HOST, GroupKind.HOST, h, rs, mask(rs), comps=untracked))
    co = layout.coords(ranks)
    replica = co["cp"] + layout.cp * (co["ep"] + layout.ep * co["dp"])
    n_rep = int(replica.max()) + 1
    if n_rep > 1 and layout.pp > 1:
        rep_excess = np.bincount(replica, weights=excess_w, minlength=n_rep)
        order = np.argsort(-rep_excess, kind="stable")
        for rp in order[: (n_rep if n_rep <= ALL_RANKS else 8)]:
            rs = [int(r) for r in ranks[replica == rp]]
            groups.append(_Group(Part.WORKER, GroupKind.REPLICA, f"replica {int(rp)}", rs, replica == rp))
            groups.append(_Group(Part.WORKER, GroupKind.REPLICA, f"replica {int(rp)}", rs, replica == rp, add=True))
    for r in cand_h:
        groups.append(_Group(Part.HOST, GroupKind.RANK, f"rank {r}", [r], mask([r]), comps=untracked))
    ranked_h = [r for r in cand_h if excess_h[col_of[r]] > 0]
    for k in (2, 4, 8):
        if k < len(ranked_h) and k <= max(2, n_cols // 2):
            rs = ranked_h[:k]
            groups.append(_Group(Part.HOST, GroupKind.RANKS, f"top {k} ranks", rs, mask(rs), comps=untracked))
    for j, c in enumerate(ch.components[:-1]):
        cm = np.zeros(J, bool)
        cm[j] = True
        groups.append(_Group(Part.WORKER, GroupKind.COMPONENT, c.name, [], None, comps=cm))
    # communicators: the ones whose transfers exceed their family's typical the most
    comm_excess = np.zeros(len(g.communicators))
    for fi, fam in enumerate(g.families):
        ex = np.maximum(d.transfers["rec"][fi].mean(axis=1) - d.transfers["peer"][fi][:, 0], 0.0)
        np.add.at(comm_excess, fam.unit_comm, ex)
    for ci in np.argsort(-comm_excess, kind="stable")[:8]:
        if comm_excess[ci] <= 0:
            break
        cm = np.zeros(len(g.communicators), bool)
        cm[ci] = True
        key = g.communicators[int(ci)]
        groups.append(_Group(Part.WORKER, GroupKind.COMMUNICATOR, _comm_label(key), _comm_ranks(layout, key, ranks),
                             None, comms=cm))
    groups.append(_Group(Part.WORKER, GroupKind.TRANSFERS, "every transfer", [], None,
                         comps=np.zeros(J, bool), comms=np.ones(len(g.communicators), bool)))
    if len(g.stages) > 1:
        stage_of = layout.stage_of(ranks)
        comm_stage = np.full(len(g.communicators), -1)
        for fam in g.families:
            stages = {g.stages[si].stage for si, _ in fam.members}
            if len(stages) == 1:
                comm_stage[fam.unit_comm] = next(iter(stages))
        for st in g.stages:
            m = stage_of == st.stage
            rs = [int(r) for r in ranks[m]]
            cm = comm_stage == st.stage
            groups.append(_Group(Part.STAGE, GroupKind.STAGE, f"stage {st.stage}", rs, m, comms=cm))
            groups.append(_Group(Part.STAGE, GroupKind.STAGE, f"stage {st.stage}", rs, m, comms=cm, add=True))
    members = None
    for label, rs in extra or []:
        rs = [r for r in rs if r in col_of]
        if rs:
            groups.append(_Group(Part.WORKER, GroupKind.RANKS, label, rs, mask(rs)))
            groups.append(_Group(Part.HOST, GroupKind.RANKS, label, rs, mask(rs), comps=untracked))
            # … and their links: the transfers of every communicator they are members of
            if members is None:
                members = [set(_comm_ranks(layout, key, ranks)) for key in g.communicators]
            touch = np.array([bool(m & set(rs)) for m in members], bool)
            if touch.any():
                groups.append(_Group(Part.WORKER, GroupKind.TRANSFERS, label, rs, None,
                                     comps=np.zeros(J, bool), comms=touch))
    # -- scenarios ------------------------------------------------------------------------------
    base = [Scenario("rec"), Scenario("u0", "rec0", "rec0"),
            Scenario("peer", "peer", "peer", tr_base="peer", tr_over="peer"),
            Scenario("ideal", "ideal", "ideal", tr_base="ideal", tr_over="ideal"),
            Scenario("own", "own", "own", tr_base="own", tr_over="own"),
            Scenario("upeer", "upeer", "upeer")]
    scen = list(base)
    for grp in groups:
        scen.append(_scenario(grp))
    T = replay(g, d, scen)  # (K, Z) ns
    named = {s.label: T[:, i] for i, s in enumerate(base)}
    t_mean = {k: float(v.mean()) for k, v in named.items()}
    shares = []
    for i, grp in enumerate(groups):
        t = T[:, len(base) + i]
        shares.append(_share(grp, t, named, t_mean))
    shares = _merge_add(shares)
    hidden = [f.name for f in g.families if f.hidden_join]
    excess = {int(r): float(excess_w[col_of[int(r)]]) / 1e9 for r in ranks if excess_w[col_of[int(r)]] > 0}
    hexcess = {int(r): float(excess_h[col_of[int(r)]]) / 1e9 for r in ranks if excess_h[col_of[int(r)]] > 0}
    by_comp = {int(r): (excess_c[col_of[int(r)]] / 1e9).tolist() for r in ranks if excess_w[col_of[int(r)]] > 0}
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(work_peer[:, None] > 0, work_rec / work_peer[:, None], np.nan)
    comm_ratio: dict[int, list[float]] = {}
    for fi, fam in enumerate(g.families):
        rec_t = d.transfers["rec"][fi].mean(axis=1)
        ideal_t = d.transfers["peer"][fi][:, 0]
        for u, ci in enumerate(fam.unit_comm.tolist()):
            if ideal_t[u] > 0:
                comm_ratio.setdefault(int(ci), []).append(float(rec_t[u] / ideal_t[u]))
    stage_of = layout.stage_of(ranks)
    wa = WindowAttribution(lo, hi, [int(s) for s in g.steps], ranks, g.recorded_ns, named["rec"],
                             named, shares, [c.name for c in ch.components], d.balance, list(g.irregular_steps),
                             hidden, excess, hexcess, by_comp, [c.category for c in ch.components],
                             [c.block for c in ch.components], ratio, host_x / 1e9,
                             {g.communicators[c]: float(np.median(v)) for c, v in comm_ratio.items()},
                             _stage_correlation(blocks_rec, stage_of, layout), layout.coords(ranks)["tp"], stage_of)
    wa.critical = critical_path(g, d)
    wa.line = layout.group_index(GK.PP)[ranks]
    wa.work_excess_steps_s = (work_rec - work_peer[:, None]) / 1e9
    wa._model = (ch, g, d)
    return wa


def _stage_correlation(blocks: np.ndarray, stage_of: np.ndarray, layout: Layout) -> float | None:
    """How strongly a pipeline line's block time in a step moves together across its stages
    (Pearson over (line, step) pairs of adjacent stages, each rank's own mean removed): uneven
    inputs lengthen every stage a microbatch passes through; a busy host lengthens one rank."""
    stages = sorted_unique(stage_of)
    if stages.size < 2 or blocks.shape[1] < 3:
        return None
    rows = [blocks[stage_of == s] for s in stages]
    if len({r.shape[0] for r in rows}) != 1:
        return None
    cs = []
    for a, b in zip(rows, rows[1:]):
        x = (a - a.mean(axis=1, keepdims=True)).ravel()
        y = (b - b.mean(axis=1, keepdims=True)).ravel()
        den = float(np.sqrt((x * x).sum() * (y * y).sum()))
        if den > 0:
            cs.append(float((x * y).sum()) / den)
    return float(np.mean(cs)) if cs else None


def _scenario(grp: _Group) -> Scenario:
    if grp.part == Part.HOST:
        return Scenario(grp.label, "rec", "upeer", cols=grp.cols, comps=grp.comps)
    if grp.part == Part.STAGE:
        if grp.add:
            return Scenario(grp.label, "ideal", "peer", cols=grp.cols, tr_base="ideal", tr_over="peer", comms=grp.comms)
        return Scenario(grp.label, "peer", "ideal", cols=grp.cols, tr_base="peer", tr_over="ideal", comms=grp.comms)
    if grp.comms is not None:  # transfers only
        if grp.add:
            return Scenario(grp.label, "peer", "peer", tr_base="peer", tr_over="rec", comms=grp.comms)
        return Scenario(grp.label, "rec0", "rec0", tr_base="rec", tr_over="peer", comms=grp.comms)
    if grp.add:
        return Scenario(grp.label, "peer", "rec0", cols=grp.cols, comps=grp.comps, tr_base="peer", tr_over="peer")
    return Scenario(grp.label, "rec0", "peer", cols=grp.cols, comps=grp.comps)


def _share(grp: _Group, t: np.ndarray, named: dict[str, np.ndarray], t_mean: dict[str, float]) -> Share:
    base, ideal = {Part.WORKER: ("u0", "peer"), Part.STAGE: ("peer", "ideal"), Part.HOST: ("rec", "upeer")}[grp.part]
    d = t_mean[base] - t_mean[ideal]
    tm = float(t.mean())
    if grp.add:
        share = (tm - t_mean[ideal]) / d if d > 0 else 0.0
        return Share(grp.part, grp.kind, grp.label, grp.ranks, float("nan"), float("nan"), tm / 1e9, share)
    share = (t_mean[base] - tm) / d if d > 0 else 0.0
    return Share(grp.part, grp.kind, grp.label, grp.ranks, tm / 1e9, share,
                 per_step_gain_s=[float(x) / 1e9 for x in (named[base] - t)])


def _merge_add(shares: list[Share]) -> list[Share]:
    """An ``add`` what-if joins the ``fix`` one of the same group."""
    out: list[Share] = []
    by_key: dict[tuple, Share] = {}
    for s in shares:
        key = (s.part, s.kind, s.label)
        if np.isnan(s.fix_s):
            if key in by_key:
                by_key[key].add_s, by_key[key].add_share = s.add_s, s.add_share
            continue
        by_key[key] = s
        out.append(s)
    for s in shares:  # an add without its fix (not made): kept
        if np.isnan(s.fix_s) and (s.part, s.kind, s.label) not in by_key:
            out.append(s)
    return out


def _comm_label(key: tuple) -> str:
    if key and key[0] == "pp" and len(key) == 4:
        return f"pipeline line {key[1]}, stages {key[2]}–{key[3]}"
    if len(key) >= 2 and key[1] == "alone":
        return f"{key[0]} (rank {key[2]})"
    return f"{key[0]} group {key[1]}" if len(key) >= 2 else str(key[0])


def _comm_ranks(layout: Layout, key: tuple, ranks: np.ndarray) -> list[int]:
    from argus.analysis.collectives import group_keys
    from argus.vocab import GroupKind as GK

    if not key:
        return []
    if key[0] == "pp" and len(key) == 4:
        line = layout.group_index(GK.PP)[ranks]
        stage = layout.stage_of(ranks)
        return [int(r) for r in ranks[(line == key[1]) & (stage >= key[2]) & (stage <= key[3])]]
    if len(key) >= 3 and key[1] == "alone":
        return [int(key[2])]
    keys = group_keys(layout, str(key[0]), ranks)
    if keys is None or len(key) < 2:
        return []
    return [int(r) for r in ranks[keys == key[1]]]
