"""The step as a dependency graph of what was recorded, laid out for a vectorised replay.

Synchronous training is SPMD: every rank of a pipeline stage issues the same communication
events in the same order. So each stage has one **template** — its event sequence — and the
graph is the templates of the stages, joined by **families** of events that complete together:

* a collective: the events with the same (name, group kind, occurrence in the step) in every
  stage that holds them; its **units** are the actual communicators — the members of each
  group of that kind among the replayed ranks (the layout's group, or Megatron's
  ``model_parallel`` and ``embedding`` groups), never a guessed kind;
* a pipeline transfer: the *n*-th send from stage *s* to stage *d* with the *n*-th receive at
  *d* from *s* (per pipeline line — microbatch labels are not needed);
* anything else (a kind no layout describes, a transfer with no partner): alone.

A rank whose events in a step differ from its stage's template (a lost record, a cut window)
makes that step irregular: it is left out of the replay and counted. Steps whose templates
agree are replayed together; a replay is values of shape (columns, steps, scenarios) per
template node, with the stage's ranks as columns in pipeline-line order, so a pipeline
neighbour is the same column one stage row away.

``schedule`` orders the nodes so every join sees all its members' arrivals: it walks the
templates as the ranks would (a blocking event waits for its family and for every earlier
event the rank did not wait for), and reports a cycle — a recording whose order cannot be
replayed — as None."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from argus.analysis.attribution.chains import Chains
from argus.analysis.collectives import group_keys
from argus.analysis.attribution.grouped import Grouping
from argus.topology import GROUP_KINDS, Layout
from argus.vocab import GroupKind
from argus.uniques import sorted_unique

__all__ = ["StageRows", "Family", "StepGraph", "build_graphs", "ARRIVE", "COMPLETE", "PASS"]

ARRIVE, COMPLETE, PASS = 0, 1, 2
#: Group kinds whose groups hold ranks of several pipeline stages.
_CROSS_STAGE = (GroupKind.WORLD, GroupKind.PP, "model_parallel", "embedding")


@dataclass
class StageRows:
    stage: int
    ranks: np.ndarray  # (C,) replayed ranks of the stage, in pipeline-line order
    ev: np.ndarray  # (n, C, K) event index (into the chains) of each node, column and step
    blocking: np.ndarray  # (n,) the rank waits for the node's family (majority of the recordings)
    send: np.ndarray  # (n,) a pipeline send (never waited for by its rank)
    labels: list[str]  # node names
    comp: np.ndarray  # (n, C, K, J) float32: each gap by component, the cursor moved as ``blocking`` says
    #: (n,) for a node its rank does not wait for (and not a send): the earliest blocking node at
    #: which any of its columns and steps waits for it; n: at the step's end
    join: np.ndarray | None = None
    #: (n, C, K) where each column and step waited for such a node: the first blocking node that rank
    #: was still inside when the node ended (a receive posted early is awaited where its data is
    #: needed, not at the next collective; GPU streams make that place differ from step to step)
    join_cells: np.ndarray | None = None

    def join_of(self, i: int) -> int:
        if self.join is not None:
            return int(self.join[i])
        nxt = np.flatnonzero(self.blocking[i + 1:])  # (a graph made without: the next blocking node)
        return i + 1 + int(nxt[0]) if nxt.size else self.n

    def joins_of(self, i: int) -> list[tuple[int, np.ndarray | None]]:
        """(blocking node, the (C, K) cells that wait for node ``i`` there — None: all of them)."""
        if self.join_cells is None:
            return [(self.join_of(i), None)]
        cells = self.join_cells[i]
        at = sorted_unique(cells.ravel())
        if at.size == 1:
            return [(int(at[0]), None)]
        return [(int(j), cells == j) for j in at]

    @property
    def n(self) -> int:
        return int(self.ev.shape[0])

    @property
    def columns(self) -> int:
        return int(self.ranks.size)


@dataclass
class Family:
    """Events that complete together; ``members`` are (stage, node) pairs whose columns, stacked
    in that order, are the rows ``grouping`` groups into units."""

    name: str
    kind: str
    members: list[tuple[int, int]]
    grouping: Grouping
    unit_comm: np.ndarray  # communicator id of each unit (index into StepGraph.communicators)
    alone: bool = False
    #: its members started together although they were ready at very different times: a
    #: synchronisation the recording does not hold (a barrier, an untraced collective) gates it
    hidden_join: bool = False
    transfer: np.ndarray | None = None  # (U, K) recorded transfers, when not the members' shortest duration
    #: (R, K) how long after the unit's first member each member saw it end (one clock): a rank
    #: whose thread was descheduled notices a finished collective late, and starts its next work late
    latency: np.ndarray | None = None


@dataclass
class StepGraph:
    steps: np.ndarray  # (K,) step numbers replayed together
    stages: list[StageRows]
    families: list[Family]
    family_of: dict[tuple[int, int], int]
    ops: list[tuple[int, int, int]]  # (ARRIVE, s, i) | (COMPLETE, f, 0) | (PASS, s, i)
    origin: list[np.ndarray]  # per stage (C, K): where the step begins on each rank, ns after the step's reference
    recorded_ns: np.ndarray  # (K,) recorded step time (last end − first origin)
    communicators: list[tuple]  # (kind, members…) per communicator id
    irregular_steps: list[int] = field(default_factory=list)

    @property
    def ranks(self) -> np.ndarray:
        return np.concatenate([s.ranks for s in self.stages])

    @property
    def joins_ranks(self) -> bool:
        """Whether any family ends its members together (a unit of two or more rows)."""
        return any(f.grouping.n_groups < sum(self.stages[si].columns for si, _ in f.members) for f in self.families)


def _tokens(ch: Chains) -> np.ndarray:
    k = len(ch.kinds) + 1
    return ((((ch.name.astype(np.int64) * k + ch.kind) * 2 + ch.send) * 2 + ch.recv) * 3 + (ch.peer + 1)) + 1


def _run_hashes(ch: Chains) -> np.ndarray:
    """A hash of each run's event sequence (uint64 arithmetic wraps; a collision needs two
    different sequences of the same length to agree on 64 bits)."""
    tok = _tokens(ch).astype(np.uint64)
    pos = np.arange(ch.n) - np.repeat(ch.run_first, ch.run_count)
    mult = np.uint64(0x9E3779B97F4A7C15)
    powers = np.ones(int(ch.run_count.max()) + 1, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, powers.size):
            powers[i] = powers[i - 1] * mult
        h = np.add.reduceat(tok * powers[pos], ch.run_first)
        return h + ch.run_count.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93)


def _fixed(ch: Chains) -> np.ndarray:
    """Events whose place in a rank's sequence is the program's: its collectives. A pipeline send
    or receive is posted beside them, early or late by the timing of the step (batched, async),
    and whether its rank waited for it differs from rank to rank."""
    return ~(ch.send | ch.recv)


def _relaxed_hashes(ch: Chains) -> np.ndarray:
    """Each run's hash with its pipeline sends and receives taken as a set: its collectives in
    order, plus the sum of a mix of each send's and receive's token (and their count)."""
    tok = _tokens(ch).astype(np.uint64)
    waited = _fixed(ch)
    run_of = np.repeat(np.arange(ch.run_first.size), ch.run_count)
    # position among the run's waited-for events
    cum = np.cumsum(waited) - waited
    pos = cum - np.repeat(cum[ch.run_first], ch.run_count)
    mult = np.uint64(0x9E3779B97F4A7C15)
    powers = np.ones(int(ch.run_count.max()) + 1, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, powers.size):
            powers[i] = powers[i - 1] * mult
        seq = np.bincount(run_of[waited], minlength=ch.run_first.size).astype(np.uint64)
        h = np.zeros(ch.run_first.size, np.uint64)
        np.add.at(h, run_of[waited], tok[waited] * powers[pos[waited]])
        free = ~waited
        mixed = (tok[free] * np.uint64(0xBF58476D1CE4E5B9)) ^ (tok[free] >> np.uint64(7))
        np.add.at(h, run_of[free], mixed * np.uint64(0x94D049BB133111EB))
        return h + seq * np.uint64(0xD6E8FEB86659FD93) + ch.run_count.astype(np.uint64)


def _align(ch: Chains, tok: np.ndarray, run: int, template: int) -> bool:
    """Put ``run``'s events in ``template``'s order (in place): its collectives keep their order;
    its n-th send or receive of one kind takes the template's n-th slot of that kind. A gap
    before a moved event is then measured from the template's place (zero where the event came
    earlier). False (and nothing moved) where the two runs do not hold the same events after all."""
    n = int(ch.run_count[run])
    a, t = int(ch.run_first[run]), int(ch.run_first[template])
    mine, theirs = np.arange(a, a + n), np.arange(t, t + n)
    fixed = _fixed(ch)
    slots: dict[tuple[bool, int], list[int]] = defaultdict(list)
    for p, e in enumerate(theirs.tolist()):
        slots[(bool(fixed[e]), int(tok[e]))].append(p)
    order = np.empty(n, np.int64)
    waited_slots = [p for p, e in enumerate(theirs.tolist()) if fixed[e]]
    taken = {k: 0 for k in slots}
    w = 0
    for e in mine.tolist():
        key = (False, int(tok[e]))
        if fixed[e]:
            if w >= len(waited_slots) or tok[theirs[waited_slots[w]]] != tok[e]:
                return False
            order[waited_slots[w]] = e
            w += 1
        elif taken.get(key, 0) < len(slots.get(key, ())):
            order[slots[key][taken[key]]] = e
            taken[key] += 1
        else:
            return False  # (two different runs that hashed alike)
    for arr in (tok, ch.rank, ch.step, ch.name, ch.kind, ch.send, ch.recv, ch.peer, ch.blocking, ch.start, ch.dur):
        arr[a:a + n] = arr[order]
    return True


def build_graphs(ch: Chains, layout: Layout, ranks: np.ndarray | None = None) -> list[StepGraph]:
    """One graph per set of steps that share their templates (usually one), over ``ranks``
    (default: every rank with events; a subset must hold whole pipeline lines)."""
    present = sorted_unique(ch.run_rank)
    use = present if ranks is None else np.intersect1d(present, np.asarray(ranks, np.int64))
    keep_run = np.isin(ch.run_rank, use)
    hashes = _run_hashes(ch)
    steps = sorted_unique(ch.run_step[keep_run])
    stage_of = layout.stage_of(use)
    stages = sorted(set(stage_of.tolist()))
    line = layout.group_index(GroupKind.PP)
    cols = {s: use[stage_of == s][np.argsort(line[use[stage_of == s]], kind="stable")] for s in stages}
    # run index per (rank, step)
    run_at: dict[tuple[int, int], int] = {}
    idx = np.flatnonzero(keep_run)
    for i, r, s in zip(idx.tolist(), ch.run_rank[idx].tolist(), ch.run_step[idx].tolist()):
        run_at[(r, s)] = i
    signature: dict[int, tuple] = {}
    irregular: list[int] = []
    relaxed: np.ndarray | None = None
    tok = np.zeros(0, np.int64)
    first_template: dict[int, int] = {}  # stage → a run of its first regular step
    for step in steps.tolist():
        sig: list[int] = []
        ok = True
        for s in stages:
            runs = [run_at.get((int(r), step), -1) for r in cols[s]]
            if min(runs) < 0:
                ok = False
                break
            hs = hashes[runs]
            vals, counts = np.unique(hs, return_counts=True)
            templates = [runs[int(np.flatnonzero(hs == vals[np.argmax(counts)])[0])]]
            if s in first_template:
                templates.insert(0, first_template[s])
            for template in templates:
                # runs that differ from the stage's template (its first step's, else this step's
                # most common) only in where a pipeline send or receive — posted early or late,
                # asynchronously — lies between the collectives: put in its order
                if not (hs != hashes[template]).any():
                    break
                if relaxed is None:
                    relaxed, tok = _relaxed_hashes(ch), _tokens(ch)
                for r in np.asarray(runs)[hs != hashes[template]].tolist():
                    if relaxed[r] == relaxed[template] and _align(ch, tok, r, template):
                        hashes[r] = hashes[template]
                hs = hashes[runs]
            vals, counts = np.unique(hs, return_counts=True)
            mode = vals[np.argmax(counts)]
            if (hs != mode).any():
                ok = False
                break
            first_template.setdefault(s, runs[0])
            sig.append(int(mode))
        if ok:
            signature[step] = tuple(sig)
        else:
            irregular.append(step)
    by_sig: dict[tuple, list[int]] = defaultdict(list)
    for step, key in signature.items():
        by_sig[key].append(step)
    graphs = []
    for sig_steps in sorted(by_sig.values(), key=len, reverse=True):
        g = _graph(ch, layout, stages, cols, run_at, np.array(sorted(sig_steps), np.int64))
        if g is not None:
            g.irregular_steps = irregular
            graphs.append(g)
    return graphs


def _graph(ch: Chains, layout: Layout, stages: list[int], cols: dict[int, np.ndarray],
           run_at: dict[tuple[int, int], int], steps: np.ndarray) -> StepGraph | None:
    rows: list[StageRows] = []
    origin, final = [], []
    for s in stages:
        runs = np.array([[run_at[(int(r), int(k))] for k in steps] for r in cols[s]], np.int64)  # (C, K)
        n = int(ch.run_count[runs[0, 0]])
        ev = (ch.run_first[runs][None, :, :] + np.arange(n)[:, None, None])  # (n, C, K)
        blocking = ch.blocking[ev].reshape(n, -1).mean(axis=1) >= 0.5 if n else np.zeros(0, bool)
        first = ev[:, 0, 0]
        labels = [ch.names[int(ch.name[e])] for e in first]
        _, comp = ch.gaps(ev, runs, blocking)
        send = ch.send[first].copy()
        rows.append(StageRows(s, cols[s], ev, blocking, send, labels, comp, *_joins(ch, ev, blocking, send)))
        origin.append(ch.origin[runs])
        final.append(ch.final[runs])
    ref = np.min(np.stack([o.min(axis=0) for o in origin]), axis=0)  # (K,)
    recorded = np.max(np.stack([f_.max(axis=0) for f_ in final]), axis=0) - ref
    origin = [o - ref[None, :] for o in origin]
    families, family_of, comms = _families(ch, layout, rows)
    _hidden_joins(ch, rows, families, comms, recorded)
    for fam in families:
        if fam.alone:
            continue
        starts = np.concatenate([ch.start[rows[si].ev[i]] + ch.shift[rows[si].ranks][:, None]
                                 for si, i in fam.members])  # (R, K) on one clock
        ends = starts + np.concatenate([ch.dur[rows[si].ev[i]] for si, i in fam.members])
        first_end = fam.grouping.min(ends)  # (U, K)
        fam.latency = np.maximum(ends - first_end[fam.grouping.inverse], 0.0)
        if not fam.hidden_join:
            # the transfer: from the last member's arrival to the first member's end — a late
            # observer's own delay is its latency, not the link's
            fam.transfer = np.maximum(first_end - fam.grouping.max(starts), 0.0)
    ops = _schedule(rows, families, family_of)
    if ops is None:
        return None
    return StepGraph(steps, rows, families, family_of, ops, origin, recorded, comms)


def _joins(ch: Chains, ev: np.ndarray, blocking: np.ndarray, send: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each node its rank does not wait for is awaited, per column and step: the first later
    blocking node still running (on that rank's clock) when it ended, else the step's end. DDP's
    buckets under backward are awaited at the step's end as before; a pipeline receive posted
    before the compute it overlaps, where that compute is done. Returns the earliest join per node
    (the schedule's) and the cells' (n, C, K)."""
    n = ev.shape[0]
    cells = np.full(ev.shape, n, np.int64)
    if n == 0:
        return np.full(0, 0, np.int64), cells
    ends = ch.start[ev] + ch.dur[ev]  # (n, C, K) own clock
    waited = np.flatnonzero(blocking)
    for i in np.flatnonzero(~blocking & ~send).tolist():
        open_ = np.ones(ev.shape[1:], bool)
        for j in waited[waited > i].tolist():
            hit = open_ & (ends[j] >= ends[i])
            cells[i][hit] = j
            open_ &= ~hit
            if not open_.any():
                break
    return cells.reshape(n, -1).min(axis=1), cells


