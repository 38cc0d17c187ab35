"""Which collectives a hung job is stuck in, and which ranks never came — from the dumps alone.

Each group numbers its collectives in order on every member. Per group, a member's last
*enqueued* and last *completed* sequence numbers (``pg_status``; from the entries where a dump
predates it) say where it is: the first collective some member has not completed is the stuck
one, its members that enqueued it are waiting in it, and members whose last enqueued number is
lower never arrived. A rank that never arrived in one group may itself be waiting in another
(rank 2 stuck in a tensor-parallel all-reduce that rank 3 never joined holds up the data-parallel
all-reduce everyone else waits in): the culprit is the rank waiting nowhere, and the other stuck
collectives are its consequences. If every member arrived and none completed, no rank is to
blame on this evidence: the collective itself did not finish (a link, a peer's device) —
suspected, never named. Members that disagree on the op, sizes or dtypes at the same sequence
number are a mismatch: a bug in the job, named as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State
from argus.flight_recorder.dumps import DumpSet, Entry
from argus.vocab import EvidenceKind, Level

__all__ = ["StuckCollective", "stuck_collectives", "hang_incidents", "MAX_STACK_FRAMES", "MAX_STACKS"]

DEFAULT_GROUP_DESCS = ("default_pg", "WORLD")
MAX_STACK_FRAMES = 16  # frames kept of a stack (the job's, innermost first)
MAX_STACKS = 8  # distinct stacks kept per role (waiting, never joined) of a stuck collective
MAX_STACK_RANKS = 32  # ranks listed with a stack (all of them are counted)


@dataclass
class StuckCollective:
    group: str
    group_desc: str
    seq: int
    op: str
    input_sizes: tuple
    input_dtypes: tuple[str, ...]
    members: list[int]
    arrived: list[int]  # enqueued it and wait in it
    behind: list[int]  # members whose dumps show they never enqueued it
    no_dump: list[int]  # members without a readable dump
    waiting_at: str  # where the waiting ranks issued it
    last_of_behind: dict[int, dict] = field(default_factory=dict)  # rank → its last op on the group
    mismatch: dict[int, tuple] = field(default_factory=dict)  # rank → its signature, where they differ
    listed: bool = True  # members from the dumps' pg_config (NCCL), else from who used the group (gloo)
    culprits: list[int] = field(default_factory=list)  # set by stuck_collectives: behind and waiting nowhere
    #: where members are not listed: ranks whose dumps never mention the group and that wait in no
    #: stuck collective — members that never came, if they are members
    strangers: list[int] = field(default_factory=list)
    consequence: bool = False  # every rank it waits for waits in another stuck collective
    #: arrived members for which it is the first collective they issued and never saw complete
    #: (where they really wait; their later ones are queued behind it)
    heads: int = 0
    #: where the ranks that never joined last issued a collective (any group: where they went), then
    #: where the waiting ranks issued this one — each distinct stack once, with its ranks (``_stacks``)
    stacks: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"group": self.group, "group_desc": self.group_desc, "seq": self.seq, "op": self.op,
                "input_sizes": list(self.input_sizes), "input_dtypes": list(self.input_dtypes),
                "members": len(self.members), "arrived": self.arrived, "never_joined": self.behind,
                "no_dump": self.no_dump, "waiting_at": self.waiting_at, "members_listed": self.listed,
                **({"unlisted_idle_ranks": self.strangers} if self.strangers else {}),
                "last_of_never_joined": {str(r): v for r, v in self.last_of_behind.items()},
                **({"mismatch": {str(r): _show(s) for r, s in self.mismatch.items()}} if self.mismatch else {}),
                **({"stacks": self.stacks} if self.stacks else {})}


def _dims(sizes: tuple) -> str:
    """[[16, 4], [8]] → "16x4, 8"."""
    return ", ".join("x".join(map(str, s)) if isinstance(s, tuple) else str(s) for s in sizes)


def _show(sig: tuple) -> str:
    op, isz, idt = sig[:3]
    shape = f" [{_dims(isz)}]" if isz else ""  # no shapes where the op's members differ by design
    return f"{op.split(':')[-1]}{shape} {','.join(idt)}"


def _is_default(group: str, desc: str) -> bool:
    return desc in DEFAULT_GROUP_DESCS or (group == "0" and not desc)


def stuck_collectives(ds: DumpSet) -> list[StuckCollective]:
    """The first unfinished collective of every group that has one, with its culprits."""
    groups: dict[str, str] = {}
    members: dict[str, set[int]] = {}
    listed: dict[str, set[int]] = {}
    for d in ds.dumps.values():
        for g in d.groups():
            groups.setdefault(g, d.group_desc.get(g, ""))
            members.setdefault(g, set()).add(d.rank)
        for g, r in d.group_ranks.items():
            listed.setdefault(g, set()).update(r)
            groups.setdefault(g, d.group_desc.get(g, ""))
    out = []
    for g, desc in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])):
        default = _is_default(g, desc)
        mem = set(range(ds.world)) if default else listed.get(g) or members[g]
        s = _stuck_in(ds, g, desc, sorted(mem))
        if s is not None:
            s.listed = default or g in listed
            out.append(s)
    head: dict[int, tuple[str, int]] = {}  # rank → the first collective it issued and never saw complete
    for rank, dump in ds.dumps.items():
        open_ = [e for e in dump.entries if not e.is_p2p and e.state in ("scheduled", "started")]
        if open_:
            first = min(open_, key=lambda e: e.record_id)
            head[rank] = (first.group, first.seq)
    waiting = {r for s in out for r in s.arrived}
    for s in out:
        s.heads = sum(1 for a in s.arrived if head.get(a) == (s.group, s.seq))
        s.culprits = sorted(set(s.behind) - waiting)
        s.consequence = bool(s.behind) and not s.culprits and not s.mismatch and not s.no_dump
        if not s.listed and not s.behind and not s.mismatch:
            # a rank with no readable dump may be a member too: it is a stranger like an idle one
            others = (set(ds.dumps) | set(ds.unreadable) | set(ds.missing)) - set(s.members) - waiting
            s.strangers = sorted(others)
    # a collective whose only missing members have no dump, that none of its members really waits
    # in (each is queued behind another it issued first), while some other collective is where
    # ranks wait: blocked behind that one, not evidence against the ranks without a dump (a set
    # where only the ranks that saw the timeout dumped names 12 of 16 ranks missing otherwise)
    if any(s.heads for s in out):
        for s in out:
            if s.no_dump and not s.heads and not s.behind and not s.mismatch and s.arrived:
                s.consequence = True
    # the wavefront: where some rank is behind and waits nowhere, has no dump, or issued another
    # collective, a collective every member issued and none completed is blocked behind it (NCCL
    # runs a rank's collectives in order: its later ones never start) — that fault's consequence,
    # not a fault of its own (a real 16-rank MoE dump set gave 19 such incidents for one dead rank)
    if any((s.culprits or s.no_dump or s.mismatch or s.strangers) and not s.consequence for s in out):
        for s in out:
            if not (s.behind or s.no_dump or s.mismatch or s.strangers):
                s.consequence = True
    return out


def _collectives(entries: list[Entry], group: str) -> dict[int, Entry]:
    return {e.seq: e for e in entries if e.group == group and not e.is_p2p}


def _stuck_in(ds: DumpSet, g: str, desc: str, members: list[int]) -> StuckCollective | None:
    enq: dict[int, int] = {}
    comp: dict[int, int] = {}
    by_rank: dict[int, dict[int, Entry]] = {}
    for r in members:
        d = ds.dumps.get(r)
        if d is None:
            continue
        ent = by_rank[r] = _collectives(d.entries, g)
        st = d.status.get(g)
        enq[r] = st.last_enqueued if st is not None else max(ent, default=-1)
        if st is not None:
            comp[r] = st.last_completed
        elif any(e.state == "completed" for e in ent.values()):
            comp[r] = max((q for q, e in ent.items() if e.state == "completed"), default=-1)
    if not enq:
        return None
    frontier = max(enq.values())
    # a collective one member completed, every member reached: the group is past the highest
    # completion anyone reports (a gloo rank's own status can lag its finished barrier)
    if comp and max(comp.values()) < frontier:
        seq = max(max(comp.values()), 0) + 1
    elif not comp and min(enq.values()) < frontier:
        seq = max(min(enq.values()), 0) + 1
    else:
        return None
    arrived = sorted(r for r, q in enq.items() if q >= seq)
    behind = sorted(r for r, q in enq.items() if q < seq)
    no_dump = [r for r in members if r not in ds.dumps]
    at = [by_rank[r][seq] for r in arrived if seq in by_rank[r]]
    first = at[0] if at else None
    sigs = {r: by_rank[r][seq].signature for r in arrived if seq in by_rank[r]}
    mismatch: dict[int, tuple] = {}
    if len(set(sigs.values())) > 1:
        counts: dict[tuple, int] = {}
        for v in sigs.values():
            counts[v] = counts.get(v, 0) + 1
        common = max(counts, key=lambda v: counts[v])
        e_of = {r: by_rank[r][seq] for r in sigs}  # shown as issued, shapes included
        mismatch = {r: (e_of[r].op, e_of[r].input_sizes, e_of[r].input_dtypes) for r, v in sigs.items() if v != common}
        first = next(by_rank[r][seq] for r in arrived if seq in by_rank[r] and sigs[r] == common)
    last = {}
    for r in behind:
        if by_rank[r]:
            e = by_rank[r][max(by_rank[r])]
            last[r] = {"seq": e.seq, "op": e.op, "where": e.where()}
        else:
            last[r] = {"seq": enq[r], "op": "", "where": ""}
    return StuckCollective(g, desc, seq, first.op if first else "", first.input_sizes if first else (),
                           first.input_dtypes if first else (), members, arrived, behind, no_dump,
                           first.where() if first else "", last, mismatch,
                           stacks=_stacks(ds, [(r, by_rank[r].get(seq)) for r in arrived], behind))


def _in(e: Entry) -> str:
    return f"{e.op.split(':')[-1] or 'collective'} #{e.seq} of {e.group_desc or 'group ' + e.group}"


def _stacks(ds: DumpSet, waiting: list[tuple[int, Entry | None]], behind: list[int]) -> list[dict]:
    """Each distinct stack once with the ranks that share it: the never-joined ranks' latest
    collective on any group (the highest ``record_id``: the recorder numbers a process's entries in
    order), then the waiting ranks' entry of the stuck one. Bounded: ``MAX_STACKS`` per role (the
    most shared first), ``MAX_STACK_FRAMES`` frames, ``MAX_STACK_RANKS`` ranks named."""
    latest: list[tuple[int, Entry | None]] = []
    for r in behind:
        d = ds.dumps.get(r)
        latest.append((r, max(d.entries, key=lambda e: e.record_id) if d is not None and d.entries else None))
    out: list[dict] = []
    for role, pairs in (("never_joined", latest), ("waiting", waiting)):
        by_stack: dict[tuple, list[int]] = {}
        for r, e in pairs:
            if e is not None and e.frames:
                key = (_in(e), e.state if role == "never_joined" else "", e.stack(MAX_STACK_FRAMES))
                by_stack.setdefault(key, []).append(r)
        for (where, state, frames), ranks in sorted(by_stack.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))[
                :MAX_STACKS]:
            out.append({"role": role, "ranks": ranks[:MAX_STACK_RANKS], "n_ranks": len(ranks), "in": where,
                        **({"state": state} if state else {}), "frames": list(frames)})
    return out


def _name(s: StuckCollective) -> str:
    group = s.group_desc or f"group {s.group}"
    return f"{s.op.split(':')[-1] or 'collective'} #{s.seq} of {group}"


def _ranks(rs: list[int]) -> str:
    shown = ", ".join(map(str, rs[:8])) + (f" … (+{len(rs) - 8})" if len(rs) > 8 else "")
    return f"rank{'s' * (len(rs) > 1)} {shown}"


def _wait(rs: list[int]) -> str:
    return "wait" if len(rs) > 1 else "waits"


@dataclass
class _Verdict:
    stuck: StuckCollective
    culprits: list[int]
    state: State
    summary: str

    @property
    def direct(self) -> bool:
        """Every member it waits for is a culprit (no victim in between)."""
        return set(self.stuck.behind) <= set(self.culprits)


def _verdict(s: StuckCollective, ds: DumpSet) -> _Verdict:
    if s.mismatch:
        culprits = sorted(s.mismatch)
        return _Verdict(s, culprits, State.CONFIRMED, (
            f"{_ranks(culprits)} issued a different collective at {_name(s)}: "
            + "; ".join(f"rank {r}: {_show(v)}" for r, v in sorted(s.mismatch.items())[:4])
            + f" (the others: {_show((s.op, s.input_sizes, s.input_dtypes))}) — the job's code diverged on those ranks"))
    if s.culprits:
        last = s.last_of_behind.get(s.culprits[0], {})
        was = (f"; its last on the group was #{last['seq']} {last['op'].split(':')[-1]}"
               f"{' at ' + last['where'] if last.get('where') else ''}") if last.get("op") else ""
        return _Verdict(s, s.culprits, State.CONFIRMED, (
            f"{_ranks(s.culprits)} never joined {_name(s)} ([{_dims(s.input_sizes)}] {','.join(s.input_dtypes)}); "
            f"{_ranks(s.arrived)} {_wait(s.arrived)} in it{' at ' + s.waiting_at if s.waiting_at else ''}{was}"))
    absent = sorted(set(s.no_dump) | {r for r in s.strangers if r not in ds.dumps})
    idle = [r for r in s.strangers if r in ds.dumps]
    if absent or idle:
        said = []
        if absent:
            said.append(f"{_ranks(absent)} left no readable dump (killed, or stuck too hard to write one)")
        if idle:
            said.append(f"{_ranks(idle)} never used the group and {'are' if len(idle) > 1 else 'is'} waiting in no "
                        f"stuck collective")
        caveat = "" if s.listed else " — if members: gloo dumps do not list a group's ranks"
        return _Verdict(s, sorted(set(absent) | set(idle)), State.SUSPECTED, (
            f"{_ranks(s.arrived)} {_wait(s.arrived)} in {_name(s)}; {'; '.join(said)}{caveat}: suspected"))
    return _Verdict(s, [], State.SUSPECTED, (
        f"every member ({len(s.arrived)}) issued {_name(s)} and none completed it: the collective itself did not "
        f"finish (a link, or a peer's device), not a rank that never came"))


def hang_incidents(ds: DumpSet, stuck: list[StuckCollective] | None = None, step: int = -1) -> list[Incident]:
    """A ``hang`` incident per culprit set: the stuck collectives its ranks never joined (the most
    direct one leads), their consequences as evidence; a collective everyone joined is its own."""
    stuck = stuck_collectives(ds) if stuck is None else stuck
    grouped: dict[tuple, list[_Verdict]] = {}
    for s in stuck:
        if not s.consequence:
            v = _verdict(s, ds)
            key = (v.state, tuple(v.culprits)) if v.culprits and not s.mismatch else ("own", s.group, s.seq)
            grouped.setdefault(key, []).append(v)
    out: list[Incident] = []
    faults = _merged(list(grouped.values()))
    for same in faults:
        # rank 3 never joined its pair's all-reduce, where rank 2 waits; 0 and 1 wait for both in the
        # world's: the pair's says it without a victim in between
        v = max(same, key=lambda x: (x.direct, x.stuck.heads, len(x.stuck.arrived), -x.stuck.seq))
        s, others = v.stuck, [x.stuck for x in same if x is not v]
        waiting = set().union(*(x.arrived for x in [s, *others])) | set(v.culprits)
        ev: list[dict] = [{"level": Level.FLIGHT_RECORDER, "kind": EvidenceKind.STUCK_COLLECTIVE, **x.to_json()} for x in [s, *others]]
        ev += [{"level": Level.FLIGHT_RECORDER, "kind": EvidenceKind.CONSEQUENCE, **c.to_json()} for c in stuck
               if c.consequence and (set(c.behind) & waiting or not c.behind and _home(c, faults) is same)]
        ev += [{"level": Level.FLIGHT_RECORDER, "kind": EvidenceKind.UNREADABLE_DUMP, "rank": r, "why": why}
               for r, why in sorted(ds.unreadable.items()) if r in set(s.members) | set(v.culprits)]
        also = (f"; {', '.join(map(_name, others))} wait{'s' * (len(others) == 1)} for "
                f"{'it' if len(v.culprits) == 1 else 'them'} too") if others else ""
        out.append(Incident(IncidentClass.HANG, v.culprits, [], [], step, step, s.op, [], v.state, Severity.CRITICAL,
                            100.0, None, Action.CHECKPOINT_AND_RESTART, ev, [step] if step >= 0 else [],
                            v.summary + also))
    return out


def _merged(groups: list[list[_Verdict]]) -> list[list[_Verdict]]:
    """Verdict groups whose culprits overlap are one fault (rank 12 never joined one group's
    collective, ranks 12 and 13 another's): one incident, led by the most certain and the fewest
    culprits; a mismatch or a collective of its own stays apart."""
    def rank(vs: list[_Verdict]) -> tuple:
        v = vs[0]
        return (v.state != State.CONFIRMED, len(v.culprits), v.stuck.seq)

    kept: list[list[_Verdict]] = []
    for vs in sorted(groups, key=rank):
        culprits = set(vs[0].culprits)
        home = next((k for k in kept if culprits and not vs[0].stuck.mismatch and not k[0].stuck.mismatch
                     and culprits & set(k[0].culprits)), None)
        if home is None:
            kept.append(list(vs))
        else:
            home.extend(v for v in vs if v not in home)
    # the first verdict of each list leads: keep the lead's culprits for the merged ones
    for k in kept:
        lead = k[0]
        for v in k[1:]:
            v.culprits = lead.culprits
            v.state = lead.state
    return kept


def _home(c: StuckCollective, faults: list[list[_Verdict]]) -> list[_Verdict] | None:
    """Where a collective every member issued, blocked behind a fault elsewhere, is told: the
    fault whose culprits or waiting ranks share the most of its members (then the first)."""
    best, score = None, -1
    for vs in faults:
        ranks = set(vs[0].culprits).union(*(v.stuck.arrived for v in vs))
        n = len(ranks & set(c.members))
        if n > score:
            best, score = vs, n
    return best
