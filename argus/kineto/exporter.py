"""``argus export kineto``: a store → per-rank Kineto Chrome-trace JSON (``DIR/rank<N>.json``).

The files are what PyTorch Profiler would have written, to the extent the store knows it, so the
tools people already use open them: Perfetto and TensorBoard for timelines, Holistic Trace Analysis
(HTA) for its cross-rank analyses. What each store record becomes:

* ``steps`` → ``ProfilerStep#N`` ``user_annotation`` spans on the CPU thread;
* ``phases`` → ``user_annotation`` spans (CPU), and for device work (``compute``/``comm`` on GPU
  ranks) a ``gpu_user_annotation`` twin with the same ``External id`` on the device's stream;
* raw ``kernels`` → ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events with ``args.stream``,
  ``device`` and ``correlation``, each with the ``cudaLaunchKernel`` (``cudaMemcpyAsync``…)
  ``cuda_runtime`` event that launched it, just before it inside its step — HTA assigns kernels to
  iterations through that launch and drops kernels without one.

HTA's quirks, handled here: it finds a file's rank with the regex ``"rank":\\s+(\\d+)`` on the first
matching line, so ``distributedInfo`` is written first with a space after the colon; it reads every
``.json``/``.gz`` in the directory as a rank, so the output directory must start empty. HTA ≤ 0.5
counts only ``ncclKernel*`` names as communication (upstream issue #360); ``hta_compat`` renames
``ncclDevKernel_*`` to ``ncclKernel_*`` for it, otherwise names are exported as stored.

Timestamps are µs with three decimals relative to ``baseTimeNanoseconds`` (one base for every rank),
so nanoseconds survive the trip exactly. Cost: ≈1–2 µs of Python per event; memory: one rank's
events at a time (kernels are read in batches of ranks).
"""

from __future__ import annotations

import gzip as _gzip
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from argus.errors import StoreError
from argus.kineto.format import ARGUS_ARG, KERNEL_CATEGORY, LAUNCH
from argus.kineto.names import phase_name
from argus.store import Attempt, Store
from argus.store.files import write_bytes_atomic

__all__ = ["ExportResult", "export_kineto"]

_CPU_PID_BASE = 100_000  # CPU process ids (GPU "processes" are device indices, as in Kineto)
_OPS_TID_BASE = 1_000_000  # threads for CPU-only op records (kind ``cpu_op``), one per stream
_DEFAULT_STREAM = 7
_KERNEL_ROWS_PER_READ = 4_000_000
_LAUNCH_LEAD_NS = 2_000  # a launch is written this long before its kernel (clamped into the step)


@dataclass
class ExportResult:
    out: Path
    files: list[Path] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    events: int = 0
    steps: int = 0
    phases: int = 0
    kernels: int = 0
    bytes_written: int = 0
    warnings: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def _prepare_out(out: Path) -> None:
    if out.exists():
        if not out.is_dir():
            raise StoreError(f"{out}: exists and is not a directory")
        if any(out.iterdir()):
            raise StoreError(f"{out}: directory is not empty; trace tools (HTA) read every JSON file in it as a "
                             "rank, so export into a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)


def _us(ns: np.ndarray) -> list[str]:
    """Non-negative integer ns → exact µs strings with three decimals."""
    q, r = np.divmod(np.asarray(ns, np.int64), 1000)
    return [f"{a}.{b:03d}" for a, b in zip(q.tolist(), r.tolist())]


def _split(table: pa.Table) -> dict[int, pa.Table]:
    """One table per rank (one sort)."""
    if table.num_rows == 0:
        return {}
    ranks = table.column("rank").to_numpy()
    order = np.argsort(ranks, kind="stable")
    table = table.take(pa.array(order))
    r = ranks[order]
    uniq, first = np.unique(r, return_index=True)
    bounds = list(first) + [len(r)]
    return {int(u): table.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])) for i, u in enumerate(uniq)}


def _np(table: pa.Table, col: str) -> np.ndarray:
    return table.column(col).to_numpy(zero_copy_only=False)


def _dominant(values: np.ndarray, default: int) -> int:
    if values.size == 0:
        return default
    uniq, counts = np.unique(values, return_counts=True)
    return int(uniq[np.argmax(counts)])


