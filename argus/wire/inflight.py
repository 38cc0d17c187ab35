"""A rank's in-flight state, in its ring: what it is doing now, readable while it is stuck.

The training process keeps one fixed block up to date — the step it is in, the last step it
finished, what its training thread is doing, and per process group how many collectives it
started and completed — and the processor reads it at any time, from outside, even while
the rank holds the GIL or is dead. That is what live hang detection compares across ranks:
the ranks whose ``issued`` count on a group is behind the others' never entered the
collective the others wait in.

Layout (4096 bytes, little-endian)::

     0  8  seq u64 — seqlock: odd while a writer is in the middle; readers retry
     8  8  step i64 — the step the rank is in
    16  8  steps_done i64 — the last step it finished (-1: none)
    24  8  progress_ns i64 — last progress: a step finished or a collective completed
    32  4  activity i32 — name id (ring names) of what the training thread does now, -1: none
    36  4  n_groups u32 — group slots in use
    40  8  activity_since_ns i64
    48  8  argus_cpu_ns i64 — CPU time of the producer's own threads in this process so far
    56  8  op_capture i64 — the CPU-op channel's state, for the processor's CPU-time sampler:
           0 not said (an older producer: sample always), 1 idle, 2 a capture is under way or
           due within ``OP_CAPTURE_LEAD_S`` (sample now)
    64     MAX_GROUPS slots of 64 bytes:
            0 u64 key — hash of the group's sorted global ranks (the same on every member)
            8 u64 issued — collectives this rank started on the group
           16 u64 completed
           24 i64 last_issued_ns
           32 i64 oldest_pending_ns — start of the oldest one not completed (0: none)
           40 i32 op — name id of the last one started (e.g. ``dp-allreduce``)
           44 i32 size — members
           48 i32 first_rank — smallest global rank of the group
           52 u8  kind — code of ``protocol.GROUP_KINDS``

Writers go through the ring's non-blocking lock (several threads of the rank report: the
training thread, and completion callbacks on the backend's threads). A slot is never freed: groups live as long
as the job.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["BLOCK_BYTES", "MAX_GROUPS", "InflightWriter", "InflightReader", "InflightState", "GroupState",
           "group_key", "CAPTURE_UNSAID", "CAPTURE_IDLE", "CAPTURE_SOON", "OP_CAPTURE_LEAD_S"]

BLOCK_BYTES = 4096
MAX_GROUPS = 56
_TOP = struct.Struct("<QqqqiIqqq")
#: op_capture values (offset 56)
CAPTURE_UNSAID, CAPTURE_IDLE, CAPTURE_SOON = 0, 1, 2
#: announce a CPU-op capture this long before it starts: the processor's sampler polls the
#: announcements at ``cpu_time.IDLE_INTERVAL_S`` and must be sampling when the capture begins
OP_CAPTURE_LEAD_S = 0.3
_SLOT = struct.Struct("<QQQqqiiiB11x")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_N_GROUPS = struct.Struct("<I")
_STEP = _I64
_STEPS_DONE = struct.Struct("<qq")  # steps_done, progress_ns
_ACT = struct.Struct("<i")
_ACT_SINCE = _I64
_SLOT0 = 64
assert _TOP.size == 64 and _SLOT.size == 64 and _SLOT0 + MAX_GROUPS * _SLOT.size <= BLOCK_BYTES


def group_key(ranks: Any) -> int:
    """The 64-bit identity of a group from its members (any order): equal on every member."""
    text = ",".join(str(int(r)) for r in sorted(int(r) for r in ranks))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1


class InflightWriter:
    """The training process's end. Every update is a few ``pack_into`` run through the ring's
    non-blocking lock (``RingWriter.run``), so an update from a callback thread or a
    re-entered garbage-collector callback never waits."""

    def __init__(self, mm: Any, offset: int, run: Callable[..., None]):
        self._mm = mm
        self._off = offset
        self._run = run
        self._seq = 0
        self._slots: dict[int, int] = {}  # group key → slot
        self._pending: list[list[int]] = []  # per slot: start times of started, not completed
        self._issued: list[int] = []
        self._completed: list[int] = []
        self._slot_lock = threading.Lock()
        _TOP.pack_into(mm, offset, 0, 0, -1, 0, -1, 0, 0, 0, CAPTURE_UNSAID)

    def _begin(self) -> None:
        self._seq += 1
        _U64.pack_into(self._mm, self._off, self._seq)

    def _end(self) -> None:
        self._seq += 1
        _U64.pack_into(self._mm, self._off, self._seq)

    def step(self, step: int) -> None:
        self._run(self._step, step)

    def _step(self, step: int) -> None:
        self._begin()
        _STEP.pack_into(self._mm, self._off + 8, step)
        self._end()

    def step_done(self, step: int, t_ns: int) -> None:
        self._run(self._step_done, step, t_ns)

    def _step_done(self, step: int, t_ns: int) -> None:
        self._begin()
        _STEP.pack_into(self._mm, self._off + 8, step + 1)
        _STEPS_DONE.pack_into(self._mm, self._off + 16, step, t_ns)
        self._end()

    def activity(self, name_id: int, t_ns: int) -> None:
        """The training thread now does ``name_id`` (-1: nothing Argus names)."""
        self._run(self._activity, name_id, t_ns)

    def _activity(self, name_id: int, t_ns: int) -> None:
        self._begin()
        _ACT.pack_into(self._mm, self._off + 32, name_id)
        _ACT_SINCE.pack_into(self._mm, self._off + 40, t_ns)
        self._end()

    def own_cpu(self, cpu_ns: int) -> None:
        """CPU time the producer's own threads used so far (the transport thread reports it)."""
        self._run(self._own_cpu, cpu_ns)

    def _own_cpu(self, cpu_ns: int) -> None:
        self._begin()
        _I64.pack_into(self._mm, self._off + 48, cpu_ns)
        self._end()

    def op_capture(self, state: int) -> None:
        """The CPU-op channel's state (``CAPTURE_IDLE`` / ``CAPTURE_SOON``), said at step boundaries."""
        self._run(self._op_capture, state)

    def _op_capture(self, state: int) -> None:
        self._begin()
        _I64.pack_into(self._mm, self._off + 56, state)
        self._end()

    def slot(self, key: int, kind_code: int, size: int, first_rank: int) -> int:
        """The slot of a group, taken on first use; the last slot is shared when all are taken."""
        found = self._slots.get(key)
        if found is not None:
            return found
        with self._slot_lock:
            found = self._slots.get(key)
            if found is None:
                found = min(len(self._pending), MAX_GROUPS - 1)
                if found == len(self._pending):
                    self._pending.append([])
                    self._issued.append(0)
                    self._completed.append(0)
                    self._run(self._new_slot, found, key, kind_code, size, first_rank)
                self._slots[key] = found
        return found

    def _new_slot(self, slot: int, key: int, kind_code: int, size: int, first_rank: int) -> None:
        self._begin()
        _SLOT.pack_into(self._mm, self._off + _SLOT0 + slot * _SLOT.size, key, 0, 0, 0, 0, -1, size, first_rank,
                        kind_code)
        _N_GROUPS.pack_into(self._mm, self._off + 36, slot + 1)
        self._end()

    def issued(self, slot: int, op_id: int, t_ns: int) -> None:
        self._run(self._issue, slot, op_id, t_ns)

    def _issue(self, slot: int, op_id: int, t_ns: int) -> None:
        self._pending[slot].append(t_ns)
        self._issued[slot] += 1
        self._begin()
        base = self._off + _SLOT0 + slot * _SLOT.size
        _U64.pack_into(self._mm, base + 8, self._issued[slot])
        _I64.pack_into(self._mm, base + 24, t_ns)
        _I64.pack_into(self._mm, base + 32, min(self._pending[slot]))
        _ACT.pack_into(self._mm, base + 40, op_id)
        self._end()

    def completed(self, slot: int, started_ns: int, t_ns: int) -> None:
        self._run(self._complete, slot, started_ns, t_ns)

    def _complete(self, slot: int, started_ns: int, t_ns: int) -> None:
        pending = self._pending[slot]
        try:
            pending.remove(started_ns)
        except ValueError:
            pass
        self._completed[slot] += 1
        self._begin()
        base = self._off + _SLOT0 + slot * _SLOT.size
        _U64.pack_into(self._mm, base + 16, self._completed[slot])
        _I64.pack_into(self._mm, base + 32, min(pending) if pending else 0)
        _I64.pack_into(self._mm, self._off + 24, t_ns)  # progress
        self._end()


