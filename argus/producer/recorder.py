"""What the training thread touches: records written straight into the rank's ring.

Each call packs one record of the wire dtypes into the shared-memory ring
(``argus.wire.ring``): about a microsecond, no syscall, never blocking, and on the
processor's side of the fence the moment it returns — so a rank that dies the next
instant has lost nothing it recorded. A full ring (processor absent or far behind) drops
the record and counts it in the ring, where the processor reads the counts as data.

Times are ``time.monotonic_ns()`` shifted once, at import, to wall-clock nanoseconds —
monotonic within the process, comparable across hosts (NTP) — matching the processor's own
samplers.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from argus.wire import CATEGORIES, GROUP_KINDS, KINDS, Msg, RingWriter

__all__ = ["Recorder", "now_ns", "CATEGORY", "GROUP", "KIND"]

_OFFSET = time.time_ns() - time.monotonic_ns()


def now_ns() -> int:
    return time.monotonic_ns() + _OFFSET


CATEGORY: dict[str, int] = {c: i for i, c in enumerate(CATEGORIES)}  # str keys: a category or its value
GROUP = {g: i for i, g in enumerate(GROUP_KINDS)}
KIND = {k: i for i, k in enumerate(KINDS)}


class Recorder:
    def __init__(self, ring: RingWriter):
        self.ring = ring
        self.name_id = ring.name_id

    def phase(self, step: int, start_ns: int, end_ns: int, microbatch: int, name: str, category: str,
              group: str = "", wait_ns: int = -1) -> None:
        self.ring.append(Msg.PHASES, step, start_ns, end_ns - start_ns if end_ns >= 0 else -1, microbatch,
                         self.name_id(name), CATEGORY[category], GROUP.get(group, 0), wait_ns)

    def phase_ids(self, step: int, start_ns: int, dur_ns: int, microbatch: int, name_id: int, category: int,
                  group: int, wait_ns: int = -1) -> None:
        """:meth:`phase` with the name already interned (garbage-collector callbacks)."""
        self.ring.append(Msg.PHASES, step, start_ns, dur_ns, microbatch, name_id, category, group, wait_ns)

    def step(self, step: int, start_ns: int, end_ns: int) -> None:
        self.ring.append(Msg.STEPS, step, start_ns, end_ns)

    def kernels(self, records: np.ndarray) -> None:
        self.ring.extend(Msg.KERNELS, records)

    def check(self, step: int, sensor: int, tensors: int, elements: int, digest: int, nonfinite: int,
              violations: int = 0, rerun: int = 0) -> None:
        self.ring.append(Msg.CHECKS, step, now_ns(), sensor, tensors, elements, digest, nonfinite, violations, rerun)

    def stacks(self, rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            self.ring.append(Msg.STACKS, *row)