class _RankWriter:
    """Builds one rank's event lines."""

    def __init__(self, rank: int, base_ns: int, hta_compat: bool, gpu: bool, device: int):
        self.rank = rank
        self.base = base_ns
        self.hta_compat = hta_compat
        self.gpu = gpu
        self.device = device
        self.pid = _CPU_PID_BASE + rank
        self.lines: list[str] = []
        self.next_id = 1
        self._names: dict[str, str] = {}
        self.streams: set[tuple[int, int]] = set()
        self.ops_streams: set[int] = set()

    def name(self, raw: str) -> str:
        js = self._names.get(raw)
        if js is None:
            shown = raw
            if self.hta_compat and raw.startswith("ncclDevKernel_"):
                shown = "ncclKernel_" + raw[len("ncclDevKernel_"):]
            js = self._names[raw] = json.dumps(shown)
        return js

    def ids(self, n: int) -> list[int]:
        first = self.next_id
        self.next_id += n
        return list(range(first, first + n))

    def steps(self, t: pa.Table, last_end: dict[int, int]) -> None:
        step, start, end = _np(t, "step"), _np(t, "start_ns"), _np(t, "end_ns")
        unfinished = end < 0
        fallback = np.array([last_end.get(int(s), int(b)) for s, b in zip(step, start)], np.int64)
        end = np.where(unfinished, np.maximum(fallback, start), end)
        ts, dur = _us(start - self.base), _us(end - start)
        for s, a, d, e, u in zip(step.tolist(), ts, dur, self.ids(len(step)), unfinished.tolist()):
            extra = f', "{ARGUS_ARG}": {{"unfinished": true}}' if u else ""
            self.lines.append(
                f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", "pid": {self.pid}, '
                f'"tid": {self.pid}, "ts": {a}, "dur": {d}, "args": {{"External id": {e}{extra}}}}}')

    def phases(self, t: pa.Table, step_end: dict[int, int], streams: dict[str, int],
               pgs: dict[str, dict] | None = None) -> None:
        """``pgs``: group kind → this rank's ``pg_config`` entry; a collective of that kind is
        preceded by the ``record_param_comms`` op PyTorch records, naming its process group."""
        name, cat, group = (t.column(c).to_pylist() for c in ("name", "category", "group_kind"))
        mb, step = _np(t, "microbatch"), _np(t, "step")
        start, dur = _np(t, "start_ns"), _np(t, "dur_ns")
        unfinished = dur < 0
        ends = np.array([step_end.get(int(s), -1) for s in step], np.int64)
        dur = np.where(unfinished, np.maximum(ends - start, 0), dur)
        ts, ds_ = _us(start - self.base), _us(dur)
        for i, e in enumerate(self.ids(len(name))):
            n, m = name[i], int(mb[i])
            shown = n if m < 0 or phase_name(n).microbatch == m else f"{n}-mb{m}"
            meta = {"name": n, "category": cat[i], "group_kind": group[i], "microbatch": m}
            if unfinished[i]:
                meta["unfinished"] = True
            args = f'{{"External id": {e}, "{ARGUS_ARG}": {json.dumps(meta)}}}'
            pg = pgs.get(group[i]) if pgs and cat[i] == "comm" else None
            if pg is not None:
                self.lines.append(
                    f'{{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": {self.pid}, '
                    f'"tid": {self.pid}, "ts": {ts[i]}, "dur": 0.000, "args": {{"Process Group Name": '
                    f'{json.dumps(pg["pg_name"])}, "Process Group Description": {json.dumps(pg["pg_desc"])}, '
                    f'"Process Group Ranks": {json.dumps(json.dumps(pg["ranks"]))}}}}}')
            self.lines.append(f'{{"ph": "X", "cat": "user_annotation", "name": {json.dumps(shown)}, '
                              f'"pid": {self.pid}, "tid": {self.pid}, "ts": {ts[i]}, "dur": {ds_[i]}, "args": {args}}}')
            if self.gpu and cat[i] in ("compute", "comm"):
                stream = streams[cat[i]]
                self.streams.add((self.device, stream))
                self.lines.append(f'{{"ph": "X", "cat": "gpu_user_annotation", "name": {json.dumps(shown)}, '
                                  f'"pid": {self.device}, "tid": {stream}, "ts": {ts[i]}, "dur": {ds_[i]}, '
                                  f'"args": {args}}}')

    def kernels(self, t: pa.Table, step_span: dict[int, tuple[int, int]]) -> None:
        kind = np.asarray(t.column("kind").to_pylist(), dtype=object)
        ops = kind == "cpu_op"
        if ops.any():
            self._cpu_ops(t.filter(pa.array(ops)))
            t = t.filter(pa.array(~ops))
            kind = kind[~ops]
        if t.num_rows == 0:
            return
        start, dur = _np(t, "start_ns"), np.maximum(_np(t, "dur_ns"), 0)
        step, device, stream = _np(t, "step"), _np(t, "device"), _np(t, "stream")
        lo = np.array([step_span.get(int(s), (-1, -1))[0] for s in step], np.int64)
        hi = np.array([step_span.get(int(s), (-1, -1))[1] for s in step], np.int64)
        launch = start - _LAUNCH_LEAD_NS
        launch = np.where(lo >= 0, np.maximum(launch, lo), launch)
        launch = np.where(hi >= 0, np.minimum(launch, hi - 1), launch)
        launch = np.maximum(launch, self.base)
        order = np.argsort(launch, kind="stable")  # correlation ids in launch order, as CUPTI numbers them
        gap = np.diff(launch[order], append=launch[order][-1] + 1000)
        launch_dur = np.empty_like(launch)
        launch_dur[order] = np.clip(gap, 0, 1000)
        corr = np.empty(len(launch), np.int64)
        corr[order] = np.arange(self.next_id, self.next_id + len(launch))
        self.next_id += len(launch)
        names = t.column("name").to_pylist()
        ts, ds_, lts, lds = _us(start - self.base), _us(dur), _us(launch - self.base), _us(launch_dur)
        for i, k in enumerate(kind.tolist()):
            c, d, s = int(corr[i]), int(device[i]), int(stream[i])
            self.streams.add((d, s))
            call, cbid = LAUNCH.get(k, LAUNCH["kernel"])
            self.lines.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "{call}", "pid": {self.pid}, '
                              f'"tid": {self.pid}, "ts": {lts[i]}, "dur": {lds[i]}, '
                              f'"args": {{"External id": {c}, "cbid": {cbid}, "correlation": {c}}}}}')
            self.lines.append(f'{{"ph": "X", "cat": "{KERNEL_CATEGORY.get(k, "kernel")}", "name": {self.name(names[i])}, '
                              f'"pid": {d}, "tid": {s}, "ts": {ts[i]}, "dur": {ds_[i]}, "args": {{"External id": {c}, '
                              f'"device": {d}, "stream": {s}, "correlation": {c}}}}}')

    def _cpu_ops(self, t: pa.Table) -> None:
        """CPU-only op-level records: ``cpu_op`` events on one thread per stream, marked for re-import."""
        names = t.column("name").to_pylist()
        device, stream = _np(t, "device"), _np(t, "stream")
        ts, ds_ = _us(_np(t, "start_ns") - self.base), _us(np.maximum(_np(t, "dur_ns"), 0))
        for i, e in enumerate(self.ids(len(names))):
            s = int(stream[i])
            self.ops_streams.add(s)
            self.lines.append(f'{{"ph": "X", "cat": "cpu_op", "name": {self.name(names[i])}, "pid": {self.pid}, '
                              f'"tid": {_OPS_TID_BASE + s}, "ts": {ts[i]}, "dur": {ds_[i]}, "args": {{"External id": {e}, '
                              f'"{ARGUS_ARG}": {{"stream": {s}, "device": {int(device[i])}}}}}}}')

    def metadata(self) -> list[str]:
        out = [f'{{"ph": "M", "name": "process_name", "pid": {self.pid}, "tid": 0, "args": {{"name": "rank {self.rank}"}}}}',
               f'{{"ph": "M", "name": "process_labels", "pid": {self.pid}, "tid": 0, "args": {{"labels": "CPU"}}}}',
               f'{{"ph": "M", "name": "thread_name", "pid": {self.pid}, "tid": {self.pid}, "args": {{"name": "main"}}}}']
        for s in sorted(self.ops_streams):
            out.append(f'{{"ph": "M", "name": "thread_name", "pid": {self.pid}, "tid": {_OPS_TID_BASE + s}, '
                       f'"args": {{"name": "ops (stream {s})"}}}}')
        for d in sorted({d for d, _ in self.streams}):
            out.append(f'{{"ph": "M", "name": "process_name", "pid": {d}, "tid": 0, "args": {{"name": "rank {self.rank}"}}}}')
            out.append(f'{{"ph": "M", "name": "process_labels", "pid": {d}, "tid": 0, "args": {{"labels": "GPU {d}"}}}}')
        for d, s in sorted(self.streams):
            out.append(f'{{"ph": "M", "name": "thread_name", "pid": {d}, "tid": {s}, "args": {{"name": "stream {s}"}}}}')
        return out


