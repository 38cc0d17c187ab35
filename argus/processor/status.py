"""The processor's status file: what it has done and how it is doing, one JSON per host.

``store/processors/<host>.json`` is rewritten (temp-then-rename) every ``status_interval_s``
and on every shutdown heartbeat. ``argus run`` reads it to name ranks by pid, to tell a slow
flush from a stuck processor and to report losses; ``argus drill`` and the overhead bench read
it too. :class:`ProcessorStatus` is its one schema: the daemon bumps typed counters, the
readers get typed fields (:func:`read_status`), and the keys written are those readers have
always read. Counters that most processors never bump are left out of the file while zero,
as they always were.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # the daemon's parts: readers of the file (argus run, drill) import none of them
    from argus.ingest import TsdbExporter
    from argus.processor.attempts import AttemptKey, AttemptState
    from argus.processor.config import ProcessorConfig
    from argus.processor.connection import Connection
    from argus.processor.samplers import Samplers
    from argus.tsdb.sink import Liveness

__all__ = ["FlushProgress", "ProcessorStatus", "STATUS_DIR", "liveness", "read_all_statuses", "read_status",
           "status_path"]

log = logging.getLogger("argus.processor")

STATUS_DIR = "processors"  # under the store root
_LAST_ACKS = 50  # ACKs the file keeps (the newest)


def status_path(store: str | Path, host: str) -> Path:
    """Where the processor of ``host`` writing ``store`` keeps its status file."""
    return Path(store) / STATUS_DIR / f"{host}.json"


@dataclass(slots=True)
class FlushProgress:
    """While stopping: windows still to write, and until when (wall clock) a bounded wait in
    which no window moves (the TSDB sinks' flush) may last."""

    windows_left: int = 0
    busy_until: float = 0.0


@dataclass(slots=True)
class ProcessorStatus:
    """Every key of the status file; the daemon owns one and bumps its counters."""

    started: float = 0.0  # wall clock
    pid: int = 0  # 0: not said (an older or partial file)
    host: str = ""
    socket: str = ""
    connections: int = 0  # accepted connections
    ranks_seen: int = 0  # HELLOs admitted
    frames: int = 0
    events: int = 0  # records ingested (socket and rings)
    garbage_frames: int = 0
    disconnects: int = 0
    windows_written: int = 0
    acked: list[dict[str, Any]] = field(default_factory=list)  # the last ACKs (window, steps, rows)
    write_errors: int = 0  # windows that could not be written (not acknowledged)
    dropped_clients: dict[str, int] = field(default_factory=dict)  # DropReason → connections dropped
    accept_errors: int = 0
    refused_attempts: dict[str, str] = field(default_factory=dict)  # "run/attempt" → why
    runs: list[str] = field(default_factory=list)  # every "run/attempt" its ranks wrote
    startup_cpu_s: float | None = None  # imports: paid once per host
    # -- counted when it happens (absent from the file while zero) --
    attempts_forgotten: int = 0
    remote_write_errors: int = 0
    acks_dropped: int = 0
    ring_errors: int = 0
    hang_check_errors: int = 0
    hang_snapshots: int = 0
    flight_recorder_asked: int = 0
    drops_before_hello: int = 0
    sampled_records: int = 0
    controls_sent: int = 0
    cpu_ops_cpu_timed: int = 0
    cpu_ops_wall_ns: int = 0
    cpu_ops_cpu_ns: int = 0
    producer_cpu_s: dict[str, float] = field(default_factory=dict)  # rank → its producer threads' CPU
    rank_pids: dict[str, int] = field(default_factory=dict)  # pid → rank (argus run's job log)
    stopping: FlushProgress | None = None  # only while flushing at shutdown
    # -- a snapshot taken at each write --
    cpu_s: float | None = None
    children_cpu_s: float | None = None  # py-spy
    updated: float | None = None
    open_windows: dict[str, list[int]] = field(default_factory=dict)
    buffered_events: int = 0
    pending_frame_bytes: int = 0
    open_connections: int = 0
    samplers: dict[str, Any] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    remote_write: list[dict[str, Any]] | None = None  # per TSDB sink, when there are any

    def count_drop(self, reason: str) -> int:
        """One more client dropped for ``reason``; how many so far."""
        n = self.dropped_clients[reason] = self.dropped_clients.get(reason, 0) + 1
        return n

    def note_ack(self, ack: dict[str, Any]) -> None:
        self.windows_written += 1
        self.acked = (self.acked + [ack])[-_LAST_ACKS:]

    def note_run(self, key: str, limit: int) -> None:
        if key not in self.runs and len(self.runs) < limit:
            self.runs.append(key)

    def take_snapshot(self, config: ProcessorConfig, attempts: Mapping[AttemptKey, AttemptState],
                      conns: list[Connection], pending_frame_bytes: int, samplers: Samplers,
                      tsdb: TsdbExporter | None) -> None:
        """The fields taken at each write: the process's CPU (and py-spy's, its children's),
        the windows still open, what is held in memory, the samplers' and sinks' figures."""
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu_s = round(own.ru_utime + own.ru_stime, 3)
        self.children_cpu_s = round(children.ru_utime + children.ru_stime, 3)  # py-spy
        self.updated = time.time()
        self.open_windows = {f"{k[0]}/{k[1]}": sorted(st.assembler.windows) for k, st in attempts.items()}
        self.buffered_events = sum(st.assembler.buffered_events for st in attempts.values())
        self.pending_frame_bytes = pending_frame_bytes
        self.open_connections = len(conns)
        self.samplers = samplers.status()
        self.config = {k: str(v) for k, v in asdict(config).items()}
        if tsdb is not None:
            self.remote_write = tsdb.stats()

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for name in _ABSENT_WHILE_ZERO:
            if not doc[name]:
                del doc[name]
        for name in ("stopping", "remote_write", "startup_cpu_s", "cpu_s", "children_cpu_s", "updated"):
            if doc[name] is None:
                del doc[name]
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> ProcessorStatus:
        """The status in ``doc``: keys it lacks take their defaults, keys this version does not
        know (a newer processor's) are skipped, so a reader never fails on a status it can use."""
        if not isinstance(doc, dict):
            raise TypeError(f"a processor status is a JSON object, not {type(doc).__name__}")
        values = {k: v for k, v in doc.items() if k in _FIELDS}
        if isinstance(values.get("stopping"), dict):
            values["stopping"] = FlushProgress(**values["stopping"])
        return cls(**values)

    def write(self, path: Path) -> None:
        """Write the file (temp-then-rename, not fsynced: the next write replaces it anyway)."""
        from argus.store.files import write_bytes_atomic

        try:
            write_bytes_atomic(path, json.dumps(self.to_json(), indent=1).encode(), durable=False)
        except OSError as exc:
            log.warning("cannot write status file %s: %s", path, exc)


_FIELDS = {f.name for f in fields(ProcessorStatus)}
_ABSENT_WHILE_ZERO = ("attempts_forgotten", "remote_write_errors", "acks_dropped", "ring_errors", "hang_check_errors",
                      "hang_snapshots", "flight_recorder_asked", "drops_before_hello", "sampled_records",
                      "controls_sent", "cpu_ops_cpu_timed", "cpu_ops_wall_ns", "cpu_ops_cpu_ns", "producer_cpu_s",
                      "rank_pids")


def liveness(host: str, conns: Iterable[Connection], attempts: Mapping[AttemptKey, AttemptState],
             last_step_wall: Mapping[AttemptKey, float], last_window_wall: float) -> Liveness:
    """The snapshot the TSDB sinks' heartbeats send (built on the loop's thread, read by the
    sinks' threads): per attempt served, its ranks connected and its last step's wall time."""
    from argus.tsdb.sink import Liveness

    connected: dict[AttemptKey, int] = {}
    for conn in conns:
        if conn.info is not None and conn.attempt_key is not None:
            connected[conn.attempt_key] = connected.get(conn.attempt_key, 0) + 1
    runs = tuple((run, attempt, connected.get((run, attempt), 0), last_step_wall.get((run, attempt), 0.0))
                 for run, attempt in sorted(set(attempts) | set(connected)))
    return Liveness(host, runs, sum(st.in_flight for st in attempts.values()), last_window_wall)


def read_status(store: str | Path, host: str) -> ProcessorStatus | None:
    """The last status the processor of ``host`` wrote into ``store`` (None: none, or not readable)."""
    try:
        return ProcessorStatus.from_json(json.loads(status_path(store, host).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def read_all_statuses(store: str | Path) -> list[ProcessorStatus]:
    """The status of every host's processor that wrote ``store``, by host name (unreadable
    files raise: the benchmark that asks wants to know)."""
    return [ProcessorStatus.from_json(json.loads(p.read_text()))
            for p in sorted(status_path(store, "*").parent.glob("*.json"))]
