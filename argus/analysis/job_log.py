"""The job's own words next to the verdict: ``argus run``'s ``logs`` table (argus/joblog).

* A rank that failed — an uncaught exception, a CUDA error, out of memory, an Xid, killed by a
  signal, exited with an error — stops the job: a ``fail_stop`` incident names it (confirmed:
  the process said so itself), unless a ``hang`` already covers it, which then carries the line.
  Ranks the launcher stopped afterwards (SIGTERM) and ranks whose collective timed out waiting
  for it are its victims, never its culprits.
* Other incidents carry the lines that bear on them: NCCL warnings and errors on a link
  incident's hosts, DataLoader failures on a host-stall rank, timeouts on a hang.
"""

from __future__ import annotations

from typing import Any, Callable

from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State
from argus.store import Attempt
from argus.topology import Topology

__all__ = ["with_job_log", "load_log_events"]

_FAIL_STOP = ("exception", "cuda_error", "oom", "xid", "killed", "worker_failed")
_RELEVANT = {
    IncidentClass.LINK_DEGRADATION: ("nccl_warn", "nccl_error", "watchdog_timeout", "peer_lost", "nic_down"),
    IncidentClass.HANG: ("watchdog_timeout", "peer_lost", "nccl_error", "nccl_warn", *_FAIL_STOP),
    IncidentClass.HOST_STALL: ("dataloader", "oom"),
    IncidentClass.COMPUTE_STRAGGLER: ("xid", "cuda_error"),
}
MAX_SHOWN = 5


def load_log_events(attempt: Attempt) -> list[dict[str, Any]]:
    """The events (not the ``other`` counts), in time order."""
    if not attempt.files("logs"):
        return []
    rows = attempt.read("logs", columns=["rank", "ts_ns", "host", "stream", "kind", "severity", "text"]).to_pylist()
    return sorted((r for r in rows if r["kind"] != "other"), key=lambda r: r["ts_ns"])


def _shown(e: dict[str, Any], step: int) -> dict[str, Any]:
    return {"rank": e["rank"], "host": e["host"], "kind": e["kind"], "text": e["text"], "ts_ns": e["ts_ns"],
            **({"step": step} if step >= 0 else {})}


def with_job_log(attempt: Attempt, topology: Topology, incidents: list[Incident],
                 step_of_ts: Callable[[int, int], int]) -> list[Incident]:
    events = load_log_events(attempt)
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
            inc.evidence = [*inc.evidence, {"level": "log", "kind": "log_lines", "events": [
                _shown(e, step(e)) for e in mine[:MAX_SHOWN]], "total": len(mine)}]
    failed = [e for e in events if e["kind"] in _FAIL_STOP and e["rank"] >= 0]
    if not failed:
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
    evidence = [{"level": "log", "kind": "log_lines", "events": [_shown(e, step(e)) for e in failed[:MAX_SHOWN]],
                 "total": len(failed)}]
    incidents.append(Incident(IncidentClass.FAIL_STOP, culprits, sorted({str(topology.hosts[r]) for r in ok}),
                              [str(topology.gpu_uuids[r]) for r in ok], at, at, first["kind"], [], State.CONFIRMED,
                              Severity.CRITICAL, 100.0, None, Action.CHECKPOINT_AND_RESTART, evidence,
                              [at] if at >= 0 else [], summary))
    return incidents
