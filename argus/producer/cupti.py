"""GPU kernels from CUPTI's activity API (NVIDIA's ``cupti-python``, the ``gpu`` extra).

Concurrent kernels, memcpy and memset with name, start, end, stream and device. CUPTI fills
its buffers asynchronously and hands completed ones to a callback on its own thread; the
training thread does no per-record work. Records carry step -1: the processor places them
in steps by time. CUPTI's timestamps are on the GPU's clock as CUPTI exposes it
(``cupti.get_timestamp``); the offset to the producer's clock is taken once at start and
refreshed on every :meth:`CuptiSource.flush` (once per window), bounding drift.

Kernel names arrive mangled when CUPTI has no demangled form (``_Z28ncclDevKernel_…``):
they are demangled with the C++ runtime's ``__cxa_demangle`` where it exists, and the store
side (``compress/names.py``) reads identifiers out of any name still mangled, so an NCCL
kernel is never classed as compute.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from functools import lru_cache
from typing import Any

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

    def __init__(self, recorder: Recorder, cupti_module: Any = None):
        self.recorder = recorder
        self.offset = 0
        self.kinds: list[Any] = []
        self.cpu_ns = 0  # CPU our callbacks used on CUPTI's thread
        self._cupti = cupti_module  # tests pass a fake of cupti-python's module

    def start(self) -> None:
        if self._cupti is None:
            from cupti import cupti

            self._cupti = cupti
        cupti = self._cupti
        self.kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET]
        for kind in self.kinds:
            cupti.activity_enable(kind)
        cupti.activity_register_callbacks(self._requested, self._completed)
        self._align()

    def _align(self) -> None:
        self.offset = now_ns() - int(self._cupti.get_timestamp())

    def on_step(self, step: int) -> None: ...

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
        try:
            self._cupti.activity_flush_all(0)
            self._align()
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        try:
            self._cupti.activity_flush_all(1)
            for kind in self.kinds:
                self._cupti.activity_disable(kind)
        except Exception:  # noqa: BLE001
            pass
