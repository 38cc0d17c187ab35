"""The job's own words next to the verdict: ``argus run``'s ``logs`` table (argus/joblog).

* A rank that failed — an uncaught exception, a CUDA error, out of memory, an Xid, killed by a
  signal, exited with an error — stops the job: a ``fail_stop`` incident names it (confirmed:
  the process said so itself), unless a ``hang`` already covers it, which then carries the line.
  Ranks the launcher stopped afterwards (SIGTERM) and ranks whose collective timed out waiting
  for it are its victims, never its culprits.
* Other incidents carry the lines that bear on them: NCCL warnings, errors and failed connections
  on a link incident's hosts, DataLoader failures on a host-stall rank, timeouts on a hang.
* An Xid NVML reported on a rank's GPU (the processor's ``xid`` rows of the ``hw`` table) is the
  same event as a kernel-log Xid: where both saw it (same code, the same rank or, the line's pid
  unknown, its host, within ``XID_SAME_NS``) it counts once, and the line gets NVML's rank.
"""

from __future__ import annotations

import bisect
import re
from typing import Any, Callable

import pyarrow.compute as pc

from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State
from argus.analysis.remedies import hardware_failure
from argus.store import Attempt
from argus.topology import Topology
from argus.vocab import EvidenceKind, Level

__all__ = ["with_job_log", "correlate", "job_events", "load_log_events", "load_nvml_xids", "merge_xids",
           "XID_SAME_NS"]

_FAIL_STOP = ("exception", "cuda_error", "oom", "xid", "killed", "worker_failed")
#: failures a rank's own lines state (the launcher's exit-code report only says that it ended)
_SELF_STATED = ("exception", "cuda_error", "oom", "xid")
_RELEVANT = {
    IncidentClass.LINK_DEGRADATION: ("nccl_warn", "nccl_connect", "nccl_error", "watchdog_timeout", "peer_lost",
                                     "nic_down"),
    IncidentClass.HANG: ("desync", "fr_missing", "ras_behind", "watchdog_timeout", "peer_lost", "nccl_error", "nccl_connect", "nccl_warn",
                         *_FAIL_STOP),
    IncidentClass.HOST_STALL: ("dataloader", "oom"),
    IncidentClass.COMPUTE_STRAGGLER: ("xid", "cuda_error"),
}
MAX_SHOWN = 5
#: An NVML Xid and an Xid line this close in time are one event: NVML is polled every 5 s, the kernel
#: log every second, and both clocks are the host's
XID_SAME_NS = 30 * 10**9
_XID_CODE = re.compile(r"\bXid \([^)]*\): (\d+)")


def load_log_events(attempt: Attempt) -> list[dict[str, Any]]:
    """The events (not the ``other`` counts), in time order."""
    if not attempt.files("logs"):
        return []
    rows = attempt.read("logs", columns=["rank", "ts_ns", "host", "stream", "kind", "severity", "text"]).to_pylist()
    return sorted((r for r in rows if r["kind"] != "other"), key=lambda r: r["ts_ns"])


def load_nvml_xids(attempt: Attempt, topology: Topology) -> list[dict[str, Any]]:
    """NVML's Xid critical-error events (the ``hw`` table's ``xid`` rows) as job-log events of the
    rank using the GPU, stream ``nvml``; the scan reads only those rows."""
    if not attempt.files("hw"):
        return []
    t = attempt.read("hw", columns=["rank", "gpu_uuid", "ts_ns", "value"], filter=pc.field("metric") == "xid")
    out = []
    n = len(topology.hosts)
    for r, uuid, ts, v in zip(*(t.column(c).to_pylist() for c in ("rank", "gpu_uuid", "ts_ns", "value"))):
        if r is None or ts is None or v is None:
            continue
        r, code = int(r), int(v)
        gpu = uuid or (str(topology.gpu_uuids[r]) if 0 <= r < n else "?")
        out.append({"rank": r, "ts_ns": int(ts), "host": str(topology.hosts[r]) if 0 <= r < n else "",
                    "stream": "nvml", "kind": "xid", "severity": "error",
                    "text": f"Xid {code} on GPU {gpu} (NVML critical-error event)", "xid": code})
    return sorted(out, key=lambda e: e["ts_ns"])