@dataclass(frozen=True, slots=True)
class GroupState:
    key: int
    kind_code: int
    size: int
    first_rank: int
    issued: int
    completed: int
    last_issued_ns: int
    oldest_pending_ns: int
    op: int  # name id

    @property
    def pending(self) -> int:
        return self.issued - self.completed


@dataclass(frozen=True, slots=True)
class InflightState:
    step: int
    steps_done: int
    progress_ns: int
    activity: int  # name id, -1: none
    activity_since_ns: int
    argus_cpu_ns: int = 0
    groups: tuple[GroupState, ...] = field(default_factory=tuple)
    torn: bool = False  # the writer died in the middle of an update: fields may disagree
    op_capture: int = CAPTURE_UNSAID


class InflightReader:
    def __init__(self, mm: Any, offset: int):
        self._mm = mm
        self._off = offset

    def read(self, tries: int = 50) -> InflightState:
        """A consistent snapshot (seqlock); after ``tries`` torn reads the last one, marked."""
        raw = b""
        torn = True
        for _ in range(tries):
            (s1,) = _U64.unpack_from(self._mm, self._off)
            raw = bytes(self._mm[self._off:self._off + BLOCK_BYTES])
            (s2,) = _U64.unpack_from(self._mm, self._off)
            if s1 == s2 and not s1 & 1:
                torn = False
                break
        _, step, done, progress, act, n, since, own_cpu, capture = _TOP.unpack_from(raw, 0)
        groups = []
        for i in range(min(n, MAX_GROUPS)):
            key, issued, completed, last, oldest, op, size, first, kind = _SLOT.unpack_from(raw, _SLOT0 + i * _SLOT.size)
            if key:
                groups.append(GroupState(key, kind, size, first, issued, completed, last, oldest, op))
        return InflightState(step, done, progress, act, since, own_cpu, tuple(groups), torn, capture)

    def op_capture(self) -> int:
        """The CPU-op channel's state alone (one 8-byte read: the sampler asks it at 200 Hz)."""
        return _I64.unpack_from(self._mm, self._off + 56)[0]
