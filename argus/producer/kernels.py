"""The kernel channel, behind one interface: CUPTI activity records on NVIDIA GPUs, a sampled
op-level source on CPU-only machines.

* ``CuptiSource`` (NVIDIA's ``cupti-python``): concurrent kernels, memcpy and memset with
  name, start, end, stream, device, correlation. CUPTI fills its buffers asynchronously and
  calls back on its own thread with the completed records; the training thread does no
  per-record work. Records carry step -1: the processor places them in steps by time.
  CUPTI timestamps are aligned to the producer clock once, at start.
* ``CpuOpSource``: every aten op of one step in ``op_sample_every`` (a ``TorchDispatchMode``
  entered at that step's start), labelled ``cpu_op``; an op's duration is the thread's CPU
  time during it (like a kernel's device time, it excludes preemption on a shared host). Sampling keeps the overhead within the
  budget: a Python callback per op is ~several µs, paid one step in N.

``select_source`` picks CUPTI when a CUDA device and ``cupti-python`` work, else the CPU
source; ``kernels="off"`` disables the channel.
"""

from __future__ import annotations

import logging
from time import thread_time_ns
from typing import Any

from argus.producer.recorder import KIND, Recorder, now_ns

__all__ = ["KernelSource", "CpuOpSource", "CuptiSource", "select_source"]

log = logging.getLogger("argus.producer")


class KernelSource:
    name = "off"

    def start(self) -> None: ...

    def on_step(self, step: int) -> None: ...

    def flush(self) -> None: ...

    def stop(self) -> None: ...


class CpuOpSource(KernelSource):
    """aten ops of sampled steps, timed on the CPU."""

    name = "cpu_ops"

    def __init__(self, recorder: Recorder, every: int):
        self.recorder = recorder
        self.every = every
        self.mode: Any = None
        self.rows: list = []
        self.step = 0

    def _make_mode(self) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        source = self
        names: dict[Any, int] = {}

        class _ArgusOpMode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                t0, c0 = now_ns(), thread_time_ns()
                out = func(*args, **(kwargs or {}))
                nid = names.get(func)
                if nid is None:
                    nid = names[func] = source.recorder.name_id(str(func.overloadpacket))
                # duration = the thread's CPU time, like a GPU kernel's device time: preemption
                # by other processes on a shared host is not the op's cost
                source.rows.append((source.step, t0, thread_time_ns() - c0, nid, 0, -1, KIND["cpu_op"]))
                return out

        return _ArgusOpMode()

    def on_step(self, step: int) -> None:
        """Called at a step boundary on the training thread."""
        if self.mode is not None:
            self.mode.__exit__(None, None, None)
            self.mode = None
            self.recorder.kernel_batch(self.rows)
            self.rows = []
        if step % self.every == 0:
            self.step = step
            self.mode = self._make_mode()
            self.mode.__enter__()

    def stop(self) -> None:
        if self.mode is not None:
            try:
                self.mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - exiting on another thread at shutdown
                pass
            self.mode = None


class CuptiSource(KernelSource):
    """CUPTI activity API through ``cupti-python`` (NVIDIA GPUs)."""

    name = "cupti"
    BUFFER_BYTES = 8 << 20

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.offset = 0
        self.kinds: list[Any] = []

    def start(self) -> None:
        from cupti import cupti

        self.cupti = cupti
        self.kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET]
        for kind in self.kinds:
            cupti.activity_enable(kind)
        cupti.activity_register_callbacks(self._requested, self._completed)
        self.offset = now_ns() - int(cupti.get_timestamp())

    def _requested(self) -> tuple[int, int]:
        return self.BUFFER_BYTES, 0

    def _completed(self, activities: list) -> None:
        """On CUPTI's thread: records → rows for the recorder."""
        try:
            cupti = self.cupti
            rows = []
            name_id = self.recorder.name_id
            for a in activities:
                if a.kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.KERNEL):
                    name, kind = a.name, KIND["kernel"]
                elif a.kind == cupti.ActivityKind.MEMCPY:
                    name, kind = f"Memcpy {cupti.ActivityMemcpyKind(a.copy_kind).name}", KIND["memcpy"]
                elif a.kind == cupti.ActivityKind.MEMSET:
                    name, kind = "Memset", KIND["memset"]
                else:
                    continue
                rows.append((-1, int(a.start) + self.offset, int(a.end - a.start), name_id(name),
                             int(a.stream_id), int(a.device_id), kind))
            self.recorder.kernel_batch(rows)
        except Exception as exc:  # noqa: BLE001 - CUPTI's thread must not die
            log.debug("argus: CUPTI buffer dropped: %s", exc)

    def flush(self) -> None:
        try:
            self.cupti.activity_flush_all(0)
        except Exception:  # noqa: BLE001
            pass

    def stop(self) -> None:
        try:
            self.cupti.activity_flush_all(1)
            for kind in self.kinds:
                self.cupti.activity_disable(kind)
        except Exception:  # noqa: BLE001
            pass


def select_source(mode: str, recorder: Recorder, op_sample_every: int) -> KernelSource:
    """``auto``: CUPTI when a CUDA device and cupti-python work, else sampled CPU ops."""
    if mode == "off":
        return KernelSource()
    if mode in ("auto", "cupti"):
        try:
            import torch

            if torch.cuda.is_available():
                source = CuptiSource(recorder)
                source.start()
                return source
            if mode == "cupti":
                log.warning("argus: kernels=cupti but no CUDA device; using CPU ops")
        except Exception as exc:  # noqa: BLE001 - NotSupportedError, missing library…
            log.warning("argus: CUPTI unavailable (%s); using CPU ops", exc)
    return CpuOpSource(recorder, op_sample_every)