def merge_xids(events: list[dict[str, Any]], nvml: list[dict[str, Any]],
               same_ns: int = XID_SAME_NS) -> list[dict[str, Any]]:
    """``events`` (the logs table's) with NVML's Xids added, each Xid counted once: an NVML Xid
    that a line already says (same code, same rank — or the line's rank unknown and its host the
    GPU's — within ``same_ns``) is that line, which then takes NVML's rank. Each line stands for
    one NVML event at most. Cost: a sort and a bisection per NVML event."""
    lines = sorted((e for e in events if e["kind"] == "xid"), key=lambda e: e["ts_ns"])
    times = [int(e["ts_ns"]) for e in lines]
    used: set[int] = set()
    extra = []
    for x in nvml:
        lo = bisect.bisect_left(times, x["ts_ns"] - same_ns)
        hi = bisect.bisect_right(times, x["ts_ns"] + same_ns)
        match = None
        for i in sorted(range(lo, hi), key=lambda i: abs(times[i] - x["ts_ns"])):
            e = lines[i]
            m = _XID_CODE.search(str(e.get("text") or ""))
            if i in used or (m is not None and int(m.group(1)) != x["xid"]):
                continue
            if e["rank"] == x["rank"] or (e["rank"] < 0 and e.get("host") == x["host"]):
                match = i
                break
        if match is None:
            extra.append(x)
            continue
        used.add(match)
        if lines[match]["rank"] < 0:
            lines[match]["rank"] = x["rank"]  # the driver's line named the bus; NVML names the GPU's rank
    return sorted([*events, *extra], key=lambda e: e["ts_ns"]) if extra else events


def job_events(attempt: Attempt, topology: Topology) -> list[dict[str, Any]]:
    """The job log's events and NVML's Xids, each once, in time order."""
    return merge_xids(load_log_events(attempt), load_nvml_xids(attempt, topology))


def _shown(e: dict[str, Any], step: int) -> dict[str, Any]:
    return {"rank": e["rank"], "host": e["host"], "kind": e["kind"], "text": e["text"], "ts_ns": e["ts_ns"],
            **({"step": step} if step >= 0 else {})}


def with_job_log(attempt: Attempt, topology: Topology, incidents: list[Incident],
                 step_of_ts: Callable[[int, int], int]) -> list[Incident]:
    return correlate(job_events(attempt, topology), topology, incidents, step_of_ts)


def correlate(events: list[dict[str, Any]], topology: Topology, incidents: list[Incident],
              step_of_ts: Callable[[int, int], int]) -> list[Incident]:
    """``incidents`` with the ``events`` (time order) that bear on them, and a ``fail_stop`` where
    a rank failed and no hang covers it."""
    if not events:
        return incidents

    def step(e: dict[str, Any]) -> int:
        return step_of_ts(int(e["rank"]), int(e["ts_ns"])) if e["rank"] >= 0 else -1

    for inc in incidents:
        kinds = _RELEVANT.get(inc.klass)
        if not kinds:
            continue
        mine = [e for e in events if e["kind"] in kinds and (e["rank"] in inc.culprit_ranks or e["host"] in inc.hosts
                                                             or inc.klass == IncidentClass.HANG)]
        if mine:
            # the kinds that say most first (a hang's watchdog line before a warning printed hours
            # earlier), shown in time order
            shown = sorted(sorted(mine, key=lambda e: (kinds.index(e["kind"]), e["ts_ns"]))[:MAX_SHOWN],
                           key=lambda e: e["ts_ns"])
            inc.evidence = [*inc.evidence, {"level": Level.LOG, "kind": EvidenceKind.LOG_LINES, "events": [
                _shown(e, step(e)) for e in shown], "total": len(mine)}]
    failed = [e for e in events if e["kind"] in _FAIL_STOP and e["rank"] >= 0]
    # a rank whose own last words are a lost peer ("Connection closed by peer") or a timeout
    # waiting (a watchdog's, gloo's) and that the launcher then reports failed (exit code 1) died
    # of another rank's failure — a victim, once some rank failed on its own account
    stated = {int(e["rank"]) for e in failed if e["kind"] in _SELF_STATED
              or (e["kind"] == "killed" and "SIGABRT" not in str(e["text"]))}
    lost = {int(e["rank"]) for e in events if e["kind"] in ("peer_lost", "watchdog_timeout") and e["rank"] >= 0}
    if stated:
        failed = [e for e in failed if int(e["rank"]) in stated or int(e["rank"]) not in lost]
    else:
        # SIGABRT is how NCCL's watchdog takes a process down after a collective timed out: ranks
        # aborted so are that timeout's victims, whichever the launcher saw first ("Root Cause")
        failed = [e for e in failed if not (e["kind"] == "killed" and "SIGABRT" in str(e["text"]))]
    _reported_hang(events, topology, incidents, failed, step)
    if not failed:
        _unranked_failure(events, incidents, step)
        _unnamed_hang(events, incidents, step)
        return incidents
    hang = next((i for i in incidents if i.klass == IncidentClass.HANG), None)
    first = failed[0]
    said = f"rank {first['rank']}: {first['text']}"
    if hang is not None:
        hang.summary += f"; the job's log: {said}"
        return incidents
    culprits = sorted({int(e["rank"]) for e in failed})
    ok = [r for r in culprits if 0 <= r < len(topology.hosts)]
    at = step(first)
    victims = sorted({int(e["rank"]) for e in events if e["kind"] in ("stopped", "watchdog_timeout", "peer_lost")
                      and e["rank"] >= 0} - set(culprits))
    summary = (f"{'rank' if len(culprits) == 1 else 'ranks'} {', '.join(map(str, culprits[:8]))} failed and stopped "
               f"the job — {said}"
               + (f"; ranks {', '.join(map(str, victims[:8]))} were stopped after it" if victims else ""))
    evidence = [{"level": Level.LOG, "kind": EvidenceKind.LOG_LINES, "events": [_shown(e, step(e)) for e in failed[:MAX_SHOWN]],
                 "total": len(failed)}]
    # the GPU's own word (an uncorrectable ECC error, an Xid): the host goes, not only the job restarts
    action = Action.CORDON_NODE if hardware_failure(evidence) else Action.CHECKPOINT_AND_RESTART
    incidents.append(Incident(IncidentClass.FAIL_STOP, culprits, sorted({str(topology.hosts[r]) for r in ok}),
                              [str(topology.gpu_uuids[r]) for r in ok], at, at, first["kind"], [], State.CONFIRMED,
                              Severity.CRITICAL, 100.0, None, action, evidence, [at] if at >= 0 else [], summary))
    return incidents


