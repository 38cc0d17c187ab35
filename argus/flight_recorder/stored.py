"""Flight Recorder dumps kept in a store: one hang verdict with what else the store holds.

``argus ingest flight-recorder --store S`` keeps the dumps it read in the attempt
(``INGESTED_FLIGHT_RECORDER_DIR``: ``rank<N>`` as read, ``set.json`` with the world size), so
that every later diagnosis of ``S`` reads the same stuck collectives into its own hang instead of
standing beside it as a second incident: a live hang the processor saw takes the dumps' evidence
(and their culprits where its counts could not tell), and without one the dumps' hang is the
diagnosis' — where the job log's lines (a desync report, a watchdog timeout) then join it."""

from __future__ import annotations

import json
import logging
import shutil

from argus.analysis.incident import Incident, IncidentClass
from argus.flight_recorder.dumps import DumpSet, read_dumps
from argus.flight_recorder.plain import FlightRecorderError
from argus.flight_recorder.stuck import hang_incidents
from argus.store import INGESTED_FLIGHT_RECORDER_DIR, Attempt
from argus.topology import Topology
from argus.vocab import Level

__all__ = ["keep_dumps", "with_kept_dumps", "hang_step"]

log = logging.getLogger("argus.flight_recorder")


def hang_step(attempt: Attempt) -> int:
    """The step no rank finished (the one a hang stopped), -1 without steps."""
    done = attempt.sql("SELECT max(step) AS s FROM steps WHERE end_ns > 0").column("s")[0].as_py()
    return -1 if done is None else int(done) + 1


def keep_dumps(attempt: Attempt, ds: DumpSet) -> int:
    """Copy the readable dumps of ``ds`` into the attempt (replacing earlier ones); how many."""
    root = attempt.path / INGESTED_FLIGHT_RECORDER_DIR
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for rank, d in sorted(ds.dumps.items()):
        shutil.copyfile(d.path, root / f"rank{rank}")
    (root / "set.json").write_text(json.dumps({"world": ds.world, "unreadable": {
        str(r): why for r, why in sorted(ds.unreadable.items())}}))
    return len(ds.dumps)


def _kept(attempt: Attempt) -> DumpSet | None:
    root = getattr(attempt, "path", None)
    root = None if root is None else root / INGESTED_FLIGHT_RECORDER_DIR
    if root is None or not root.is_dir():
        return None
    try:
        meta = json.loads((root / "set.json").read_text())
        ds = read_dumps([root], prefix="rank", world=int(meta.get("world") or 0) or None)
        for r, why in (meta.get("unreadable") or {}).items():
            ds.unreadable.setdefault(int(r), str(why))
        return ds
    except (FlightRecorderError, OSError, ValueError, TypeError) as exc:
        log.info("kept flight recorder dumps of %s not read: %s", attempt.path, exc)
        return None


def with_kept_dumps(attempt: Attempt, topology: Topology, incidents: list[Incident]) -> list[Incident]:
    """``incidents`` with the kept dumps' verdict: folded into a hang already there, else added."""
    ds = _kept(attempt)
    if ds is None:
        return incidents
    found = hang_incidents(ds, step=hang_step(attempt))
    if not found:
        return incidents
    n = topology.world_size
    for inc in found:
        inside = [r for r in inc.culprit_ranks if 0 <= r < n]
        inc.hosts = sorted({str(topology.hosts[r]) for r in inside})
        inc.gpus = [str(topology.gpu_uuids[r]) for r in inside]
    live = next((i for i in incidents if i.klass == IncidentClass.HANG), None)
    if live is None:
        return [*incidents, *found]
    fr = max(found, key=lambda i: len(i.evidence))
    have = {id(e) for e in live.evidence}
    live.evidence = [*live.evidence, *[e for e in fr.evidence if e.get("level") == Level.FLIGHT_RECORDER
                                       and id(e) not in have]]
    if sorted(fr.culprit_ranks) == sorted(live.culprit_ranks):
        live.summary += "; the Flight Recorder dumps agree"
    else:
        live.summary += f"; the Flight Recorder dumps: {fr.summary}"
    return incidents
