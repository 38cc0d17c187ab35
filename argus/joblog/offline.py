"""A finished job's logs, read after the fact (``argus ingest log``): the same scanner as ``argus run``
uses live, over files or stdin, then one verdict with the Flight Recorder dumps where there are any.

Launchers label lines differently, and a rank is only what a line's own evidence says it is:

* torchrun tees ``[default3]:`` — a *local* rank, global only where the log's launch says where
  the node sits (``--node-rank``/``--nproc-per-node`` given here, or one node);
* ``srun --label`` prefixes ``12: `` — the Slurm task: the global rank when each task is a rank,
  the node when each task is a torchrun (its lines then carry torchrun's own prefix);
* ``[rank12]:``, ``Rank 12`` in a process group's line, torchrun's failure report, PyTorch's
  desync report — the scanner's (``scanner.py``);
* ``kubectl logs --prefix --timestamps`` output: the pod prefix and the time stamp are taken off
  first (a pod is no rank by itself).

Events are ordered by their place in the input (line numbers stand in for a clock: a log's own
time stamps come in a dozen formats, or none); nothing is dated to a step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterable

import numpy as np

from argus.joblog.scanner import MAX_LINE, LogEvent, LogScanner

__all__ = ["LogRead", "read_logs", "log_incidents", "SRUN_SHARE"]

_SRUN = re.compile(rb"^\s{0,6}(\d{1,6}): ")
# kubectl logs --prefix / --timestamps: "[pod/job-worker-3/pytorch] " and "2026-12-06T09:00:00.123456789Z "
_K8S_POD = re.compile(rb"^\[pod/([^/\]\s]{1,253})/[^\]\s]{1,253}\] ")
_K8S_TIME = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) ")
_TORCHRUN_TEE = re.compile(rb"^\[[A-Za-z_][\w-]{0,31}?\d+\]:")
#: A file is srun-labelled when this share of its first non-empty lines carry ``N: ``.
SRUN_SHARE = 0.8
_SNIFF_LINES = 200
_CHUNK = 1 << 16


@dataclass
class LogRead:
    events: list[dict[str, Any]] = field(default_factory=list)  # the correlate format, input order
    lines: int = 0
    other: int = 0  # lines no signature matched (counted, never kept)
    dropped: int = 0  # events past the scanner's bound
    srun_labelled: list[str] = field(default_factory=list)  # the sources read as srun --label output


def _srun_labelled(head: bytes) -> bool:
    lines = [ln for ln in head.splitlines()[:_SNIFF_LINES] if ln.strip()]
    return bool(lines) and sum(1 for ln in lines if _SRUN.match(ln)) >= SRUN_SHARE * len(lines)


def read_logs(sources: Iterable[tuple[str, BinaryIO]], local_offset: int | None = None,
              nproc_per_node: int | None = None) -> LogRead:
    """Scan each ``(name, binary stream)``; ``local_offset``: the global rank of local rank 0 where
    the whole input is one node's; ``nproc_per_node``: ranks per node, which maps torchrun's local
    ranks on srun-labelled nodes to global ones."""
    out = LogRead()
    tick = [0]

    def clock() -> int:
        tick[0] += 1
        return tick[0]

    for name, stream in sources:
        _read_one(name, stream, out, clock, local_offset, nproc_per_node)
    out.events.sort(key=lambda e: e["ts_ns"])
    return out


class _Nodes:
    """One scanner per srun node label (each node's local ranks and tracebacks are its own);
    -1: lines without one."""

    def __init__(self, clock, local_offset: int | None, nproc_per_node: int | None):
        self.clock, self.local_offset, self.nproc = clock, local_offset, nproc_per_node
        self.scanners: dict[int, LogScanner] = {}

    def __call__(self, node: int) -> LogScanner:
        if node not in self.scanners:
            offset = self.local_offset if node < 0 else (node * self.nproc if self.nproc else None)
            self.scanners[node] = LogScanner(clock=self.clock, local_offset=offset)
        return self.scanners[node]


def _read_one(name: str, stream: BinaryIO, out: LogRead, clock, local_offset: int | None,
              nproc_per_node: int | None) -> None:
    head = stream.read(_CHUNK)
    srun = _srun_labelled(head)
    if srun:
        out.srun_labelled.append(name)
    nodes = _Nodes(clock, local_offset, nproc_per_node)
    rest = b""
    data = head
    while data:
        lines = (rest + data).split(b"\n")
        rest = lines.pop()[:MAX_LINE]  # a line without an end is scanned by its first MAX_LINE bytes
        for raw in lines:
            _feed(raw, srun, nodes, out)
        data = stream.read(_CHUNK)
    if rest:
        _feed(rest, srun, nodes, out)
    for node, s in sorted(nodes.scanners.items()):
        s.close()
        events, other = s.take()
        out.events += [_event(e, node) for e in events]
        out.other += sum(other.values())
        out.dropped += s.dropped


def _feed(raw: bytes, srun: bool, scanner: _Nodes, out: LogRead) -> None:
    out.lines += 1
    node = -1
    pod = _K8S_POD.match(raw)
    if pod:
        raw = raw[pod.end():]
    stamp = _K8S_TIME.match(raw)
    if stamp:
        raw = raw[stamp.end():]
    if srun:
        m = _SRUN.match(raw)
        if m:
            task, raw = int(m.group(1)), raw[m.end():]
            if _TORCHRUN_TEE.match(raw):
                node = task  # a torchrun per task: the label is its node, the tee its local rank
            else:
                raw = b"[rank%d]:" % task + raw  # a rank per task
    scanner(node).feed("log", raw + b"\n")


def _event(e: LogEvent, node: int) -> dict[str, Any]:
    return {"rank": e.rank, "ts_ns": e.ts_ns, "host": f"srun node {node}" if node >= 0 else "",
            "stream": e.stream, "kind": str(e.kind), "severity": e.severity, "text": e.text}


def log_incidents(read: LogRead, dumps: list[Path] | None = None, world: int | None = None,
                  topology=None, start: list | None = None) -> tuple[list, Any]:
    """One verdict from the logs (and the Flight Recorder dumps): the dumps' hang incidents, then
    the log's lines on them, a fail-stop where a rank said it failed, the desync report's hang
    where nothing else named one; ``start``: incidents already known (the dumps a store keeps).
    Returns ``(incidents, dump set or None)``; without a ``topology`` (no store), hosts and GPUs
    are unknown."""
    from argus.analysis.job_log import correlate
    from argus.flight_recorder import hang_incidents, read_dumps
    from argus.topology import Topology, parse_layout

    ds = read_dumps(dumps, world=world) if dumps else None
    incidents = [*(start or []), *(hang_incidents(ds) if ds is not None else [])]
    if topology is None:
        seen = [e["rank"] for e in read.events if e["rank"] >= 0]
        n = max([world or 0, ds.world if ds is not None else 0, max(seen, default=-1) + 1, 1])
        unknown = np.array(["unknown"] * n)
        topology = Topology(parse_layout(f"dp={n}"), unknown, np.zeros(n, np.int64), unknown)
    events = [e for e in read.events if e["rank"] < topology.world_size]
    incidents = correlate(events, topology, incidents, lambda rank, ts: -1)
    for inc in incidents:
        inc.hosts = [h for h in inc.hosts if h != "unknown"]
        inc.gpus = [g for g in inc.gpus if g != "unknown"]
    return incidents, ds
