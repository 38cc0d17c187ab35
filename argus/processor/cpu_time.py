"""CPU time of the ranks' training threads, so that CPU ops are timed like kernels.

On a CPU-only host the kernel channel's stand-in is the ranks' sampled CPU ops, which PyTorch's
op observer times on the wall clock. On a shared host a rank is preempted (four ranks on two
cores run half the time each): an op that happened to be descheduled for 4 ms looks 20× slower
than on its peers, which is not its cost — a GPU kernel's device time has no such tail. The
processor therefore samples each such rank's training thread from outside,
``/proc/<pid>/task/<tid>/schedstat`` (CPU time so far, field 1) every ``interval_s``, and
converts an op's wall interval ``[start, end]`` into the CPU time the thread got during it, by
linear interpolation of that timeline. Preemption inside one sample interval is spread over the
ops of that interval instead of landing on one of them.

Clocks: the producer stamps records with ``time.monotonic_ns()`` plus an offset taken at its
start, which its ``HELLO`` carries (``clock_offset_ns``); the sampler reads the same monotonic
clock, so the two timelines agree exactly on one host. Cost: one ``pread`` per rank per sample
(about 2 µs), only for ranks whose kernel channel is ``cpu_ops``.

**Only while ops are captured.** The ops of one step in N are captured, and only they need the
timeline; a thread waking at 200 Hz all along was half of the processor's CPU on a 2-rank job
(py-spy). Each rank says in its in-flight block whether a capture runs now or is due within
``inflight.OP_CAPTURE_LEAD_S`` (``op_capture``); a rank is sampled at ``interval_s`` while it says
so and for ``HOLD_S`` after, and the thread sleeps ``IDLE_INTERVAL_S`` between looks otherwise.
A rank that says nothing (an older producer) is sampled all along, as before.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import numpy as np

from argus.wire.inflight import CAPTURE_SOON, CAPTURE_UNSAID

__all__ = ["CpuTimeSampler"]

log = logging.getLogger("argus.processor")

HISTORY_S = 120.0  # kernel records of a step arrive after the step: keep this much timeline
IDLE_INTERVAL_S = 0.1  # between looks at the ranks' announcements while none captures
HOLD_S = 0.1  # keep sampling a rank this long after its capture ended (its last ops, the boundary)


class _Timeline:
    def __init__(self, fd: int, offset_ns: int, size: int, capture: Callable[[], int] | None = None):
        self.fd = fd
        self.offset_ns = offset_ns
        self.capture = capture  # the rank's op_capture announcement (None: sample all along)
        self.hot_until = 0.0  # monotonic seconds
        self.t = np.zeros(size, np.int64)  # the producer's clock
        self.cpu = np.zeros(size, np.int64)
        self.n = 0  # samples taken (ring index = n % size)

    def add(self, t: int, cpu: int) -> None:
        i = self.n % len(self.t)
        self.t[i], self.cpu[i] = t, cpu
        self.n += 1

    def ordered(self) -> tuple[np.ndarray, np.ndarray]:
        size = len(self.t)
        if self.n <= size:
            return self.t[:self.n], self.cpu[:self.n]
        i = self.n % size
        return np.concatenate([self.t[i:], self.t[:i]]), np.concatenate([self.cpu[i:], self.cpu[:i]])


class CpuTimeSampler:
    """One thread sampling every registered thread's CPU time."""

    def __init__(self, interval_s: float = 0.005, clock: Callable[[], int] = time.monotonic_ns):
        self.interval_s = interval_s
        self.clock = clock
        self._size = max(int(HISTORY_S / interval_s), 16)
        self._lines: dict[int, _Timeline] = {}  # token → timeline
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, token: int, pid: int, tid: int, offset_ns: int, capture: Callable[[], int] | None = None) -> bool:
        """Sample thread ``tid`` of ``pid``; ``capture`` reads its op_capture announcement."""
        try:
            fd = os.open(f"/proc/{int(pid)}/task/{int(tid)}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError):
            return False
        with self._lock:
            self._lines[token] = _Timeline(fd, int(offset_ns), self._size, capture)
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="argus-cpu-time", daemon=True)
            self._thread.start()
        return True

    def remove(self, token: int) -> None:
        with self._lock:
            line = self._lines.pop(token, None)
        if line is not None:
            os.close(line.fd)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for line in self._lines.values():
                os.close(line.fd)
            self._lines.clear()

    def _loop(self) -> None:
        wait = self.interval_s
        while not self._stop.wait(wait):
            wait = self.sample_once()

    def sample_once(self, now: float | None = None) -> float:
        """One look: sample every rank that captures (or says nothing); the wait until the next."""
        now = time.monotonic() if now is None else now
        with self._lock:
            lines = list(self._lines.values())
        hot = False
        for line in lines:
            if line.capture is not None:
                try:
                    state = int(line.capture())
                except Exception:  # noqa: BLE001 - the ring went away with its rank: sample as before
                    state = CAPTURE_UNSAID
                if state == CAPTURE_SOON:
                    line.hot_until = now + HOLD_S
                elif state != CAPTURE_UNSAID and now >= line.hot_until:
                    continue  # idle, and past the hold after its capture
            hot = True
            try:
                raw = os.pread(line.fd, 96, 0)
                line.add(self.clock() + line.offset_ns, int(raw.split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        return self.interval_s if hot else IDLE_INTERVAL_S

    def cpu_durations(self, token: int, start_ns: np.ndarray, dur_ns: np.ndarray) -> np.ndarray | None:
        """The CPU time the thread got during each ``[start, start + dur]`` (None: no timeline);
        intervals outside the timeline keep their wall duration."""
        with self._lock:
            line = self._lines.get(token)
            if line is None or line.n < 2:
                return None
            t, cpu = line.ordered()
        end = start_ns + dur_ns
        inside = (start_ns >= t[0]) & (end <= t[-1])
        got = np.interp(end.astype(np.float64), t, cpu) - np.interp(start_ns.astype(np.float64), t, cpu)
        return np.where(inside, np.clip(np.rint(got), 0, dur_ns), dur_ns).astype(np.int64)
