"""In-process stack sampler: the fallback when the processor cannot use py-spy (no ptrace).

A daemon thread reads the training thread's frame (``sys._current_frames``) at ``hz`` and
aggregates folded stacks (root first, ``function (file:line)`` joined by ``;``, py-spy's
format) per step; the transport ships the counts. Cost: one frame walk per sample.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, cast

from argus.producer.recorder import Recorder, now_ns

__all__ = ["StackSampler", "fold"]


_OWN = ("argus/producer/",)  # our own hooks: their cost is ours, the stack is the caller's
_TRAMPOLINES = ("torch/_compile.py", "torch/_dynamo/eval_frame.py", "torch/utils/_python_dispatch.py")


def fold(frame: Any, limit: int = 64) -> str:
    """Root-first folded stack without Argus's own hook frames (and the dispatch trampolines
    that lead into them), so an op captured by the producer is not read as, say, a
    ``torch/_dynamo`` compile stall. User code called *from* a hook (a tensor hook run under
    the producer's backward hook) stays: it is what the host was doing."""
    parts: list[str] = []
    files: list[str] = []
    while frame is not None and len(parts) < limit:
        code = frame.f_code
        parts.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
        files.append(code.co_filename.replace("\\", "/"))
        frame = frame.f_back
    parts.reverse()
    files.reverse()
    own = [any(o in f for o in _OWN) for f in files]
    for i in range(len(files) - 2, -1, -1):  # trampolines right before our frames are ours too
        if own[i + 1] and any(t in files[i] for t in _TRAMPOLINES):
            own[i] = True
    kept = [p for p, o in zip(parts, own) if not o]
    return ";".join(kept) or "argus (producer)"


class StackSampler:
    def __init__(self, recorder: Recorder, runtime: Any, hz: float, thread_ident: int | None = None):
        self.recorder = recorder
        self.rt = runtime
        self.hz = hz
        # the main thread is running, so it has an ident
        self.target = cast(int, thread_ident or threading.main_thread().ident)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="argus-stacks", daemon=True)
        self._agg: dict[tuple[int, str], list[int]] = {}
        self.cpu_ns = 0  # this thread's CPU time so far (read by the transport thread)

    def start(self) -> None:
        self._thread.start()

    def set_rate(self, hz: float) -> None:
        self.hz = max(hz, 0.1)

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        thread_name = self.recorder.name_id("MainThread")
        last_drain = now_ns()
        while not self._stop.wait(1.0 / self.hz):
            self.cpu_ns = time.thread_time_ns()
            frame = sys._current_frames().get(self.target)
            if frame is None:
                continue
            key = (self.rt.step, fold(frame))
            t = now_ns()
            entry = self._agg.get(key)
            if entry is None:
                self._agg[key] = [1, t, t]
            else:
                entry[0] += 1
                entry[2] = t
            if len(self._agg) > 256 or t - last_drain > 1_000_000_000:
                self.drain(thread_name)
                last_drain = t
        self.drain(thread_name)

    def drain(self, thread_name: int | None = None) -> None:
        """Hand the aggregated counts to the recorder (on the sampler's own thread only)."""
        agg, self._agg = self._agg, {}
        tid = thread_name if thread_name is not None else self.recorder.name_id("MainThread")
        rows = [(step, t0, t1, self.recorder.name_id(frames), tid, count)
                for (step, frames), (count, t0, t1) in agg.items()]
        if rows:
            self.recorder.stacks(rows)
