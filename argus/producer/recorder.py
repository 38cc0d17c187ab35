"""In-process event buffers: what the training thread touches.

The hot path is a ``deque.append`` of a small tuple (≈ 0.1 µs) after one length check; the
transport thread drains the deques (``popleft`` is atomic, so no append is ever lost to a
race) and packs them into the wire dtypes. Buffers are
bounded: beyond ``capacity`` events are dropped and counted (the counts go to the
processor as data). Times are ``time.monotonic_ns()`` shifted once, at start, to wall-clock
nanoseconds — monotonic within the process, comparable across hosts (NTP) — matching the
processor's own samplers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["Recorder", "now_ns", "CATEGORY", "GROUP", "KIND"]

_OFFSET = time.time_ns() - time.monotonic_ns()


def now_ns() -> int:
    return time.monotonic_ns() + _OFFSET


CATEGORY = {"compute": 0, "comm": 1, "host": 2}
GROUP = {"": 0, "tp": 1, "cp": 2, "ep": 3, "dp": 4, "edp": 5, "pp": 6, "world": 7}
KIND = {"kernel": 0, "memcpy": 1, "memset": 2, "cpu_op": 3}
TABLES = ("steps", "phases", "kernels", "stacks", "hw", "frames")


@dataclass
class Recorder:
    capacity: int = 200_000
    steps: deque = field(default_factory=deque)  # (step, start_ns, end_ns)
    phases: deque = field(default_factory=deque)  # (step, start_ns, dur_ns, microbatch, name_id, category, group, wait_ns)
    kernels: deque = field(default_factory=deque)  # (step, start_ns, dur_ns, name_id, stream, device, kind)
    stacks: deque = field(default_factory=deque)  # (step, start_ns, end_ns, frames_id, thread_id, count)
    dropped: dict = field(default_factory=lambda: {t: 0 for t in TABLES})
    names: dict = field(default_factory=dict)  # string → id (the transport sends new ones once)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def name_id(self, name: str) -> int:
        found = self.names.get(name)
        if found is None:
            with self._lock:
                found = self.names.setdefault(name, len(self.names))
        return found

    def phase(self, step: int, start_ns: int, end_ns: int, microbatch: int, name: str, category: str,
              group: str = "", wait_ns: int = -1) -> None:
        if len(self.phases) >= self.capacity:
            self.dropped["phases"] += 1
            return
        self.phases.append((step, start_ns, end_ns - start_ns if end_ns >= 0 else -1, microbatch,
                            self.name_id(name), CATEGORY[category], GROUP.get(group, 0), wait_ns))

    def step(self, step: int, start_ns: int, end_ns: int) -> None:
        if len(self.steps) >= self.capacity:
            self.dropped["steps"] += 1
            return
        self.steps.append((step, start_ns, end_ns))

    def kernel_batch(self, rows: list) -> None:
        room = self.capacity - len(self.kernels)
        if room < len(rows):
            self.dropped["kernels"] += len(rows) - max(room, 0)
            rows = rows[:max(room, 0)]
        self.kernels.extend(rows)

    def stack_batch(self, rows: list) -> None:
        room = self.capacity - len(self.stacks)
        if room < len(rows):
            self.dropped["stacks"] += len(rows) - max(room, 0)
            rows = rows[:max(room, 0)]
        self.stacks.extend(rows)

    def drain(self) -> dict[str, list]:
        """Take everything buffered so far (called by the transport thread)."""
        out = {}
        for table in ("steps", "phases", "kernels", "stacks"):
            q = getattr(self, table)
            out[table] = [q.popleft() for _ in range(len(q))]
        return out
