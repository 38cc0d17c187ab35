"""The kernel channel, behind one interface: CUPTI activity records on NVIDIA GPUs
(``cupti.py``), sampled CPU ops elsewhere.

**CPU ops** (``CpuOpSource``): every aten op of one step in ``op_sample_every``, recorded by
PyTorch's own op observer — the CPU-only legacy profiler (``RecordFunction`` callbacks in
C++, about 1.5 µs an op, enabled at the sampled step's start and disabled at its end). It
changes no dispatch: compiled graphs compile and run the same (``torch.compile`` sees no mode),
results are bit-identical, and nothing Python-level runs per op. Recorded are the ops that
do their own work (most of their time outside the ops they call: ``aten::addmm``, not the
``aten::linear`` around it — like GPU kernels, the work itself; named ``ns::op``, so not the
annotations PyTorch and users add, such as ``enumerate(DataLoader)#…``), labelled ``cpu_op``, timed
on the wall clock at microsecond resolution. Compiled regions appear as their extern kernels
(inductor's fused C++ kernels are not ops). It steps aside rather than collide:

* never while another profiler is on, and a user's ``torch.profiler`` that starts while a
  sample runs ends the sample first (``torch.autograd.profiler.profile._prepare_trace``);
* never across ``fork``: the sample ends before a fork, so DataLoader workers do not inherit
  an observer nobody would stop;
* never on a CUDA device (CUPTI is the channel there).

``select_source`` picks CUPTI when a CUDA device and ``cupti-python`` work, else the CPU
source; ``kernels="off"`` disables the channel.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from argus.producer.recorder import KIND, Recorder, now_ns
from argus.vocab import KernelKind
from argus.wire import DTYPES, Msg
from argus.wire.inflight import CAPTURE_IDLE, CAPTURE_SOON, OP_CAPTURE_LEAD_S

if TYPE_CHECKING:
    from argus.producer.cupti import CuptiSource

__all__ = ["KernelSource", "CpuOpSource", "select_source", "working_ops"]

log = logging.getLogger("argus.producer")


class KernelSource:
    name = "off"

    def start(self) -> None: ...

    def on_step(self, step: int) -> None: ...

    def flush(self) -> None: ...

    def stop(self) -> None: ...


def working_ops(events: list, offset_ns: int, name_id: Any, step: int) -> np.ndarray:
    """Kernel records of the ops that do their own work — at least half of an op's time is
    outside the ops it calls (``aten::addmm``, not ``aten::linear`` around it) — from one
    thread's legacy-profiler events (``push``/``pop`` pairs, nested, matched by handle)."""
    stack: list[list] = []  # [handle, name, start_us, time in children (us)]
    rows = []
    for e in events:
        kind = e.kind()
        if kind == "push":
            stack.append([e.handle(), e.name(), e.start_us(), 0.0])
        elif kind == "pop" and stack:
            handle = e.handle()
            while stack and stack[-1][0] != handle:  # an unmatched push (cut by the sample's end)
                stack.pop()
            if not stack:
                continue
            _, name, start_us, children_us = stack.pop()
            total_us = max(e.start_us() - start_us, 0.0)
            if stack:
                stack[-1][3] += total_us
            if _is_op(name) and total_us - children_us >= 0.5 * total_us:
                rows.append((step, int(start_us * 1000) + offset_ns, int(total_us * 1000), name_id(name), 0, -1,
                             KIND[KernelKind.CPU_OP]))
    out = np.zeros(len(rows), DTYPES[Msg.KERNELS])
    if rows:
        cols = list(zip(*rows))
        # a structured dtype: names is never None (numpy's stubs allow it for plain dtypes)
        for i, field in enumerate(DTYPES[Msg.KERNELS].names):  # type: ignore[arg-type]
            out[field] = cols[i]
    return out


def _is_op(name: str) -> bool:
    """A compute op of the dispatcher (``aten::addmm``), not communication (``c10d::``: its time
    is waiting, the semantic channel has it) nor a scope around work: user and
    library annotations (``enumerate(DataLoader)#…``, ``Optimizer.step#…``) and the autograd
    engine's per-node scopes (``autograd::engine::evaluate_function: MmBackward0``), whose own
    time is whatever Python ran inside them — a tensor hook, a stall."""
    return "::" in name and not name.startswith(("autograd::", "profiler::", "c10d::")) and " " not in name


