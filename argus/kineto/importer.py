"""``argus ingest kineto``: per-rank PyTorch Profiler traces → a run store.

Three stages, each usable alone: find the files, read them (in parallel processes when there
are many big ones — parsing is CPU-bound), then place the ranks in a topology and write one
window per profiler step through :class:`~argus.store.WindowWriter`, the path the
live processor uses, so an imported store looks like a recorded one (kernel summaries
included). A file that cannot be read, or whose file-level values (rank, base time) are
wrong, is reported and skipped; events with bad values are left out and counted per file
(:mod:`argus.kineto.limits`); the other ranks still land, and an import that keeps no rank
leaves no attempt behind.

Memory: every parsed rank is held until the write (≈40 bytes per kernel event, plus phases),
because a step's window gathers all ranks.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, NoReturn, Sequence, cast

import numpy as np
import pyarrow as pa

from argus.errors import IngestError, LayoutError
from argus.kineto.format import KIND_CODES, KIND_NAMES
from argus.kineto.reader import RankTrace, read_trace
from argus.store import Store
from argus.topology import GroupKind, Layout, RunIdentity, Topology, new_run_id, parse_layout
from argus.vocab import kernel_in_group

if TYPE_CHECKING:
    from argus.store import Attempt

__all__ = ["Failure", "FileReport", "ImportResult", "find_trace_files", "read_traces", "import_traces",
           "import_kineto", "WRITER_ID", "group_kind_of"]

#: Writer partition of imported files in the store.
WRITER_ID = "kineto"
_SUFFIXES = (".json", ".json.gz")
_CPU_OP = KIND_CODES["cpu_op"]
_PARALLEL_MIN_BYTES = 32 << 20  # below this, starting worker processes costs more than it saves
# Most specific first: a DDP job's one process group is its ``dp`` group, not ``world``.
_GROUP_PREFERENCE = ("tp", "cp", "ep", "pp", "dp", "edp", "world")


@dataclass(frozen=True)
class Failure:
    """A file that was not imported, and why."""

    path: str
    problem: str

    def __str__(self) -> str:
        return self.problem if self.problem.startswith(self.path) else f"{self.path}: {self.problem}"


@dataclass(frozen=True)
class FileReport:
    path: str
    rank: int
    rank_source: str
    steps: int
    phases: int
    kernels: int
    events: int
    bytes_read: int
    file_bytes: int
    parse_s: float
    dropped: dict[str, int]
    notes: list[str]
    rejected: dict[str, dict[str, int]] = field(default_factory=dict)  # see ``limits.Rejects.to_json``
    rejected_lines: list[str] = field(default_factory=list)


@dataclass
class ImportResult:
    store: Path
    run_id: str
    attempt_id: str
    layout: str
    world_size: int
    files: list[FileReport] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    windows: int = 0
    bytes_written: int = 0
    parse_s: float = 0.0
    write_s: float = 0.0

    @property
    def ranks(self) -> list[int]:
        return sorted(f.rank for f in self.files)

    @property
    def ok(self) -> bool:
        return not self.failures


# --------------------------------------------------------------------------------------- files
def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand the command line: files as given, directories to their ``*.json`` / ``*.json.gz``
    (not recursive, hidden files skipped). A missing path or an empty directory is an error."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            # Not only regular files: a FIFO, device or dangling link named like a trace is reported
            # by the reader as such rather than passed over in silence.
            found = sorted(f for f in p.iterdir()
                           if f.name.endswith(_SUFFIXES) and not f.name.startswith(".") and not f.is_dir())
            if not found:
                raise IngestError(f"{p}: no .json or .json.gz trace files in this directory")
            out.extend(found)
        elif p.exists() or p.is_symlink():
            out.append(p)
        else:
            raise IngestError(f"{p}: no such file or directory")
    seen: set[Path] = set()
    unique = []
    for f in out:
        try:
            key = f.resolve()
        except (OSError, RuntimeError):  # a symlink loop: the reader reports it
            key = f.absolute()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def _read_one(path: str) -> RankTrace | Failure:
    try:
        return read_trace(path)
    except IngestError as exc:
        return Failure(path, str(exc))


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_traces(files: Sequence[str | Path], jobs: int | None = None,
                on_bytes: Callable[[int], None] | None = None) -> tuple[list[RankTrace], list[Failure]]:
    """Parse every file; failures are collected, not raised. ``jobs`` > 1 parses in that many
    processes (default: automatic — parallel only for several files totalling ≥ 32 MB).
    ``on_bytes(n)`` reports progress in bytes of the files on disk."""
    names = [str(f) for f in files]
    sizes = {f: _size(f) for f in names}
    if jobs is None:
        big = sum(sizes.values()) >= _PARALLEL_MIN_BYTES
        jobs = min(len(files), os.cpu_count() or 1, 8) if big else 1
    traces: list[RankTrace] = []
    failures: list[Failure] = []
    if jobs <= 1 or len(files) <= 1:
        for f in names:
            try:
                traces.append(read_trace(f, on_bytes=on_bytes))
            except IngestError as exc:
                failures.append(Failure(f, str(exc)))
    else:
        # spawn, not fork: the caller may run threads (progress display), which fork would copy mid-state.
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(_read_one, f): f for f in names}
            for fut in as_completed(futures):
                try:
                    res = fut.result()
                except Exception as exc:  # noqa: BLE001 - the worker died (killed for memory?): that file fails, not the import
                    res = Failure(futures[fut], f"{futures[fut]}: the parsing process failed ({type(exc).__name__}: {exc})")
                (failures if isinstance(res, Failure) else traces).append(res)  # type: ignore[arg-type]
                if on_bytes is not None:
                    on_bytes(sizes[futures[fut]])
    traces.sort(key=lambda t: t.path)
    failures.sort(key=lambda f: f.path)
    return traces, failures


# --------------------------------------------------------------------------------------- topology
def desc_kind(desc: str) -> str:
    """A group no layout kind describes, named after its ``pg_desc`` (``MODEL_PARALLEL_GROUP`` →
    ``model_parallel``): its own kind, never folded into tp or dp, and judged only against
    groups of the same kind (the analysis compares layout kinds only); empty without a name."""
    name = re.sub(r"[^a-z0-9]+", "_", desc.lower()).strip("_")
    name = re.sub(r"_(group|pg)$", "", name)
    return name[:48] if name and name not in {k.value for k in GroupKind} else ""


def group_kind_of(layout: Layout, rank: int, members: Sequence[int]) -> str:
    """The layout's group kind whose group of ``rank`` has exactly ``members``; empty if none."""
    want = set(int(m) for m in members)
    if rank not in want:
        return ""
    for kind in _GROUP_PREFERENCE:
        if layout.group_size(kind) == len(want) and set(layout.group_of(kind, rank).tolist()) == want:
            return kind
    return ""


