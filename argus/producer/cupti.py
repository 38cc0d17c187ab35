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
import logging
import time
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from argus.producer.recorder import KIND, Recorder, now_ns
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

        profiler.profile._prepare_trace = _prepare_trace
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
        """On CUPTI's thread: records → one vectorised write into the ring."""
        c0 = time.thread_time_ns()
        try:
            cupti = self._cupti
            name_id = self.recorder.name_id
            rows = []
            for a in activities:
                if a.kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.KERNEL):
                    name, kind = demangle(str(a.name)), KIND["kernel"]
                elif a.kind == cupti.ActivityKind.MEMCPY:
                    name, kind = f"Memcpy {cupti.ActivityMemcpyKind(a.copy_kind).name}", KIND["memcpy"]
                elif a.kind == cupti.ActivityKind.MEMSET:
                    name, kind = "Memset", KIND["memset"]
                else:
                    continue
                rows.append((-1, int(a.start) + self.offset, int(a.end - a.start), name_id(name),
                             int(a.stream_id), int(a.device_id), kind))
            if rows:
                records = np.array(rows, dtype=DTYPES[Msg.KERNELS])
                self.recorder.kernels(records)
        except Exception as exc:  # noqa: BLE001 - CUPTI's thread must not die
            log.debug("argus: CUPTI buffer dropped: %s", exc)
        self.cpu_ns += time.thread_time_ns() - c0

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
