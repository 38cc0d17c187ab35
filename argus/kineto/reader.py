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
import re
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from argus.errors import IngestError
from argus.kineto.events import (
    Collected,
    KernelArrays,
    PhaseArrays,
    StepArrays,
    StepIndex,
    build_kernels,
    build_phases,
    build_steps,
    process_groups,
)
from argus.kineto.format import ARGUS_ARG, CATEGORIES, KIND_CODES, Cat
from argus.kineto.names import profiler_step, rank_from_filename

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
    notes: list[str] = field(default_factory=list)


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
    raw = open(path, "rb")
    magic = raw.read(2)
    raw.seek(0)
    counted = _CountingReader(raw, on_bytes)
    stream = gzip.GzipFile(fileobj=counted, mode="rb") if magic == b"\x1f\x8b" else counted  # type: ignore[arg-type]
    return raw, stream


def _problem(exc: BaseException, at_byte: int) -> str:
    """A one-line description of why a file could not be parsed."""
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
    if str(ev.get("name", "")).startswith("ProfilerStep"):
        return Cat.CPU_ANNOTATION
    return Cat.OTHER


def _as_int(value: Any, default: int = -1) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        m = re.search(r"(\d+)\s*$", value)  # "stream 7", "GPU 0"
        if m:
            return int(m.group(1))
    return default


def _scan(events: Iterable[dict], c: Collected) -> None:
    """The hot loop: one dict lookup to classify, a few appends to keep."""
    cats = CATEGORIES
    kernel_names = c.k_names
    for ev in events:
        c.n += 1
        ph = ev.get("ph")
        if ph != "X" and not (ph is None and "dur" in ev):
            continue
        cat = ev.get("cat")
        code = cats.get(cat, 0) if cat is not None else _infer_category(ev)
        if not code:
            continue
        ts = ev.get("ts")
        if ts is None:
            continue
        dur = ev.get("dur") or 0
        args = ev.get("args") or _EMPTY
        if code <= Cat.MEMSET:  # device activity
            name = ev.get("name", "")
            nid = kernel_names.get(name)
            if nid is None:
                nid = kernel_names[name] = len(kernel_names)
            c.k_kind.append(code - Cat.KERNEL)
            c.k_name.append(nid)
            stream = args.get("stream")
            c.k_stream.append(stream if isinstance(stream, int) else _as_int(ev.get("tid")))
            device = args.get("device")
            c.k_dev.append(device if isinstance(device, int) else _as_int(ev.get("pid"), 0))
            corr = args.get("correlation")
            c.k_corr.append(corr if isinstance(corr, int) else -1)
            c.k_ts.append(ts)
            c.k_dur.append(dur)
        elif code == Cat.RUNTIME:
            corr = args.get("correlation")
            if isinstance(corr, int):
                c.rt_corr.append(corr)
                c.rt_ts.append(ts)
        elif code == Cat.CPU_ANNOTATION or code == Cat.CPU_OP:
            name = ev.get("name", "")
            if name.startswith("ProfilerStep"):
                n = profiler_step(name)
                if n is not None:
                    meta = args.get(ARGUS_ARG)
                    c.steps.append((n, ts, dur, bool(isinstance(meta, dict) and meta.get("unfinished"))))
                continue
            if code == Cat.CPU_OP:
                if name == "record_param_comms":
                    c.rpc.append((ts, dur, ev.get("tid"), args))
                else:
                    meta = args.get(ARGUS_ARG)
                    if isinstance(meta, dict) and "stream" in meta:  # Argus' CPU-only op-level stand-in
                        nid = kernel_names.get(name)
                        if nid is None:
                            nid = kernel_names[name] = len(kernel_names)
                        c.k_kind.append(KIND_CODES["cpu_op"])
                        c.k_name.append(nid)
                        c.k_stream.append(_as_int(meta.get("stream"), 0))
                        c.k_dev.append(_as_int(meta.get("device"), 0))
                        c.k_corr.append(-1)
                        c.k_ts.append(ts)
                        c.k_dur.append(dur)
                continue
            meta = args.get(ARGUS_ARG)
            c.ann.append((name, ts, dur, _as_int(args.get("External id")), ev.get("tid"), False,
                          meta if isinstance(meta, dict) else None))
        elif code == Cat.GPU_ANNOTATION:
            name = ev.get("name", "")
            if name.startswith("ProfilerStep"):
                continue
            meta = args.get(ARGUS_ARG)
            c.ann.append((name, ts, dur, _as_int(args.get("External id")), ev.get("tid"), True,
                          meta if isinstance(meta, dict) else None))


# --------------------------------------------------------------------------------------- arrays
# --------------------------------------------------------------------------------------- entry
def read_trace(path: str | Path, on_bytes: Callable[[int], None] | None = None) -> RankTrace:
    """Parse one ``.json`` / ``.json.gz`` Kineto trace. Raises :class:`IngestError` naming the
    file and the problem (truncated gzip, truncated or invalid JSON, no trace events)."""
    import ijson

    path = Path(path)
    t0 = time.perf_counter()
    c = Collected()
    try:
        raw, stream = _open(path, on_bytes)
    except OSError as exc:
        raise IngestError(f"{path}: {_problem(exc, 0)}") from None
    capture = _Capture(stream)
    try:
        with raw:
            _scan(ijson.items(capture, "traceEvents.item", use_float=True), c)
    except Exception as exc:  # ijson, gzip, zlib and malformed-event errors all name the file
        raise IngestError(f"{path}: {_problem(exc, capture.total)}") from None
    meta = _top_level(bytes(capture.head), capture.tail)
    if c.n == 0:
        has_key = b'"traceEvents"' in capture.head or b'"traceEvents"' in capture.tail
        raise IngestError(f"{path}: " + ("the traceEvents array is empty" if has_key else
                                         "no traceEvents array: not a PyTorch Profiler (Kineto) trace"))
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    base = meta.get("baseTimeNanoseconds")
    base_ns = int(base) if isinstance(base, (int, float)) else 0
    rank, source = dist.get("rank"), "distributedInfo"
    if not isinstance(rank, int):
        rank, source = rank_from_filename(path.name), "file name"
        if rank is None:
            source = ""
    world = dist.get("world_size")
    host = meta.get("host_name") or meta.get("hostname") or dist.get("hostname") or dist.get("host")
    notes: list[str] = []
    dropped: dict[str, int] = {}
    steps = build_steps(c, base_ns, notes)
    index = StepIndex(steps)
    pgs = process_groups(dist)
    groups: list[tuple[int, ...]] = []
    phases = build_phases(c, base_ns, index, pgs, groups, dropped)
    kernels = build_kernels(c, base_ns, index, dropped)
    return RankTrace(
        path=str(path), rank=rank, rank_source=source, world_size=world if isinstance(world, int) else None,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        hostname=str(host) if host else None, groups=groups, base_ns=base_ns, steps=steps, phases=phases,
        kernels=kernels, events=c.n, bytes_read=capture.total, file_bytes=path.stat().st_size,
        parse_s=time.perf_counter() - t0, dropped=dropped, notes=notes)