def _resolve_layout(text: str | Mapping[str, int], order: str | None, traces: list[RankTrace]) -> Layout:
    parse_layout(text, order=order)  # syntax first: a typo is reported as such
    sized = [t for t in traces if t.world_size]
    worlds = {cast(int, t.world_size) for t in sized}  # sized: only traces that state a world size
    if len(worlds) > 1:
        a = next(t for t in sized if t.world_size == min(worlds))
        b = next(t for t in sized if t.world_size == max(worlds))
        raise IngestError(f"traces from different jobs? {a.path} says world_size {a.world_size}, "
                          f"{b.path} says {b.world_size}")
    if worlds:
        world = worlds.pop()
        try:
            layout = parse_layout(text, world_size=world, order=order)
        except LayoutError as exc:
            raise LayoutError(f"{exc} (distributedInfo.world_size of {sized[0].path}); "
                              "give a --layout whose sizes multiply to it") from None
    else:  # no world size in the traces: the ranks present bound it from below
        layout = parse_layout(text, order=order)
        if layout.world_size == 1 and not (isinstance(text, str) and text.strip()):
            layout = parse_layout(text, world_size=max(int(t.rank or 0) for t in traces) + 1, order=order)
    for t in traces:
        assert t.rank is not None
        if t.rank >= layout.world_size:
            raise LayoutError(f"{t.path}: rank {t.rank} is outside layout {layout} "
                              f"({layout.world_size} ranks); give a --layout that covers it")
    return layout