def _unranked_failure(events: list[dict[str, Any]], incidents: list[Incident],
                      step: Callable[[dict[str, Any]], int]) -> None:
    """A worker failed and the log gives it no global rank (torchrun's agent names a local rank;
    which node's, a merged log may not say): a fail-stop naming no rank, its words quoted — where
    no other incident tells the job's end."""
    if any(i.severity != Severity.INFO for i in incidents):
        return
    lost = [e for e in events if e["kind"] in _FAIL_STOP and e["rank"] < 0
            and not (e["kind"] == "killed" and "SIGABRT" in str(e["text"]))]
    if not lost:
        return
    first = lost[0]
    at = step(first)
    summary = (f"a worker failed and stopped the job — {first['text']}; the log gives it no global rank (a local "
               "rank is the node's: --node-rank and --nproc-per-node, or the job's [rankN] lines, would place it)")
    evidence = [{"level": Level.LOG, "kind": EvidenceKind.LOG_LINES, "events": [_shown(e, step(e)) for e in lost[:MAX_SHOWN]],
                 "total": len(lost)}]
    incidents.append(Incident(IncidentClass.FAIL_STOP, [], [], [], at, at, str(first["kind"]), [], State.SUSPECTED,
                              Severity.CRITICAL, 100.0, None, Action.CHECKPOINT_AND_RESTART, evidence,
                              [at] if at >= 0 else [], summary))


def _unnamed_hang(events: list[dict[str, Any]], incidents: list[Incident],
                  step: Callable[[dict[str, Any]], int]) -> None:
    """A collective timed out (a watchdog said so, or ranks were aborted for it) and nothing names
    the rank it waited for: a hang with no culprit, said so — not "no failure"."""
    if any(i.severity != Severity.INFO for i in incidents):
        return  # a fault already told: the timeout is most likely its consequence (one fault, one incident)
    said = [e for e in events if e["kind"] in ("watchdog_timeout", "desync")
            or (e["kind"] == "killed" and "SIGABRT" in str(e["text"]))]
    if not said:
        return
    ranks = sorted({int(e["rank"]) for e in said if e["rank"] >= 0 and e["kind"] != "desync"})
    at = step(said[0])
    who = f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks[:8]))}" if ranks else "a rank"
    summary = (f"a collective timed out ({who}: the watchdog's timeout or its abort) and the logs name no rank it "
               "waited for: the Flight Recorder dumps (argus ingest flight-recorder) or PyTorch's desync report "
               "(TORCH_NCCL_DESYNC_DEBUG=1) would")
    evidence = [{"level": Level.LOG, "kind": EvidenceKind.LOG_LINES, "events": [_shown(e, step(e)) for e in said[:MAX_SHOWN]],
                 "total": len(said)}]
    incidents.append(Incident(IncidentClass.HANG, [], [], [], at, at, "watchdog_timeout", [], State.SUSPECTED,
                              Severity.CRITICAL, 100.0, None, Action.CHECKPOINT_AND_RESTART, evidence,
                              [at] if at >= 0 else [], summary))


