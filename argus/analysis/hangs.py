"""Hangs from the processors' live snapshots: who the others are waiting for.

Every host's processor writes a snapshot of its local ranks when no rank there progressed
for the hang threshold (``processor/hangs.py``): each rank's step, what its training thread
was doing, and per process group how many collectives it had started and completed. Joined
over hosts, the latest row per rank gives the job's state, and the culprits follow from the
counts, not from timing:

* a rank **behind** on a group — fewer collectives started there than a member that is
  waiting in one — never entered the collective the others wait in (a rank stuck before its
  backward, in a data loader, in an endless loop);
* a rank that **died** (its process gone) leaves the others waiting;
* a rank of the job that **no host reported** (its host or processor is gone) likewise;
* a rank whose process is **frozen** — stopped (``T``: SIGSTOP, a debugger) or in
  uninterruptible sleep (``D``: stuck in the kernel on storage or a driver) — while the others
  sleep in the collective holds it up even where its counts match theirs (its transport
  threads are frozen with it);
* when every member of the group is inside the same collective with the same count, no rank
  is missing or frozen: the collective itself does not complete (a dead link, a peer NIC) —
  reported as such, with no rank blamed.

The incident carries each culprit's activity, how long it has been at it, its main-thread
stack (py-spy, taken while it was stuck) and the stack of one waiting rank.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State, grade
from argus.store import FLIGHT_RECORDER_DIR, Attempt
from argus.topology import Topology
from argus.vocab import EvidenceKind, Level

#: process states of a rank that cannot be taking part in anything (``/proc/PID/stat``)
FROZEN = {"T": "stopped (T: SIGSTOP or a debugger)", "t": "stopped by a tracer (t)",
          "D": "in uninterruptible sleep (D: stuck in the kernel — storage or a driver)"}

log = logging.getLogger("argus.analysis")

__all__ = ["HangState", "hang_incident", "load_hang_state"]


@dataclass
class HangState:
    """The latest snapshot row of every rank a processor reported."""

    rows: dict[int, dict[str, Any]]
    stalled_s: float
    threshold_s: float
    detected_ns: int
    #: ranks an earlier row of this hang saw alive, running and waiting on the others: dead later,
    #: they were killed with the job (an operator's SIGTERM, the watchdog), not the hang's cause.
    #: A rank frozen in its collective (``T``, ``D``) also reads "waiting": it is not one of them
    waited_alive: frozenset[int] = frozenset()

    def groups_of(self, rank: int) -> dict[int, dict[str, Any]]:
        return {int(g["key"]): g for g in json.loads(self.rows[rank]["groups"] or "[]")}


def load_hang_state(attempt: Attempt) -> HangState | None:
    if "hangs" not in attempt.stats() or not attempt.files("hangs"):
        return None
    t = attempt.read("hangs")
    if t.num_rows == 0:
        return None
    rows: dict[int, dict[str, Any]] = {}
    every = sorted(t.to_pylist(), key=lambda r: r["detected_ns"])
    for row in every:
        rows[int(row["rank"])] = row  # the latest per rank
    latest = max(r["detected_ns"] for r in rows.values())
    threshold = max(r["threshold_s"] for r in rows.values())
    # rows of an earlier, resolved stall are not part of this one
    span_ns = 2 * threshold * 1e9 + 60e9
    rows = {k: r for k, r in rows.items() if latest - r["detected_ns"] <= span_ns}
    waited = frozenset(int(r["rank"]) for r in every if latest - r["detected_ns"] <= span_ns
                       and r["alive"] and r["waiting"] and str(r.get("proc_state") or "") not in FROZEN
                       and r is not rows.get(int(r["rank"])))
    return HangState(rows, max(r["stalled_s"] for r in rows.values()), threshold, latest, waited)


def _behind(state: HangState) -> tuple[set[int], dict[int, tuple[str, int]]]:
    """Ranks behind on a group whose other members wait; and, per group, (op, count) waited in.

    Behind is fewer collectives *started* on the group than the members waiting there: a rank
    that has not issued the collective the others wait in never joined it, whatever its own
    completed count says (a completion recorded late leaves ``issued > completed`` on a rank
    that is in no collective at all: the repro's rank 2 at 23 issued / 22 completed against 25
    everywhere else, blocked before its backward)."""
    members: dict[int, dict[int, dict]] = defaultdict(dict)  # group → rank → its slot
    for rank in state.rows:
        for key, g in state.groups_of(rank).items():
            members[key][rank] = g
    behind: set[int] = set()
    waited: dict[int, tuple[str, int]] = {}
    for key, slots in members.items():
        waiting = {r: g for r, g in slots.items() if g["issued"] > g["completed"]}
        if not waiting:
            continue
        top = max(g["issued"] for g in waiting.values())
        at_top = [g for g in waiting.values() if g["issued"] == top]
        waited[key] = (at_top[0]["op"], top)
        behind |= {r for r, g in slots.items() if g["issued"] < top}
    return behind, waited


def hang_incident(attempt: Attempt, topology: Topology) -> Incident | None:
    state = load_hang_state(attempt)
    if state is None:
        return None
    rows = state.rows
    world = topology.world_size
    if _resumed(attempt, state):
        # the job went on after the snapshot: a long stall (L2 names it), not a hang — unless the
        # snapshot caught the rank that held everyone up frozen, which no timing can tell
        return _frozen_stall(attempt, topology, state)
    behind, waited = _behind(state)
    # a rank behind on a group waits for nobody there, whatever its in-flight flag says
    waiting = sorted(r for r, row in rows.items() if row["waiting"] and r not in behind)
    if not waiting:
        return None  # nobody waits on anybody: a stall of this host, not a distributed hang
    dead = sorted(r for r, row in rows.items() if not row["alive"] and r not in state.waited_alive)
    reported = set(rows)
    missing = sorted(set(range(world)) - reported)
    culprits = sorted(set(dead) | behind)
    link = False
    if not culprits:
        not_waiting = sorted(reported - set(waiting))
        if not_waiting and len(not_waiting) < len(reported):
            culprits = not_waiting  # no counts to compare (a collective C++ started): the odd ones out
        elif missing:
            culprits = missing
        else:
            frozen = sorted(r for r, row in rows.items() if str(row.get("proc_state") or "") in FROZEN)
            if frozen and len(frozen) < len(rows):
                culprits = frozen
            else:
                link = True
    focus = [r for r in (culprits or waiting) if r in rows]
    step = int(min(rows[r]["step"] for r in focus)) if focus else -1
    ops = sorted({op for op, _ in waited.values() if op}) or sorted({rows[r]["op"] for r in waiting if rows[r]["op"]})
    evidence: list[dict[str, Any]] = [{
        "level": Level.L1, "kind": EvidenceKind.NO_PROGRESS, "stalled_s": round(state.stalled_s, 1),
        "threshold_s": round(state.threshold_s, 1), "ranks_reported": len(rows), "world": world}]
    evidence.append({"level": Level.L2, "kind": EvidenceKind.BLOCKED_IN_COLLECTIVES, "ranks": waiting[:64],
                     "collectives": [{"op": op, "started": n} for op, n in list(waited.values())[:8]]})
    for r in culprits[:8]:
        if r in rows:
            row = rows[r]
            kind = EvidenceKind.NEVER_JOINED if r not in dead else EvidenceKind.RANK_DIED
            evidence.append({"level": Level.L2, "kind": kind, "rank": r,
                             "host": row["host"], "step": row["step"], "activity": row["activity"],
                             "for_s": round(_for_s(row), 1), "op": row["op"], "issued": row["issued"],
                             "completed": row["completed"],
                             **({"proc_state": row["proc_state"]} if row.get("proc_state") else {})})
            if row["stack"]:
                evidence.append({"level": Level.L5, "kind": EvidenceKind.STACK, "rank": r, "frames": _leaf(row["stack"])})
    if missing:
        evidence.append({"level": Level.L2, "kind": EvidenceKind.NOT_REPORTED, "ranks": missing[:64],
                         "note": "no processor reported these ranks: their host or processor may be gone"})
    sample = next((r for r in waiting if rows[r]["stack"]), None)
    if sample is not None:
        evidence.append({"level": Level.L5, "kind": EvidenceKind.STACK, "rank": sample, "waiting": True,
                         "frames": _leaf(rows[sample]["stack"])})
    def host(r: int) -> str:  # the snapshot knows the host even before the topology is written
        known = str(topology.hosts[r]) if r < len(topology.hosts) else "unknown"
        return rows[r]["host"] if known == "unknown" and r in rows else known

    hosts = sorted({host(r) for r in culprits})
    gpus = [str(topology.gpu_uuids[r]) for r in culprits]
    what = ", ".join(ops[:3]) or "a collective"
    if link:
        summary = (f"job stalled at step {step} for {state.stalled_s:.0f} s: all {len(waiting)} ranks are inside "
                   f"{what} with the same count and no rank is missing — the collective itself does not complete "
                   "(a link or a peer's network), not a rank")
        phase = ops[0] if ops else ""
    else:
        first = rows.get(culprits[0]) if culprits else None
        doing = f" ({first['activity'] or 'outside any phase'} for {_for_s(first):.0f} s" + (
            f", {_leaf(first['stack']).split(';')[-1]}" if first and first["stack"] else "") + ")" if first else ""
        state_of = str(first.get("proc_state") or "") if first else ""
        if state_of in FROZEN:
            doing += f"; its process is {FROZEN[state_of]}"
        summary = (f"job stalled at step {step} for {state.stalled_s:.0f} s: {len(waiting)} rank"
                   f"{'s' * (len(waiting) > 1)} wait in {what}; rank{'s' * (len(culprits) > 1)} "
                   f"{', '.join(map(str, culprits[:8]))} never joined{doing}")
        phase = first["activity"] if first else ""
    fr = _flight_recorder(attempt, step)
    if fr is not None:
        evidence += [e for e in fr.evidence if e.get("level") == Level.FLIGHT_RECORDER]
        if link and fr.culprit_ranks:
            # the counts could not tell (every member issued as many), the rings' sequence numbers can
            culprits, link = list(fr.culprit_ranks), False
            hosts, gpus = sorted({host(r) for r in culprits}), [str(topology.gpu_uuids[r]) for r in culprits]
            summary = f"job stalled at step {step} for {state.stalled_s:.0f} s: the Flight Recorder: {fr.summary}"
        elif sorted(fr.culprit_ranks) == culprits:
            summary += "; the ranks' Flight Recorder rings, dumped live, agree"
        else:
            summary += f"; the ranks' Flight Recorder rings, dumped live: {fr.summary}"
    return Incident(IncidentClass.HANG, culprits, hosts, gpus, step, step, phase or "", [], State.CONFIRMED,
                    Severity.CRITICAL, 100.0, world * state.stalled_s / 3600.0, Action.CHECKPOINT_AND_RESTART,
                    evidence, [step], summary)


def _flight_recorder(attempt: Attempt, step: int) -> Incident | None:
    """The hang as the ranks' Flight Recorder rings tell it, where they were dumped live at the
    processor's request (``store.FLIGHT_RECORDER_DIR``; gloo records only with
    ``TORCH_FR_BUFFER_SIZE``, NCCL by default): the stuck collective whose members are behind."""
    directory = getattr(attempt, "path", None)
    if directory is None or not (directory / FLIGHT_RECORDER_DIR).is_dir():
        return None
    from argus.flight_recorder import FlightRecorderError, hang_incidents, read_dumps

    try:
        found = hang_incidents(read_dumps([directory / FLIGHT_RECORDER_DIR], prefix="rank"), step=step)
    except (FlightRecorderError, OSError, ValueError) as exc:
        log.info("flight recorder dumps of %s not read: %s", directory, exc)
        return None
    return max(found, key=lambda i: len(i.evidence), default=None)


def _frozen_stall(attempt: Attempt, topology: Topology, state: HangState) -> Incident | None:
    """A stall that ended, during which some ranks' processes were frozen (``FROZEN``) while the
    others waited in a collective. A rank stopped inside its collective looks exactly like its
    peers in every timing (the collective returns on all of them at once when it resumes); only
    its process state, read during the stall, names it."""
    rows = state.rows
    frozen = sorted(r for r, row in rows.items() if str(row.get("proc_state") or "") in FROZEN)
    waiting = sorted(r for r, row in rows.items() if row["waiting"] and r not in frozen)
    if not frozen or not waiting or len(frozen) == len(rows):
        return None
    span = attempt.sql("SELECT min(start_ns) AS a, max(end_ns) AS b FROM steps WHERE end_ns >= 0").to_pylist()[0]
    run_s = (span["b"] - span["a"]) / 1e9 if span["a"] is not None and span["b"] is not None else 0.0
    pct = 100.0 * state.stalled_s / max(run_s - state.stalled_s, 1e-9) if run_s > state.stalled_s else 100.0
    row = rows[frozen[0]]
    step = int(row["step"])
    evidence: list[dict[str, Any]] = [{
        "level": Level.L1, "kind": EvidenceKind.NO_PROGRESS, "stalled_s": round(state.stalled_s, 1),
        "threshold_s": round(state.threshold_s, 1), "ranks_reported": len(rows), "world": topology.world_size}]
    evidence.append({"level": Level.L2, "kind": EvidenceKind.BLOCKED_IN_COLLECTIVES, "ranks": waiting[:64], "collectives": [
        {"op": rows[r]["op"], "started": rows[r]["issued"]} for r in waiting[:1]]})
    for r in frozen[:8]:
        evidence.append({"level": Level.L2, "kind": EvidenceKind.NEVER_JOINED, "rank": r, "host": rows[r]["host"],
                         "step": rows[r]["step"], "activity": rows[r]["activity"], "for_s": round(_for_s(rows[r]), 1),
                         "op": rows[r]["op"], "issued": rows[r]["issued"], "completed": rows[r]["completed"],
                         "proc_state": rows[r]["proc_state"]})
    hosts = sorted({str(topology.hosts[r]) if r < len(topology.hosts) else rows[r]["host"] for r in frozen})
    summary = (f"rank{'s' * (len(frozen) > 1)} {', '.join(map(str, frozen[:8]))} on {', '.join(hosts)}: "
               f"{'its process was' if len(frozen) == 1 else 'their processes were'} {FROZEN[str(row['proc_state'])]} "
               f"for at least {state.stalled_s:.0f} s while {len(waiting)} rank{'s' * (len(waiting) > 1)} waited in "
               f"{rows[waiting[0]]['op'] or 'a collective'}; the job then went on")
    gpus = [str(topology.gpu_uuids[r]) for r in frozen if r < len(topology.gpu_uuids)]  # as for hosts: rows may
    return Incident(IncidentClass.HOST_STALL, frozen, hosts, gpus, step, step,  # precede the topology
                    str(row["activity"] or ""), [], State.CONFIRMED, grade(pct), pct, None,
                    Action.RAISE_TRACE_FIDELITY, evidence, [step], summary)


def _resumed(attempt: Attempt, state: HangState) -> bool:
    """Whether every rank of the snapshot finished a step after it was taken: the stall ended
    (a 31 s recompilation on a busy host crosses a 30 s threshold and then trains on)."""
    ranks = ",".join(str(int(r)) for r in state.rows)
    if not ranks:
        return False
    done = attempt.sql(f"SELECT rank, max(end_ns) AS e FROM steps WHERE end_ns >= 0 AND rank IN ({ranks}) "
                       "GROUP BY rank").to_pylist()
    last = {int(r["rank"]): int(r["e"]) for r in done if r["e"] is not None}
    return all(last.get(int(r), -1) > row["detected_ns"] for r, row in state.rows.items())


def _for_s(row: dict[str, Any] | None) -> float:
    if not row or not row["activity_since_ns"]:
        return 0.0
    return max((row["detected_ns"] - row["activity_since_ns"]) / 1e9, 0.0)


def _leaf(frames: str, depth: int = 4) -> str:
    return ";".join(frames.split(";")[-depth:]) if frames else ""