def _topology(layout: Layout, gpus_per_host: int, traces: list[RankTrace]) -> Topology:
    """Uniform placement, with the host names the traces give (``host_name``); a CPU-only job
    (gloo, no device activity) gets ``cpu-…`` ids instead of made-up GPU UUIDs."""
    topo = Topology.uniform(layout, gpus_per_host)
    named = [(t.rank, t.hostname) for t in traces if t.hostname]
    cpu_only = all(t.backend in (None, "gloo") and not (t.kernels.kind != _CPU_OP).any() for t in traces) and any(
        t.backend == "gloo" for t in traces)
    if not named and not cpu_only:
        return topo
    hosts = topo.hosts.astype(object)
    for rank, host in named:
        hosts[rank] = host
    uuids = topo.gpu_uuids
    if cpu_only:
        uuids = np.array([f"cpu-{h}-{lr}" for h, lr in zip(hosts, topo.local_ranks)])
    return Topology(layout=layout, hosts=np.asarray(hosts.tolist()), local_ranks=topo.local_ranks, gpu_uuids=uuids)


# --------------------------------------------------------------------------------------- tables
def _by_step(table: pa.Table, steps: np.ndarray) -> dict[int, pa.Table]:
    """Split ``table`` into one slice per step (one sort, no per-row work)."""
    if table.num_rows == 0:
        return {}
    order = np.argsort(steps, kind="stable")
    table = table.take(pa.array(order))
    sorted_steps = steps[order]
    uniq, first = np.unique(sorted_steps, return_index=True)
    bounds = list(first) + [len(sorted_steps)]
    return {int(s): table.slice(int(bounds[i]), int(bounds[i + 1] - bounds[i])) for i, s in enumerate(uniq)}


#: One rank's steps, phases and kernels, each split by step.
_RankTables = tuple[dict[int, pa.Table], dict[int, pa.Table], dict[int, pa.Table]]


def _rank_tables(t: RankTrace, layout: Layout) -> _RankTables:
    assert t.rank is not None
    rank = t.rank
    s = t.steps
    steps = pa.table({"rank": pa.array(np.full(len(s.step), rank, np.int32)), "step": s.step,
                      "start_ns": s.start_ns, "end_ns": s.end_ns})
    p = t.phases
    kinds = p.group_kind.copy()
    by_ref: np.ndarray | None = None
    if len(p) and (p.group_ref >= 0).any():
        by_ref = _group_kinds(t, layout, rank)
        ref = p.group_ref
        kinds = np.where(ref >= 0, by_ref[ref], kinds)
    phases = pa.table({
        "rank": pa.array(np.full(len(p), rank, np.int32)), "step": p.step, "microbatch": p.microbatch,
        "name": pa.array(p.name.tolist(), pa.string()), "category": pa.array(p.category.tolist(), pa.string()),
        "group_kind": pa.array(kinds.tolist(), pa.string()), "start_ns": p.start_ns, "dur_ns": p.dur_ns,
        "wait_ns": p.host_waits()})
    k = t.kernels
    name_id, knames = _kernels_by_group(k, t, layout, rank, by_ref)
    names = pa.DictionaryArray.from_arrays(pa.array(name_id, pa.int32()), pa.array(knames, pa.string()))
    kind = pa.DictionaryArray.from_arrays(pa.array(k.kind.astype(np.int32)), pa.array(list(KIND_NAMES)))
    kernels = pa.table({
        "rank": pa.array(np.full(len(k), rank, np.int32)), "step": k.step, "kind": kind.cast(pa.string()),
        "device": k.device, "stream": k.stream, "name": names.cast(pa.string()),
        "start_ns": k.start_ns, "dur_ns": k.dur_ns})
    return _by_step(steps, s.step), _by_step(phases, p.step), _by_step(kernels, k.step)


