"""Stream one Kineto trace file into compact per-rank arrays: steps, phases, kernels.

Traces are big (≈10 MB per rank-step on real GPU jobs), so a file is never loaded whole: ijson's
C backend yields one event dict at a time and the loop keeps only a few numbers per event in
typed arrays (8 bytes a field, not a Python object), with names interned. What it costs: one
pass over the decompressed bytes at roughly ijson's speed (≈90 MB/s of JSON on one core here).

Top-level metadata (``distributedInfo``, ``baseTimeNanoseconds``) may come before or after
``traceEvents`` — Kineto writes ``baseTimeNanoseconds`` last. Rather than a second pass, the
reader keeps the first and last few MB of decompressed text and decodes those keys from them.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from argus.errors import IngestError
from argus.kineto.events import (
    RPC_GROUP_KEYS,
    Collected,
    KernelArrays,
    PhaseArrays,
    StepArrays,
    StepIndex,
    build_kernels,
    kernel_group_key,
    build_phases,
    build_steps,
    group_descriptions,
    process_groups,
)
from argus.kineto.format import ARGUS_ARG, CATEGORIES, KIND_CODES, Cat
from argus.kineto.guard import JsonGuard, JsonLimitError
from argus.kineto.limits import (
    MAX_BASE_NS,
    MAX_DUR_US,
    MAX_HOSTNAME,
    MAX_INT32,
    MAX_NAME_CHARS,
    MAX_STEP,
    MAX_TS_US,
    MAX_WORLD_SIZE,
    Rejects,
    as_base_ns,
    as_dur_us,
    as_hostname,
    as_rank,
    as_time_us,
    as_world_size,
)
from argus.kineto.names import is_annotation_name, profiler_step, rank_from_filename

__all__ = ["RankTrace", "StepArrays", "PhaseArrays", "KernelArrays", "read_trace"]

_EMPTY: dict[str, Any] = {}
_HEAD_MAX = 8 << 20  # decompressed bytes kept from the start, until ``"traceEvents"`` shows up
_TAIL_KEEP = 2 << 20  # decompressed bytes kept from the end (keys Kineto writes after the events)
_META_KEYS = ("distributedInfo", "baseTimeNanoseconds", "host_name", "hostname")


@dataclass
class RankTrace:
    """One rank's trace, parsed: everything the importer needs, nothing per-event in Python objects."""

    path: str
    rank: int | None
    rank_source: str  # "distributedInfo", "file name" or "" (unknown)
    world_size: int | None
    backend: str | None
    hostname: str | None
    groups: list[tuple[int, ...]]  # ranks of the process groups phases ran in (see PhaseArrays.group_ref)
    base_ns: int
    steps: StepArrays
    phases: PhaseArrays
    kernels: KernelArrays
    events: int = 0
    bytes_read: int = 0  # decompressed JSON bytes
    file_bytes: int = 0
    parse_s: float = 0.0
    dropped: dict[str, int] = field(default_factory=dict)  # records outside every profiler step
    rejected: Rejects = field(default_factory=Rejects)  # events left out for a bad value
    notes: list[str] = field(default_factory=list)
    #: member ranks → the group's ``pg_desc`` (pg_config), for groups no layout kind describes
    group_descs: dict[tuple[int, ...], str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------- reading
class _CountingReader:
    """Passes reads through, reporting bytes consumed from disk (progress)."""

    def __init__(self, fh: Any, on_bytes: Callable[[int], None] | None):
        self._fh, self._on_bytes = fh, on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        if self._on_bytes is not None and data:
            self._on_bytes(len(data))
        return data

    def readinto(self, b: Any) -> int:  # gzip's buffered reader may use it
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True


class _Capture:
    """Keeps the start of the decompressed stream (up to ``traceEvents``) and its last bytes."""

    def __init__(self, fh: Any):
        self._fh = fh
        self.head = bytearray()
        self._head_done = False
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.total = 0

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        if data:
            self.total += len(data)
            if not self._head_done:
                seen = max(0, len(self.head) - 16)
                self.head += data[: _HEAD_MAX - len(self.head)]
                self._head_done = len(self.head) >= _HEAD_MAX or b'"traceEvents"' in self.head[seen:]
            self._tail.append(data)
            self._tail_len += len(data)
            while self._tail and self._tail_len - len(self._tail[0]) >= _TAIL_KEEP:
                self._tail_len -= len(self._tail.popleft())
        return data

    @property
    def tail(self) -> bytes:
        return b"".join(self._tail)


def _top_level(head: bytes, tail: bytes) -> dict[str, Any]:
    """Decode the metadata keys from the text before ``traceEvents`` (first occurrence) or, for
    keys written after the events, from the end of the file (last occurrence)."""
    dec = json.JSONDecoder()
    out: dict[str, Any] = {}
    head_text = head.decode("utf-8", "replace")
    cut = head_text.find('"traceEvents"')
    segments = [(head_text[:cut] if cut >= 0 else "", False), (tail.decode("utf-8", "replace"), True)]
    for key in _META_KEYS:
        pattern = re.compile(r'"%s"\s*:\s*' % re.escape(key))
        for text, last in segments:
            found = list(pattern.finditer(text))
            if not found:
                continue
            m = found[-1] if last else found[0]
            try:
                out[key] = dec.raw_decode(text, m.end())[0]
                break
            except ValueError:
                continue
    return out


def _open(path: Path, on_bytes: Callable[[int], None] | None) -> tuple[Any, Any]:
    """The file, and its decompressed bytes. Only a regular file is read: a FIFO named
    ``rank0.json`` would block the import forever, ``/dev/zero`` would never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO must not wait for a writer
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
                "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
            raise IngestError(f"{path}: {what}, not a trace file")
        os.set_blocking(fd, True)
        raw = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    magic = raw.read(2)
    raw.seek(0)
    counted = _CountingReader(raw, on_bytes)
    stream = gzip.GzipFile(fileobj=counted, mode="rb") if magic == b"\x1f\x8b" else counted  # type: ignore[call-overload]
    return raw, stream


def _problem(exc: BaseException, at_byte: int) -> str:
    """A one-line description of why a file could not be parsed."""
    if isinstance(exc, JsonLimitError):
        return str(exc)
    if isinstance(exc, EOFError):
        return "truncated gzip stream: the file ends before the end-of-stream marker (was it copied completely?)"
    if isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        return f"corrupt gzip data ({exc})"
    import ijson

    if isinstance(exc, ijson.JSONError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = first.strip("b'\"")
        if "premature EOF" in first and at_byte == 0:
            return "empty file (0 bytes of JSON)"
        if "premature EOF" in first:
            return f"truncated JSON: the trace ends in the middle (after {at_byte:,} bytes)"
        return f"not valid JSON near byte {at_byte:,} ({first})"
    if isinstance(exc, OSError):
        return f"cannot read the file ({exc.strerror or exc})"
    return f"malformed trace event near byte {at_byte:,} ({type(exc).__name__}: {exc})"


# --------------------------------------------------------------------------------------- the scan
def _infer_category(ev: dict) -> int:
    """Class of an event without ``cat`` (older or hand-made traces)."""
    args = ev.get("args")
    if isinstance(args, dict):
        if "stream" in args:
            low = str(ev.get("name", "")).lower()
            return Cat.MEMCPY if low.startswith("memcpy") else Cat.MEMSET if low.startswith("memset") else Cat.KERNEL
        if "correlation" in args:
            return Cat.RUNTIME
    name = ev.get("name")
    if type(name) is str and name.startswith("ProfilerStep"):
        return Cat.CPU_ANNOTATION
    return Cat.OTHER


_TRAILING_NUMBER = re.compile(r"(\d{1,10})\s*$")  # "stream 7", "GPU 0"; 10 digits hold any int32


def _small_int(value: Any, default: int | None = -1) -> int | None:
    """An int32-sized non-negative number from an int or a string ending in digits; ``default``
    for anything else (bools, floats, out of range)."""
    if type(value) is int:
        return value if 0 <= value <= MAX_INT32 else default
    if type(value) is str:
        m = _TRAILING_NUMBER.search(value)
        if m and int(m.group(1)) <= MAX_INT32:
            return int(m.group(1))
    return default


def _external_id(value: Any) -> int:
    """``External id`` pairs a GPU annotation with its CPU range: any non-negative int, else -1."""
    if type(value) is int and value >= 0:
        return value
    return _small_int(value) if type(value) is str else -1  # type: ignore[return-value]


#: What each class is called in the counts of left-out events.
_KIND = {Cat.KERNEL: "kernel", Cat.MEMCPY: "memcpy", Cat.MEMSET: "memset", Cat.RUNTIME: "runtime",
         Cat.CPU_ANNOTATION: "annotation", Cat.GPU_ANNOTATION: "gpu_annotation", Cat.CPU_OP: "cpu_op"}
_TS_BAD = f"ts|not a number in [0, {MAX_TS_US:.0e}] µs: dropped"
_DUR_BAD = f"dur|negative, not a number or over {MAX_DUR_US:.0e} µs: dropped"
_NAME_BAD = f"name|not a string or over {MAX_NAME_CHARS:,} characters: dropped"


def _kept_cpu_op(ev: dict) -> bool:
    """The CPU ops the importer uses: profiler steps, ``record_param_comms`` (a collective's
    group) and Argus' own CPU-only stand-ins for kernels."""
    name = ev.get("name")
    if type(name) is str and (name == "record_param_comms" or name.startswith("ProfilerStep")
                              or (len(name) <= MAX_NAME_CHARS and is_annotation_name(name))):
        return True
    args = ev.get("args")
    meta = args.get(ARGUS_ARG) if type(args) is dict else None
    return isinstance(meta, dict) and "stream" in meta


def _scan(events: Iterable[Any], c: Collected) -> None:
    """The hot loop: one dict lookup to classify, a few checks and appends to keep. A value that
    the store cannot hold truly (see :mod:`argus.kineto.limits`) drops its event, counted."""
    cats = CATEGORIES
    kernel_names = c.k_names
    strings = c.strings
    bad = c.rejects.add
    for ev in events:
        i = c.n
        c.n += 1
        if type(ev) is not dict:
            bad("any|event|is not a JSON object: dropped", i)
            continue
        ph = ev.get("ph")
        if ph != "X" and not (ph is None and "dur" in ev):
            continue
        cat = ev.get("cat")
        code = (cats.get(cat, 0) if type(cat) is str else 0) if cat is not None else _infer_category(ev)
        if not code:
            continue
        if code == Cat.CPU_OP and not _kept_cpu_op(ev):  # most ops: not used, so not checked or counted
            continue
        raw_ts = ev.get("ts")
        if raw_ts is None:
            continue
        ts = as_time_us(raw_ts)
        if ts is None:
            bad(f"{_KIND[code]}|{_TS_BAD}", i)
            continue
        dur = as_dur_us(ev.get("dur"))
        if dur is None:
            bad(f"{_KIND[code]}|{_DUR_BAD}", i)
            continue
        args = ev.get("args")
        if type(args) is not dict:
            if args is not None:
                bad(f"{_KIND[code]}|args|not a JSON object: ignored", i)
            args = _EMPTY
        if code <= Cat.MEMSET:  # device activity
            name = ev.get("name", "")
            if type(name) is not str or len(name) > MAX_NAME_CHARS:
                bad(f"{_KIND[code]}|{_NAME_BAD}", i)
                continue
            raw = args.get("stream")
            stream = _small_int(ev.get("tid")) if raw is None else _small_int(raw, None)
            raw = args.get("device")
            device = _small_int(ev.get("pid"), 0) if raw is None else _small_int(raw, None)
            if stream is None or device is None:
                bad(f"{_KIND[code]}|{'stream' if stream is None else 'device'}|not an int in [0, 2^31): dropped", i)
                continue
            corr = args.get("correlation", -1)
            if type(corr) is not int or corr < -1:
                bad(f"{_KIND[code]}|correlation|not a non-negative int: ignored", i)
                corr = -1
            nid = kernel_names.get(name)
            if nid is None:
                nid = kernel_names[name] = len(kernel_names)
            gkey = kernel_group_key(args) if args else None
            if gkey is None:
                c.k_group.append(-1)
            else:
                gid = c.k_groups.get(gkey)
                if gid is None:
                    gid = c.k_groups[gkey] = len(c.k_groups)
                c.k_group.append(gid)
                ext = _external_id(args.get("External id"))
                if ext >= 0:
                    c.k_ext_group.setdefault(ext, gid)
            c.k_kind.append(code - Cat.KERNEL)
            c.k_name.append(nid)
            c.k_stream.append(stream)
            c.k_dev.append(device)
            c.k_corr.append(corr)
            c.k_ts.append(ts)
            c.k_dur.append(dur)
        elif code == Cat.RUNTIME:
            corr = args.get("correlation")
            if type(corr) is int and corr >= 0:
                c.rt_corr.append(corr)
                c.rt_ts.append(ts)
        else:
            name = ev.get("name", "")
            if type(name) is not str or len(name) > MAX_NAME_CHARS:
                bad(f"{_KIND[code]}|{_NAME_BAD}", i)
                continue
            if name.startswith("ProfilerStep"):
                if code == Cat.GPU_ANNOTATION:
                    continue
                n = profiler_step(name)
                if n is not None and n < 0:
                    bad(f"{_KIND[code]}|name|has a ProfilerStep number over {MAX_STEP:,}: dropped", i)
                elif n is not None:
                    meta = args.get(ARGUS_ARG)
                    c.steps.append((n, ts, dur, bool(isinstance(meta, dict) and meta.get("unfinished") is True)))
                continue
            if code == Cat.CPU_OP:
                if name == "record_param_comms":  # keep only what names the group, strings shared
                    kept = {k: strings.setdefault(v, v) if type(v) is str else v
                            for k in RPC_GROUP_KEYS if (v := args.get(k)) is not None}
                    c.rpc.append((ts, dur, ev.get("tid"), kept))
                else:
                    meta = args.get(ARGUS_ARG)
                    if isinstance(meta, dict) and "stream" in meta:  # Argus' CPU-only op-level stand-in
                        stream, device = _small_int(meta.get("stream"), None), _small_int(meta.get("device"), 0)
                        if stream is None or device is None:
                            bad(f"cpu_op|{'stream' if stream is None else 'device'}|not an int in [0, 2^31): dropped", i)
                            continue
                        nid = kernel_names.get(name)
                        if nid is None:
                            nid = kernel_names[name] = len(kernel_names)
                        c.k_group.append(-1)
                        c.k_kind.append(KIND_CODES["cpu_op"])
                        c.k_name.append(nid)
                        c.k_stream.append(stream)
                        c.k_dev.append(device)
                        c.k_corr.append(-1)
                        c.k_ts.append(ts)
                        c.k_dur.append(dur)
                    elif is_annotation_name(name):  # an older schema's record_function range
                        c.op_ann.append((strings.setdefault(name, name), ts, dur, _external_id(args.get("External id")),
                                         ev.get("tid"), False, None))
                continue
            meta = args.get(ARGUS_ARG)
            c.ann.append((strings.setdefault(name, name), ts, dur, _external_id(args.get("External id")),
                          ev.get("tid"), code == Cat.GPU_ANNOTATION, meta if isinstance(meta, dict) else None))


# --------------------------------------------------------------------------------------- arrays
# --------------------------------------------------------------------------------------- entry
def read_trace(path: str | Path, on_bytes: Callable[[int], None] | None = None) -> RankTrace:
    """Parse one ``.json`` / ``.json.gz`` Kineto trace. Raises :class:`IngestError` naming the
    file and the problem (truncated gzip, truncated or invalid JSON, nesting or strings beyond
    :mod:`argus.kineto.guard`'s limits, no trace events, a file-level value out of range); events
    with a bad value are left out and counted in ``RankTrace.dropped`` instead."""
    import ijson

    path = Path(path)
    t0 = time.perf_counter()
    c = Collected()
    try:
        raw, stream = _open(path, on_bytes)
    except OSError as exc:
        raise IngestError(f"{path}: {_problem(exc, 0)}") from None
    capture = _Capture(JsonGuard(stream))
    try:
        with raw:
            _scan(ijson.items(capture, "traceEvents.item", use_float=True), c)
    except Exception as exc:  # noqa: BLE001 - ijson, gzip, zlib, limit and malformed-event errors all name the file
        raise IngestError(f"{path}: {_problem(exc, capture.total)}") from None
    try:
        return _assemble(path, c, capture, t0)
    except IngestError:
        raise
    except Exception as exc:  # noqa: BLE001 - a value the checks above missed: this file fails, the others still import
        raise IngestError(f"{path}: cannot use the trace's values ({type(exc).__name__}: {exc})") from None


def _assemble(path: Path, c: Collected, capture: _Capture, t0: float) -> RankTrace:
    """File-level fields checked, then the per-rank arrays."""
    meta = _top_level(bytes(capture.head), capture.tail)
    c.merge_op_annotations()
    if c.n == 0:
        has_key = b'"traceEvents"' in capture.head or b'"traceEvents"' in capture.tail
        raise IngestError(f"{path}: " + ("the traceEvents array is empty" if has_key else
                                         "no traceEvents array: not a PyTorch Profiler (Kineto) trace"))
    notes: list[str] = []
    found = meta.get("distributedInfo")
    dist: dict[str, Any] = found if isinstance(found, dict) else {}
    base = meta.get("baseTimeNanoseconds")
    base_ns = 0 if base is None else as_base_ns(base)
    if base_ns is None:
        raise IngestError(f"{path}: baseTimeNanoseconds {_short(base)} is not an integer time in ns "
                          f"within [0, {MAX_BASE_NS:.0e}]: every timestamp of this rank would be wrong")
    world = dist.get("world_size")
    world_size = as_world_size(world)
    if world is not None and world_size is None:
        notes.append(f"distributedInfo.world_size {_short(world)} is not a size in [1, {MAX_WORLD_SIZE:,}]: ignored")
    rank, source = as_rank(dist.get("rank")), "distributedInfo"
    if rank is None:
        if dist.get("rank") is not None:
            notes.append(f"distributedInfo.rank {_short(dist.get('rank'))} is not a rank in "
                         f"[0, {MAX_WORLD_SIZE:,}): ignored")
        rank, source = rank_from_filename(path.name), "file name"
        if rank is None:
            source = ""
    if rank is not None and world_size is not None and rank >= world_size:
        raise IngestError(f"{path}: rank {rank} (from the {source}) is outside its own "
                          f"distributedInfo.world_size {world_size}")
    host = meta.get("host_name") or meta.get("hostname") or dist.get("hostname") or dist.get("host")
    hostname = as_hostname(host)
    if host and hostname is None:
        notes.append(f"host name {_short(host)} is not a printable string of at most {MAX_HOSTNAME} characters: ignored")
    backend = dist.get("backend")
    dropped: dict[str, int] = {}
    steps = build_steps(c, base_ns, notes)
    index = StepIndex(steps)
    pgs = process_groups(dist)
    groups: list[tuple[int, ...]] = []
    phases = build_phases(c, base_ns, index, pgs, groups, dropped)
    kernels = build_kernels(c, base_ns, index, dropped, pgs, groups)
    if c.rejects and not (len(steps.step) or len(phases) or len(kernels)):
        raise IngestError(f"{path}: no usable trace events: " + "; ".join(c.rejects.lines()))
    return RankTrace(
        path=str(path), rank=rank, rank_source=source, world_size=world_size,
        backend=backend if type(backend) is str and len(backend) <= 64 else None,
        hostname=hostname, groups=groups, base_ns=base_ns, steps=steps, phases=phases,
        kernels=kernels, events=c.n, bytes_read=capture.total, file_bytes=path.stat().st_size,
        parse_s=time.perf_counter() - t0, dropped=dropped, rejected=c.rejects, notes=notes,
        group_descs={**kernels.group_descs, **group_descriptions(dist)})


def _short(value: Any, limit: int = 40) -> str:
    """A value as quoted in a message: its JSON text, cut short."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else json.dumps(value[:limit + 1])
    return text if len(text) <= limit else text[:limit] + "…"