class CpuOpSource(KernelSource):
    """aten ops of sampled steps, through PyTorch's CPU op observer."""

    name = "cpu_ops"

    def __init__(self, recorder: Recorder, every: int):
        self.recorder = recorder
        self.every = every
        self.capturing = False
        self.step = 0
        self.offset_ns = 0
        self._pid = os.getpid()
        self._patched: tuple[Any, Any] | None = None
        self.cpu_ns = 0  # training-thread CPU spent reading the samples (the observer's own cost is not in it)
        self._last_step_t: float | None = None
        self._clock = time.monotonic
        self._said = -1  # the op_capture state last written to the in-flight block

    def start(self) -> None:
        from torch.autograd import profiler

        original = profiler.profile._prepare_trace
        source = self

        @functools.wraps(original)
        def _prepare_trace(prof: Any) -> Any:
            source.end_sample()  # the user's profiler wins
            return original(prof)

        setattr(profiler.profile, "_prepare_trace", _prepare_trace)
        self._patched = (profiler.profile, original)
        os.register_at_fork(before=self._before_fork)
        self._announce(0)  # idle until the first capture comes near

    def _before_fork(self) -> None:
        if os.getpid() == self._pid:
            self.end_sample()

    def on_step(self, step: int) -> None:
        """Called at a step boundary on the training thread."""
        self.end_sample()
        if step % self.every == 0 and step > 0:  # step 0 is warm-up (and model building)
            self._begin(step)
        self._announce(step)

    def _announce(self, step: int) -> None:
        """Tell the processor (the in-flight block) whether a capture runs now or starts within
        ``OP_CAPTURE_LEAD_S``: its CPU-time sampler, which times the captured ops, then samples
        this thread at its fast rate, and idles otherwise (at 200 Hz always, it was half of the
        processor's CPU on a 2-rank job). Steps ahead are judged by the last step's duration."""
        now = self._clock()
        last, self._last_step_t = self._last_step_t, now
        step_s = now - last if last is not None else 0.0
        due = (step // self.every + 1) * self.every - step  # steps until the next capture after this step's
        soon = self.capturing or due <= 1 or (last is not None and due * step_s <= OP_CAPTURE_LEAD_S)
        state = CAPTURE_SOON if soon else CAPTURE_IDLE
        if state != self._said:
            try:
                self.recorder.ring.inflight.op_capture(state)
                self._said = state
            except Exception:  # noqa: BLE001 - a ring without the block (tests): nothing to tell
                pass

    def _begin(self, step: int) -> None:
        import torch
        from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

        if torch.autograd._profiler_enabled():
            return
        config = ProfilerConfig(ProfilerState.CPU, False, False, False, False, False, _ExperimentalConfig())
        self.step = step
        t = now_ns()
        torch.autograd._enable_profiler_legacy(config)
        self.capturing = True
        self.offset_ns = t  # refined from the start mark below

    def end_sample(self) -> None:
        if not self.capturing or os.getpid() != self._pid:
            return
        import torch

        self.capturing = False
        c0 = time.thread_time_ns()
        try:
            threads = torch.autograd._disable_profiler_legacy()
        except RuntimeError:  # someone else stopped it
            return
        mark = next((e for events in threads for e in events if e.kind() == "mark"), None)
        # the legacy events have start_us; torch's stubs leave it out of ProfilerEvent
        offset = self.offset_ns - int(mark.start_us() * 1000) if mark is not None else 0  # type: ignore[attr-defined]
        for events in threads:
            records = working_ops(events, offset, self.recorder.name_id, self.step)
            if len(records):
                self.recorder.kernels(records)
        self.cpu_ns += time.thread_time_ns() - c0

    def stop(self) -> None:
        try:
            self.end_sample()
        except Exception:  # noqa: BLE001 - at shutdown, perhaps on another thread
            pass
        if self._patched is not None:
            owner, original = self._patched
            owner._prepare_trace = original
            self._patched = None


def select_source(mode: str, recorder: Recorder, op_sample_every: int) -> KernelSource | CuptiSource:
    """``auto``: CUPTI when a CUDA device and cupti-python work, else sampled CPU ops."""
    if mode == "off":
        return KernelSource()
    if mode in ("auto", "cupti"):
        try:
            import torch

            if torch.cuda.is_available():
                from argus.producer.cupti import CuptiSource

                cupti_source = CuptiSource(recorder)
                cupti_source.start()
                return cupti_source
            if mode == "cupti":
                log.warning("argus: kernels=cupti but no CUDA device; using CPU ops")
        except Exception as exc:  # noqa: BLE001 - NotSupportedError, missing library…
            log.warning("argus: CUPTI unavailable (%s); kernel channel off", exc)
            return KernelSource()
    source = CpuOpSource(recorder, op_sample_every)
    source.start()
    return source
