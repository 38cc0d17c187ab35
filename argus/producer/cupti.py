"""GPU kernels from CUPTI's activity API (NVIDIA's ``cupti-python``, the ``gpu`` extra).

Concurrent kernels, memcpy and memset with name, start, end, stream and device. CUPTI fills
its buffers asynchronously and hands completed ones to a callback on its own thread; the
training thread does no per-record work. Records carry step -1: the processor places them
in steps by time. CUPTI's timestamps are on the GPU's clock as CUPTI exposes it
(``cupti.get_timestamp``); the offset to the producer's clock is taken once at start and
refreshed on every :meth:`CuptiSource.flush` (once per window), bounding drift.

CUPTI has one set of activity callbacks per process. A user's ``torch.profiler`` (or Kineto's
on-demand trace) takes it over, and disables the activity kinds when it stops — Argus's
kernel channel would then stay silent for the rest of the job. So Argus steps aside: before a
``torch.profiler`` session prepares its trace (``profile._prepare_trace``), or at the first step
boundary where another profiler is on (``torch.autograd._profiler_enabled()``: on-demand traces
too), it flushes its buffers and disables its kinds; at the first step boundary after the
other profiler stopped it registers its callbacks and enables its kinds again. The steps it
stood aside are counted (``gap_steps``); the step-boundary and collective timing, which do
not use CUPTI, go on meanwhile.

Kernel names arrive mangled when CUPTI has no demangled form (``_Z28ncclDevKernel_…``):
they are demangled with the C++ runtime's ``__cxa_demangle`` where it exists, and the store
side (``compress/names.py``) reads identifiers out of any name still mangled, so an NCCL
kernel is never classed as compute.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import itertools
import logging
import operator
import time
from functools import lru_cache
from typing import Any, Callable, cast

import numpy as np

from argus.producer.recorder import KIND, Recorder, now_ns
from argus.vocab import KernelKind
from argus.wire import DTYPES, Msg

__all__ = ["CuptiSource", "demangle"]

log = logging.getLogger("argus.producer")


@lru_cache(maxsize=1)
def _cxa_demangle() -> Any:
    for name in (ctypes.util.find_library("stdc++"), "libstdc++.so.6"):
        if not name:
            continue
        try:
            fn = ctypes.CDLL(name).__cxa_demangle
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                       ctypes.POINTER(ctypes.c_int)]
        return fn
    return None


_free = ctypes.CDLL(None).free
_free.argtypes = [ctypes.c_void_p]


@lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """``name`` demangled (Itanium C++ ABI) when it is mangled and the runtime can; else as is."""
    if not name.startswith("_Z"):
        return name
    fn = _cxa_demangle()
    if fn is None:
        return name
    status = ctypes.c_int(0)
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace") if status.value == 0 else name
    finally:
        _free(ptr)


_COLUMNS = operator.attrgetter("kind", "start", "end", "stream_id", "device_id")


_NAME = operator.attrgetter("name")


def _columns(activities: list) -> np.ndarray:
    """(kind, start, end, stream_id, device_id) of each record as one int64 array: one C-level
    getter call per record, the values streamed into numpy without a list of tuples."""
    flat = itertools.chain.from_iterable(map(_COLUMNS, activities))
    return np.fromiter(flat, dtype=np.int64, count=5 * len(activities)).reshape(-1, 5)


def _memcpy_key(a: Any) -> tuple[str, int]:
    return (KernelKind.MEMCPY, int(a.copy_kind))


class CuptiSource:
    """CUPTI activity API through ``cupti-python`` (NVIDIA GPUs)."""

    name = "cupti"
    BUFFER_BYTES = 8 << 20

    def __init__(self, recorder: Recorder, cupti_module: Any = None,
                 other_profiler: Callable[[], bool] | None = None):
        self.recorder = recorder
        self.offset = 0
        self.kinds: list[Any] = []
        self.cpu_ns = 0  # CPU our callbacks used on CUPTI's thread
        self._cupti = cupti_module  # tests pass a fake of cupti-python's module
        self._other_profiler = other_profiler or _torch_profiler_on
        self.aside = False  # another profiler holds CUPTI
        self.asides = 0  # times Argus stepped aside …
        self.gap_steps = 0  # … and the step boundaries it spent aside
        self._patched: tuple[Any, Any] | None = None
        self._names: dict[Any, int] = {}  # raw name (or memcpy/memset key) → ring name id

    def start(self) -> None:
        if self._cupti is None:
            from cupti import cupti

            self._cupti = cupti
        cupti = self._cupti
        self.kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET]
        self._subscribe()
        self._patch_profiler()

    def _subscribe(self) -> None:
        cupti = self._cupti
        for kind in self.kinds:
            cupti.activity_enable(kind)
        cupti.activity_register_callbacks(self._requested, self._completed)
        self._align()

    def _patch_profiler(self) -> None:
        """Step aside as a ``torch.profiler`` session prepares its trace, before Kineto takes
        CUPTI over (a step boundary may be a whole step later)."""
        try:
            from torch.autograd import profiler
        except Exception:  # noqa: BLE001 - no torch: nothing to coexist with
            return
        original = profiler.profile._prepare_trace
        source = self

        @functools.wraps(original)
        def _prepare_trace(prof: Any) -> Any:
            source.step_aside()
            return original(prof)

        setattr(profiler.profile, "_prepare_trace", _prepare_trace)
        self._patched = (profiler.profile, original)

    def step_aside(self) -> None:
        """Flush what CUPTI holds for Argus and give the activity kinds up."""
        if self.aside:
            return
        self.aside = True
        self.asides += 1
        self._unsubscribe()
        log.info("argus: another profiler holds CUPTI; the kernel channel waits for it")

    def _resume(self) -> None:
        try:
            self._subscribe()
            self.aside = False
            log.info("argus: the kernel channel resumed after %d step(s) aside", self.gap_steps)
        except Exception as exc:  # noqa: BLE001 - try again at the next step
            log.debug("argus: CUPTI resubscribe failed: %s", exc)

    def _align(self) -> None:
        self.offset = now_ns() - int(self._cupti.get_timestamp())

    def on_step(self, step: int) -> None:
        """At a step boundary (training thread): step aside while another profiler is on,
        take CUPTI back once it is off."""
        try:
            other = self._other_profiler()
        except Exception:  # noqa: BLE001
            return
        if other and not self.aside:
            self.step_aside()
        elif not other and self.aside:
            self._resume()
        if self.aside:
            self.gap_steps += 1

    def _requested(self) -> tuple[int, int]:
        return self.BUFFER_BYTES, 0

    def _completed(self, activities: list) -> None:
        """On CUPTI's thread, which holds the GIL while it runs: records → one write into the ring.

        Columns are read with one C-level getter per record and converted by numpy; names are
        resolved once per distinct raw name (a kernel mix has tens of names in 10⁴–10⁵ records),
        so the Python work per record is one attribute tuple, not a branch ladder, a demangle
        lookup and a row tuple (``argus bench cupti``: µs per record, both ways)."""
        c0 = time.thread_time_ns()
        try:
            records = self.rows(activities)
            if len(records):
                self.recorder.kernels(records)
        except Exception as exc:  # noqa: BLE001 - CUPTI's thread must not die
            log.debug("argus: CUPTI buffer dropped: %s", exc)
        self.cpu_ns += time.thread_time_ns() - c0

    def rows(self, activities: list) -> np.ndarray:
        """Kernel, memcpy and memset activity records as ``DTYPES[Msg.KERNELS]`` rows, in order."""
        out_dtype = DTYPES[Msg.KERNELS]
        if not activities:
            return np.empty(0, dtype=out_dtype)
        kinds = self._cupti.ActivityKind
        try:
            cols = _columns(activities)
        except (AttributeError, TypeError, ValueError):
            # a kind we did not enable (another subscriber's) may lack these fields: ours only
            ours = {int(kinds.CONCURRENT_KERNEL), int(kinds.KERNEL), int(kinds.MEMCPY), int(kinds.MEMSET)}
            activities = [a for a in activities if int(a.kind) in ours]
            if not activities:
                return np.empty(0, dtype=out_dtype)
            cols = _columns(activities)
        kind = cols[:, 0]
        is_kernel = (kind == int(kinds.CONCURRENT_KERNEL)) | (kind == int(kinds.KERNEL))
        is_memcpy, is_memset = kind == int(kinds.MEMCPY), kind == int(kinds.MEMSET)
        keep = np.flatnonzero(is_kernel | is_memcpy | is_memset)
        out = np.empty(len(keep), dtype=out_dtype)
        sel = cols[keep]
        out["step"] = -1  # the processor places them in steps by time
        out["start_ns"] = sel[:, 1] + self.offset
        out["dur_ns"] = sel[:, 2] - sel[:, 1]
        out["stream"], out["device"] = sel[:, 3], sel[:, 4]
        out["kind"] = np.where(is_kernel[keep], KIND[KernelKind.KERNEL],
                               np.where(is_memcpy[keep], KIND[KernelKind.MEMCPY], KIND[KernelKind.MEMSET]))
        names = np.empty(len(keep), dtype=np.int64)
        for mask, key in ((is_kernel[keep], _NAME), (is_memcpy[keep], _memcpy_key)):
            at = np.flatnonzero(mask)
            if len(at):
                names[at] = self._name_ids(list(map(key, map(activities.__getitem__, keep[at].tolist()))))
        at = np.flatnonzero(is_memset[keep])
        if len(at):
            names[at] = self._name_ids([(KernelKind.MEMSET,)])[0]
        out["name"] = names
        return out

    def _name_ids(self, keys: list) -> list[int]:
        """Ring name ids for raw names (demangled, or memcpy/memset labels), each resolved once."""
        cache = self._names
        ids = list(map(cache.get, keys))
        if None in ids:
            for j, key in enumerate(keys):
                if ids[j] is None:
                    if key not in cache:
                        cache[key] = self.recorder.name_id(self._label(key))
                    ids[j] = cache[key]
        return cast(list[int], ids)  # every None filled above

    def _label(self, key: Any) -> str:
        if not isinstance(key, tuple):
            return demangle(str(key))
        if key[0] == KernelKind.MEMCPY:
            return f"Memcpy {self._cupti.ActivityMemcpyKind(key[1]).name}"
        return "Memset"

    def flush(self) -> None:
        if self.aside:
            return
        try:
            self._cupti.activity_flush_all(0)
            self._align()
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        if self._patched is not None:
            owner, original = self._patched
            owner._prepare_trace = original
            self._patched = None
        if not self.aside:
            self._unsubscribe()

    def _unsubscribe(self) -> None:
        """Flush what CUPTI holds for Argus, then give the activity kinds up."""
        try:
            self._cupti.activity_flush_all(1)
            for kind in self.kinds:
                self._cupti.activity_disable(kind)
        except Exception:  # noqa: BLE001
            pass


def _torch_profiler_on() -> bool:
    """Whether a profiler other than Argus's is on in this process (a CUPTI job samples no
    CPU ops, so the autograd profiler's state is never Argus's own here)."""
    import torch

    return bool(torch.autograd._profiler_enabled())