def _group_kinds(t: RankTrace, layout: Layout, rank: int) -> np.ndarray:
    """Each of the trace's groups (``t.groups``) as a kind: the layout's, else its ``pg_desc``'s;
    one trailing "" for ref -1."""
    return np.array([group_kind_of(layout, rank, g) or desc_kind(t.group_descs.get(g, "")) for g in t.groups]
                    + [""], dtype=object)


def _kernels_by_group(k, t: RankTrace, layout: Layout, rank: int,
                      by_ref: np.ndarray | None) -> tuple[np.ndarray, list[str]]:
    """Kernel names, a collective's with its communicator's kind (``… [group dp]``): NCCL
    names one kernel alike for every group, and a 16-rank all-reduce compared with 4-rank ones
    (or a model-parallel reduction with tensor-parallel ones) differs by its group, not its link."""
    ref = k.group_ref if len(k.group_ref) == len(k) else np.full(len(k), -1, np.int32)
    if not (ref >= 0).any():
        return k.name_id, list(k.names)
    if by_ref is None:
        by_ref = _group_kinds(t, layout, rank)
    pair = k.name_id.astype(np.int64) * (len(t.groups) + 1) + np.where(ref >= 0, ref, len(t.groups))
    uniq, inv = np.unique(pair, return_inverse=True)
    names = []
    for u in uniq.tolist():
        nid, r = divmod(int(u), len(t.groups) + 1)
        kind = by_ref[r] if r < len(t.groups) else ""
        names.append(kernel_in_group(k.names[nid], kind))
    return inv.astype(np.int32), names


def _concat(parts: list[pa.Table]) -> pa.Table | None:
    return pa.concat_tables(parts) if parts else None


# --------------------------------------------------------------------------------------- import
def import_traces(traces: list[RankTrace], out: str | Path, layout: str | Mapping[str, int], *,
                  order: str | None = None, gpus_per_host: int = 8, run_id: str | None = None,
                  failures: Sequence[Failure] = (), on_window: Callable[[int], None] | None = None) -> ImportResult:
    """Write parsed traces into the store at ``out`` as a new run attempt (source ``kineto``).

    A lone trace without a rank is rank 0 (with a note); among several, traces without a rank
    become failures. An empty ``layout`` is pure data parallelism over the traces'
    ``distributedInfo.world_size`` (else over the highest rank present). Two traces of one rank, or a layout that cannot hold
    the ranks, are errors (nothing is written). ``on_window(step)`` reports progress."""
    t0 = time.perf_counter()
    failures = list(failures)
    ranked: list[RankTrace] = []
    by_rank: dict[int, RankTrace] = {}
    if len(traces) == 1 and traces[0].rank is None:  # a lone trace, as a profiler of one process writes it
        traces[0].rank, traces[0].rank_source = 0, "assumed"
        traces[0].notes.append("no rank in the trace (distributedInfo) or its file name: imported as rank 0")
    for t in traces:
        if t.rank is None:
            failures.append(Failure(t.path, f"{t.path}: no rank: neither distributedInfo.rank in the trace nor "
                                            "rank<N> in the file name"))
            continue
        if t.rank in by_rank:
            raise IngestError(f"rank {t.rank} claimed by two files: {by_rank[t.rank].path} and {t.path}")
        by_rank[t.rank] = t
        ranked.append(t)
    if not ranked:
        _nothing_imported(failures)
    lay = _resolve_layout(layout, order, ranked)
    topology = _topology(lay, gpus_per_host, ranked)
    # Every rank's tables are built before the attempt exists: a rank whose values still cannot
    # be stored fails alone, and an import that keeps no rank leaves no (empty) attempt behind.
    per_rank: list[_RankTables] = []
    good: list[RankTrace] = []
    for t in ranked:
        try:
            per_rank.append(_rank_tables(t, lay))
            good.append(t)
        except Exception as exc:  # noqa: BLE001 - whatever a file's values cause, it is that file's failure
            failures.append(Failure(t.path, f"{t.path}: cannot store the trace's values ({type(exc).__name__}: {exc})"))
    if not good:
        _nothing_imported(failures)
    failures.sort(key=lambda f: f.path)
    store = Store.create(out)
    identity = RunIdentity(run_id or new_run_id("kineto"))
    run_dir = store.attempt_path(identity).parent
    new_run_dir = not run_dir.exists()
    attempt = store.create_attempt(identity, topology, source="kineto", extra={
        "imported_ranks": len(good), "traced_world_size": max((t.world_size or 0) for t in good) or None})
    result = ImportResult(store=Path(out), run_id=identity.run_id, attempt_id=identity.attempt_id,
                          layout=str(lay), world_size=lay.world_size, failures=failures)
    try:
        _write_windows(attempt, per_rank, result, on_window)
    except BaseException as exc:
        # This import created the attempt (create_attempt refuses an existing one): a half-written
        # attempt would later read as a healthy run with missing steps, so it goes.
        shutil.rmtree(attempt.path, ignore_errors=True)
        if new_run_dir and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
        if not isinstance(exc, Exception):
            raise
        raise IngestError(f"writing {attempt.path} failed ({type(exc).__name__}: {exc}); "
                          "the partly written attempt was removed") from exc
    result.files = [FileReport(path=t.path, rank=int(t.rank), rank_source=t.rank_source,  # type: ignore[arg-type]
                               steps=len(t.steps.step), phases=len(t.phases), kernels=len(t.kernels),
                               events=t.events, bytes_read=t.bytes_read, file_bytes=t.file_bytes,
                               parse_s=t.parse_s, dropped=dict(t.dropped), notes=list(t.notes),
                               rejected=t.rejected.to_json(), rejected_lines=t.rejected.lines())
                    for t in sorted(good, key=lambda t: t.rank or 0)]
    result.write_s = time.perf_counter() - t0
    return result