def _families(ch: Chains, layout: Layout, rows: list[StageRows]) -> tuple[list[Family], dict, list[tuple]]:
    families: list[Family] = []
    family_of: dict[tuple[int, int], int] = {}
    comm_index: dict[tuple, int] = {}
    comms: list[tuple] = []
    pp = layout.pp
    by_key: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    sends: dict[tuple[int, int], list[int]] = defaultdict(list)  # (src, dst) → nodes of src
    recvs: dict[tuple[int, int], list[int]] = defaultdict(list)  # (src, dst) → nodes of dst
    for si, st in enumerate(rows):
        seen: dict[tuple, int] = defaultdict(int)
        for i in range(st.n):
            e = int(st.ev[i, 0, 0])
            kind = ch.kinds[int(ch.kind[e])]
            if kind == GroupKind.PP and (ch.send[e] or ch.recv[e]) and ch.peer[e] != 0:
                other = (st.stage + int(ch.peer[e])) % pp
                if ch.send[e]:
                    sends[(st.stage, other)].append(i)
                else:
                    recvs[(other, st.stage)].append(i)
                continue
            # a kind whose groups lie inside one stage joins that stage's events only; the world,
            # Megatron's model-parallel and embedding groups join events of several stages
            spans = kind in _CROSS_STAGE or kind not in GROUP_KINDS
            key = (int(ch.name[e]), kind, seen[(int(ch.name[e]), kind)], -1 if spans else st.stage)
            seen[(int(ch.name[e]), kind)] += 1
            by_key[key].append((si, i))
    stage_row = {st.stage: si for si, st in enumerate(rows)}

    def comm_id(key: tuple) -> int:
        if key not in comm_index:
            comm_index[key] = len(comms)
            comms.append(key)
        return comm_index[key]

    def add(name: str, kind: str, members: list[tuple[int, int]], keys: np.ndarray | None, comm_keys) -> None:
        alone = keys is None
        stacked = np.concatenate([rows[si].ranks for si, _ in members])
        grouping = Grouping.of(stacked if keys is None else keys)
        first_row = grouping.order[grouping.bounds]
        unit_comm = np.array([comm_id(comm_keys(int(r))) for r in first_row], np.int64)
        fi = len(families)
        families.append(Family(name, kind, members, grouping, unit_comm, alone))
        for m in members:
            family_of[m] = fi

    for (name_id, kind, _occ, _stage), members in by_key.items():
        stacked = np.concatenate([rows[si].ranks for si, _ in members])
        keys = group_keys(layout, kind, stacked)
        name = ch.names[name_id]
        if keys is None:
            add(name, kind, members, None, lambda j, st=stacked, k=kind: (k, "alone", int(st[j])))
        else:
            add(name, kind, members, keys,
                lambda j, ks=keys, k=kind: (k, int(ks[j])))
    paired: set[tuple[int, int]] = set()
    for (src, dst), s_nodes in sends.items():
        r_nodes = recvs.get((src, dst), [])
        if src not in stage_row or dst not in stage_row:
            continue
        a, b = stage_row[src], stage_row[dst]
        line = GroupKind.PP
        lines = layout.group_index(line)
        if rows[a].columns != rows[b].columns or not np.array_equal(lines[rows[a].ranks], lines[rows[b].ranks]):
            continue  # the two stages' columns are not the same pipeline lines: no pairs
        for i, j in zip(s_nodes, r_nodes):
            members = [(a, i), (b, j)]
            stacked = np.concatenate([rows[a].ranks, rows[b].ranks])
            keys = layout.group_index(line)[stacked]
            name = f"{rows[a].labels[i]}→{rows[b].labels[j]}"
            lo, hi = min(src, dst), max(src, dst)
            add(name, GroupKind.PP, members, keys, lambda j_, ks=keys, lo=lo, hi=hi: ("pp", int(ks[j_]), lo, hi))
            paired.add((a, i))
            paired.add((b, j))
    for si, st in enumerate(rows):  # what is left: alone
        for i in range(st.n):
            if (si, i) in family_of:
                continue
            e = int(st.ev[i, 0, 0])
            kind = ch.kinds[int(ch.kind[e])]
            ranks = st.ranks
            add(st.labels[i], kind, [(si, i)], None, lambda j, r=ranks, k=kind: (k, "alone", int(r[j])))
    return families, family_of, comms