def _is_comm_kernel(name: str) -> bool:
    try:
        from argus.compress.names import categorize_kernel
    except ImportError:  # pragma: no cover - the compressor ships with Argus
        return name.lower().startswith("nccl")
    return categorize_kernel(name, "kernel")[0] == "comm"


def _rank_batches(attempt: Attempt, ranks: list[int], has_kernels: bool) -> list[list[int]]:
    """Ranks in batches whose kernels make a read of about 4 M rows (all at once without kernels)."""
    if not has_kernels:
        return [ranks]
    total = attempt.stats()["kernels"].rows
    per_batch = max(1, int(len(ranks) * _KERNEL_ROWS_PER_READ / max(total, 1)))
    return [ranks[i:i + per_batch] for i in range(0, len(ranks), per_batch)]


def export_kineto(store: str | Path | Store, out: str | Path, *, run_id: str | None = None,
                  attempt_id: str | None = None, steps: tuple[int, int] | None = None, compress: bool = False,
                  hta_compat: bool = False, on_rank: Callable[[int], None] | None = None) -> ExportResult:
    """Write ``DIR/rank<N>.json`` (``.json.gz`` with ``compress``) for every rank with data in the
    attempt (default: the latest), optionally only ``steps=(first, last)``."""
    t0 = time.perf_counter()
    st = store if isinstance(store, Store) else Store.open(store)
    attempt = st.attempt(run_id, attempt_id)
    out = Path(out)
    _prepare_out(out)
    result = ExportResult(out=out)
    steps_t = attempt.read("steps", steps=steps)
    phases_t = attempt.read("phases", steps=steps)
    has_kernels = bool(attempt.files("kernels"))
    if not has_kernels:
        result.warnings.append(f"{attempt.path}: no raw kernel events in this store (kernel summaries only); "
                               "exported steps and phases only — HTA's kernel analyses need kernels")
    kernel_cols = attempt.read("kernels", columns=["rank", "start_ns"], steps=steps) if has_kernels else None
    ranks = sorted(set(pc.unique(steps_t.column("rank")).to_pylist()) |
                   set(pc.unique(phases_t.column("rank")).to_pylist()) |
                   set(pc.unique(kernel_cols.column("rank")).to_pylist() if kernel_cols is not None else []))
    if not ranks:
        raise StoreError(f"{attempt.path}: nothing to export (no steps, phases or kernels"
                         + (f" in steps {steps[0]}..{steps[1]})" if steps else ")"))
    mins = [pc.min(t.column("start_ns")).as_py() for t in (steps_t, phases_t, kernel_cols)
            if t is not None and t.num_rows]
    topo = attempt.topology()
    cpu_job = all(str(u).startswith("cpu-") for u in topo.gpu_uuids)
    ctx = _Export(out=out, attempt=attempt, result=result, hta_compat=hta_compat, compress=compress, gpu=not cpu_job,
                  base_ns=(min(mins) // 1_000_000_000) * 1_000_000_000,  # whole seconds: readable timestamps
                  backend=str(attempt.meta.get("backend") or ("gloo" if cpu_job else "nccl")),
                  hosts=topo.hosts, local_ranks=topo.local_ranks,
                  comm_kinds=sorted({str(k) for k in pc.unique(pc.filter(
                      phases_t.column("group_kind"), pc.equal(phases_t.column("category"), "comm"))).to_pylist() if k}))
    steps_by_rank, phases_by_rank = _split(steps_t), _split(phases_t)
    for batch in _rank_batches(attempt, ranks, has_kernels):
        kernels_by_rank = (_split(attempt.read("kernels", steps=steps, filter=ds.field("rank").isin(batch)))
                           if has_kernels else {})
        for rank in batch:
            ctx.write_rank(rank, steps_by_rank.get(rank, steps_t.schema.empty_table()),
                           phases_by_rank.get(rank, phases_t.schema.empty_table()), kernels_by_rank.get(rank))
            if on_rank is not None:
                on_rank(rank)
    result.wall_s = time.perf_counter() - t0
    return result


@dataclass
class _Export:
    """What every rank's file shares, and the writing of one rank's file."""

    out: Path
    attempt: Attempt
    result: ExportResult
    hta_compat: bool
    compress: bool
    gpu: bool
    base_ns: int
    backend: str
    hosts: np.ndarray
    local_ranks: np.ndarray
    comm_names: dict[str, bool] = field(default_factory=dict)
    comm_kinds: list[str] = field(default_factory=list)  # group kinds the store's collectives ran in

    def process_groups(self, rank: int) -> dict[str, dict]:
        """The rank's process groups as PyTorch lists them in ``distributedInfo.pg_config``, named
        as Megatron-core names them (``pg_desc``), for the kinds the store's collectives used:
        tools that read only the trace (not Argus's own args) see each collective's group."""
        from argus.topology import megatron_desc, megatron_group

        layout = self.attempt.layout
        out: dict[str, dict] = {}
        for kind in self.comm_kinds:
            members = megatron_group(layout, kind, rank) if rank < layout.world_size else None
            if members is None or len(members) < 2:
                continue
            desc = megatron_desc(layout, kind)
            out[kind] = {"pg_name": f"{desc}:{int(members[0])}", "pg_desc": desc,
                         "backend_config": f"{'cuda' if self.gpu else 'cpu'}:{self.backend}",
                         "pg_size": int(len(members)), "ranks": [int(m) for m in members]}
        return out

    def _placement(self, rank: int, kernels: pa.Table | None) -> tuple[int, dict[str, int]]:
        """The rank's device, and the streams its compute and communication kernels mostly ran on
        (where its GPU annotations go)."""
        device = int(self.local_ranks[rank])
        streams = {"compute": _DEFAULT_STREAM, "comm": _DEFAULT_STREAM}
        if kernels is None or kernels.num_rows == 0:
            return device, streams
        names = kernels.column("name")
        uniq = pc.unique(names).to_pylist()
        for n in uniq:
            if n not in self.comm_names:
                self.comm_names[n] = _is_comm_kernel(n)
        comm_set = pa.array([n for n in uniq if self.comm_names[n]], pa.string())
        is_comm = pc.is_in(names, value_set=comm_set).to_numpy(zero_copy_only=False)
        stream = _np(kernels, "stream")
        streams["compute"] = _dominant(stream[~is_comm], _DEFAULT_STREAM)
        streams["comm"] = _dominant(stream[is_comm], streams["compute"])
        return _dominant(_np(kernels, "device"), device), streams

    def write_rank(self, rank: int, steps: pa.Table, phases: pa.Table, kernels: pa.Table | None) -> Path:
        device, streams = self._placement(rank, kernels)
        w = _RankWriter(rank, self.base_ns, self.hta_compat, self.gpu, device)
        # Steps that never finished end, in the export, with the last thing the rank did in them.
        last_end: dict[int, int] = {}
        for t in (phases, kernels):
            if t is None or t.num_rows == 0:
                continue
            end = _np(t, "start_ns") + np.maximum(_np(t, "dur_ns"), 0)
            for s, e in zip(_np(t, "step").tolist(), end.tolist()):
                if e > last_end.get(s, -1):
                    last_end[s] = e
        w.steps(steps, last_end)
        span = {int(s): (int(a), int(b))
                for s, a, b in zip(_np(steps, "step"), _np(steps, "start_ns"), _np(steps, "end_ns"))}
        pgs = self.process_groups(rank)
        w.phases(phases, {s: (b if b >= 0 else last_end.get(s, a)) for s, (a, b) in span.items()}, streams, pgs)
        if kernels is not None:
            w.kernels(kernels, span)
        ident = self.attempt.identity
        header = {"schemaVersion": 1,
                  "distributedInfo": {"backend": self.backend, "rank": rank,
                                      "world_size": self.attempt.layout.world_size,
                                      "pg_config": list(pgs.values())},
                  "deviceProperties": [], "host_name": str(self.hosts[rank]), "baseTimeNanoseconds": self.base_ns,
                  "displayTimeUnit": "ms", "traceName": f"argus export of {ident.run_id}/{ident.attempt_id} rank {rank}"}
        events = w.metadata() + w.lines
        text = ("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in header.items())
                + ',\n  "traceEvents": [\n  ' + ",\n  ".join(events) + "\n  ]\n}\n")
        data = text.encode()
        if self.compress:
            data = _gzip.compress(data, compresslevel=6, mtime=0)
        path = self.out / (f"rank{rank}.json.gz" if self.compress else f"rank{rank}.json")
        write_bytes_atomic(path, data)
        r = self.result
        r.files.append(path)
        r.ranks.append(rank)
        r.events += len(events)
        r.steps += steps.num_rows
        r.phases += phases.num_rows
        r.kernels += 0 if kernels is None else kernels.num_rows
        r.bytes_written += len(data)
        return path