def _reported_hang(events: list[dict[str, Any]], topology: Topology, incidents: list[Incident], failed: list[dict[str, Any]],
            step: Callable[[dict[str, Any]], int]) -> None:
    """PyTorch's desync report names the ranks a collective timeout waited for, NCCL's RAS report
    the ranks behind on a communicator's count: they corroborate a hang that names them, and are
    the hang's incident where none was raised and no rank's own failure explains it (the
    watchdog's rank 0 only waited) — a RAS report only where two have the same ranks behind."""
    desync = [e for e in events if e["kind"] in ("desync", "fr_missing") and e["rank"] >= 0]
    # ranks a desync report lists as in the collective ("joined but didn't finish"): one rank of
    # many is the laggard; half the job or more is the collective itself not finishing (a link,
    # the network), no rank's — a real 16-rank report listed all 16 so
    inside = {int(e["rank"]) for e in desync if "joined but didn't finish" in str(e["text"])}
    world = max([int(e["rank"]) for e in events if e["rank"] >= 0] + [len(topology.hosts) - 1, 0]) + 1
    if len(inside) >= max(2, world / 2):
        desync = [e for e in desync if int(e["rank"]) not in inside]
    ras = [e for e in events if e["kind"] == "ras_behind" and e["rank"] >= 0]
    hang = next((i for i in incidents if i.klass == IncidentClass.HANG), None)
    if hang is not None:
        for said, by in (([e for e in desync if e["kind"] == "desync"], "PyTorch's desync report"),
                         ([e for e in desync if e["kind"] == "fr_missing"], "torchfrtrace"),
                         (ras, "NCCL's RAS report")):
            ranks = sorted({int(e["rank"]) for e in said})
            if not ranks:
                continue
            if set(hang.culprit_ranks) == set(ranks):
                hang.summary += f"; {by} names the same rank{'s' * (len(ranks) > 1)}"
            else:
                hang.summary += f"; {by} names rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks[:8]))}"
        return
    if not desync:
        # one RAS snapshot is no verdict (collectives outpace its query): the same ranks behind in
        # two reports are
        seen: dict[int, int] = {}
        for e in ras:
            seen[int(e["rank"])] = seen.get(int(e["rank"]), 0) + 1
        desync = [e for e in ras if seen[int(e["rank"])] >= 2]
        if not desync:
            return
    named = sorted({int(e["rank"]) for e in desync})
    if set(named) <= {int(e["rank"]) for e in failed}:
        return  # the ranks said themselves why they stopped: that fail-stop tells it
    first = desync[0]
    source = {"desync": "PyTorch's desync report", "fr_missing": "PyTorch's Flight Recorder analyzer"}.get(
        str(first["kind"]), "NCCL's RAS report, twice")
    ok = [r for r in named if 0 <= r < len(topology.hosts)]
    waited = sorted({int(e["rank"]) for e in events if e["kind"] == "watchdog_timeout" and e["rank"] >= 0} - set(named))
    at = step(first)
    summary = (f"{'rank' if len(named) == 1 else 'ranks'} {', '.join(map(str, named[:8]))} held up a collective: "
               f"{first['text'].split(': ', 1)[-1]}"
               + (f"; rank{'s' * (len(waited) > 1)} {', '.join(map(str, waited[:8]))} timed out waiting" if waited
                  else "")
               + f" ({source}; suspected until the dumps or the ranks' own state confirm it)")
    evidence = [{"level": Level.LOG, "kind": EvidenceKind.LOG_LINES, "events": [
        _shown(e, step(e)) for e in [*desync, *[e for e in events if e["kind"] == "watchdog_timeout"]][:MAX_SHOWN]],
        "total": len(desync)}]
    incidents.append(Incident(IncidentClass.HANG, named, sorted({str(topology.hosts[r]) for r in ok}),
                              [str(topology.gpu_uuids[r]) for r in ok], at, at, str(first["kind"]), [], State.SUSPECTED,
                              Severity.CRITICAL, 100.0, None, Action.CHECKPOINT_AND_RESTART, evidence,
                              [at] if at >= 0 else [], summary))