def _nothing_imported(failures: Sequence[Failure]) -> NoReturn:
    detail = "; ".join(str(f) for f in failures) or "no trace files given"
    raise IngestError(f"nothing imported: {detail}")


def _write_windows(attempt: Attempt, per_rank: list[_RankTables], result: ImportResult,
                   on_window: Callable[[int], None] | None) -> None:
    """One window per profiler step, through the live processor's writer (kernels compressed
    as the processor's store exporter does)."""
    from argus.ingest import write_window
    from argus.store import WindowData, WindowWriter

    writer = WindowWriter(attempt, WRITER_ID, raw_kernels=True)
    all_steps = sorted(set().union(*(set(s) | set(p) | set(k) for s, p, k in per_rank)))
    for step in all_steps:
        data = WindowData(
            window=step, start_step=step, end_step=step,
            steps=_concat([s[step] for s, _, _ in per_rank if step in s]),
            phases=_concat([p[step] for _, p, _ in per_rank if step in p]),
            kernels=_concat([k[step] for _, _, k in per_rank if step in k]))
        stats = write_window(writer, data)
        for table, n in stats.rows.items():
            result.rows[table] = result.rows.get(table, 0) + n
        result.windows += 1
        if on_window is not None:
            on_window(step)
    result.bytes_written = writer.writer.bytes_written


def import_kineto(paths: Iterable[str | Path] | str | Path, out: str | Path, layout: str | Mapping[str, int] = "", *,
                  order: str | None = None, gpus_per_host: int = 8, run_id: str | None = None,
                  jobs: int | None = None) -> ImportResult:
    """Find, read and import Kineto traces into the store at ``out`` (see :func:`import_traces`).

    Per-file problems end up in ``result.failures``; the other ranks are imported."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    parse_layout(layout, order=order)  # fail on a bad layout before reading gigabytes
    files = find_trace_files(paths)
    t0 = time.perf_counter()
    traces, failures = read_traces(files, jobs=jobs)
    parse_s = time.perf_counter() - t0
    result = import_traces(traces, out, layout, order=order, gpus_per_host=gpus_per_host, run_id=run_id,
                           failures=failures)
    result.parse_s = parse_s
    return result
