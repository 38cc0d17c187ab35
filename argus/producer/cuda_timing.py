"""GPU timing without synchronising the training thread.

On a CUDA device a phase's start and end are CUDA events recorded on the current stream
(the stream the work runs on); a background thread polls ``event.query()`` and, once both
have completed, turns them into timestamps: a reference event recorded with its CPU time
at each step start gives ``t = ref_cpu_ns + ref.elapsed_time(event)``. The training thread
only records events. On CPU the producer uses the monotonic clock instead and this module
is never loaded.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from argus.producer.recorder import now_ns

__all__ = ["CudaTimer"]


class CudaTimer:
    def __init__(self, emit: Callable[[int, int, tuple], None], device: int = 0, poll_s: float = 0.05):
        import torch

        self.torch = torch
        self.device = device
        self.emit = emit  # (start_ns, end_ns, meta) → recorder
        self.pending: deque = deque()
        self.ref: tuple[Any, int] | None = None
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._thread = threading.Thread(target=self._loop, name="argus-cuda-events", daemon=True)

    def start(self) -> None:
        self.rebase()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def rebase(self) -> None:
        """A fresh reference (CPU time ↔ GPU event); called at step starts to bound drift."""
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        self.ref = (ev, now_ns())

    def mark(self) -> Any:
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return (ev, self.ref)

    def phase(self, start: Any, end: Any, meta: tuple) -> None:
        self.pending.append((start, end, meta))

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            self.resolve()

    def resolve(self) -> None:
        n = len(self.pending)
        for _ in range(n):
            start, end, meta = self.pending.popleft()
            (ev0, ref0), (ev1, _) = start, end
            try:
                if not ev1.query():
                    self.pending.appendleft((start, end, meta))
                    return  # later events are not done either (one stream, in order)
                ref_ev, ref_ns = ref0
                t0 = ref_ns + int(ref_ev.elapsed_time(ev0) * 1e6)
                t1 = t0 + int(ev0.elapsed_time(ev1) * 1e6)
                self.emit(t0, t1, meta)
            except Exception:  # noqa: BLE001 - a destroyed context at exit: drop the phase
                continue