#: Hidden joins: members whose starts lie within this share of the step (at least 1 ms) …
HIDDEN_START_SHARE = 0.002
#: … while the time no phase covers before them spreads over this many times as much …
HIDDEN_SPREAD = 10.0
#: … in at least this share of the steps.
HIDDEN_STEPS = 0.5


def _hidden_joins(ch: Chains, rows: list[StageRows], families: list[Family], comms: list[tuple],
                  recorded: np.ndarray) -> None:
    """Find families whose members all started together, on one clock, though what they did
    before took very different times (untracked time spread ×10 wider than the starts): they
    waited for something unrecorded. Such a family becomes one unit over all its members, and
    each member's untracked time before it is cut to the least any member had (the join's own
    latency): the rest was waiting, which the join now produces. Without this, ranks waiting at
    an untraced barrier look like ranks doing untracked work, and the peers' "typical" holds the
    wait (a real pp=4 trace: 22 s of such a wait on every healthy replica of the last stage)."""
    eps = np.maximum(1e6, HIDDEN_START_SHARE * recorded)  # (K,)
    for fam in families:
        if len(fam.members) < 2 and rows[fam.members[0][0]].columns < 2:
            continue
        starts = np.concatenate([ch.start[rows[si].ev[i]] + ch.shift[rows[si].ranks][:, None]
                                 for si, i in fam.members])  # (R, K)
        untracked = np.concatenate([rows[si].comp[i, :, :, -1] for si, i in fam.members]).astype(np.float64)
        together = (starts.max(axis=0) - starts.min(axis=0)) <= eps
        spread = (untracked.max(axis=0) - untracked.min(axis=0)) > HIDDEN_SPREAD * eps
        if not (together & spread).mean() >= HIDDEN_STEPS:
            continue
        floor = untracked.min(axis=0).astype(np.float32)  # (K,)
        for si, i in fam.members:
            rows[si].comp[i, :, :, -1] = np.minimum(rows[si].comp[i, :, :, -1], floor[None, :])
        comms.append(("hidden", fam.name))
        R = starts.shape[0]
        fam.grouping = Grouping.of(np.zeros(R, np.int64))
        fam.unit_comm = np.array([len(comms) - 1], np.int64)
        fam.hidden_join = True
        fam.alone = False


def _schedule(rows: list[StageRows], families: list[Family],
              family_of: dict[tuple[int, int], int]) -> list[tuple[int, int, int]] | None:
    """Template-level walk: ARRIVE each node in its stage's order, COMPLETE a family when all its
    members arrived, PASS a blocking node once its family and the events awaited there are
    complete. None when the walk cannot finish (a cycle)."""
    size = [len(f.members) for f in families]
    arrived = [0] * len(families)
    complete = [False] * len(families)
    ptr = [0] * len(rows)
    pending: list[dict[int, list[int]]] = [{} for _ in rows]  # per stage: join node → families awaited there
    ops: list[tuple[int, int, int]] = []
    done = 0
    total = sum(st.n for st in rows)
    arrived_node: set[tuple[int, int]] = set()
    while done < total:
        progressed = False
        for si, st in enumerate(rows):
            while ptr[si] < st.n:
                i = ptr[si]
                fi = family_of[(si, i)]
                if (si, i) not in arrived_node:
                    arrived_node.add((si, i))
                    ops.append((ARRIVE, si, i))
                    arrived[fi] += 1
                    if arrived[fi] == size[fi]:
                        ops.append((COMPLETE, fi, 0))
                        complete[fi] = True
                    progressed = True
                if st.blocking[i]:
                    if not complete[fi] or not all(complete[p] for p in pending[si].get(i, ())):
                        break
                    ops.append((PASS, si, i))
                    pending[si].pop(i, None)
                elif not st.send[i]:
                    pending[si].setdefault(st.join_of(i), []).append(fi)
                ptr[si] += 1
                done += 1
                progressed = True
        if not progressed:
            return None
    return ops
