"""NCCL collectives timed by their completion, from ProcessGroupNCCL's on-completion hook.

A ProcessGroupNCCL work's future completes at *launch* (its CUDA events are recorded, nothing
has run), so a future callback says nothing about when the collective finished. The process
group itself knows: with collective timing on, every work records a start event on the stream
the collective runs on (after that stream waited for the inputs — the rank has *arrived*) and
an end event after it; the watchdog notices the end event complete and hands a
``torch._C._distributed_c10d.WorkInfo`` to the hook registered with
``pg._register_on_completion_hook`` — for every work of the group, also those C++ launched
itself (DDP's reducer, ``_broadcast_coalesced``), never for works enqueued during CUDA-graph
capture or inside a coalescing block (the block's one ``COALESCED`` work is reported).

What WorkInfo carries (torch 2.13, read from the bindings' signatures)::

    op_type          OpType enum (ALLREDUCE, _ALLGATHER_BASE, REDUCE_SCATTER, SEND, COALESCED …)
    seq              int — the group's sequence number of the work: for collectives the value
                     ``pg._get_sequence_number_for_group()`` returns right after the launch
                     (p2p works count in a separate sequence Python cannot read)
    time_started     datetime.timedelta — std::chrono::steady_clock (CLOCK_MONOTONIC on Linux)
                     since its epoch, taken when the work object was created: the CPU launch
    time_finished    datetime.timedelta — the same clock, when the hook thread handled the
                     completion: after the GPU finished, late by the watchdog's poll (≤ 100 ms in
                     recent releases, 1 s in old ones)
    active_duration  datetime.timedelta — cudaEventElapsedTime(start event, end event): the GPU
                     time from the rank's arrival at the collective to its end, µs resolution

Older releases had ``time_started``/``time_finished`` as naive local ``datetime`` on
``system_clock``; both forms are accepted (the clock is recognised by which of the host's
clocks the value is near).

Conversion to the producer's clock (``now_ns()`` = ``time.monotonic_ns()`` + a constant offset
taken at import): a steady-clock value ``v`` maps to ``v + offset`` exactly (the same clock;
error: the µs truncation); a wall-clock value to ``v - (time.time_ns() - now_ns())``. Then::

    on_complete(pg_key, op_name, seq, start_ns, end_ns)
        end_ns   = time_finished  (detection: an upper bound of the GPU end)
        start_ns = max(end_ns - active_duration, time_started)

so ``end_ns - start_ns`` is the GPU-measured duration, and the interval sits late by the
detection delay. A collective Python launched also has a GPU end event of Argus's own (a
CUDA event recorded in its future's callback, completing when the collective completes);
:class:`CompletionJoin` re-anchors the interval on that event: ``[t_end - active, t_end]``.

Per rank only the start (arrival) and end of the work exist; across ranks, the processor
takes the last rank's arrival ``A = max(start_r)``: rank r waited ``A - start_r`` and the
transfer took ``end_r - A`` (the collective cannot make progress before the last rank
arrives). That needs the ranks' clocks aligned (NTP or better).

Safety: registration requires timing (``_enable_collectives_timing``), and the hook thread
computes the duration of every completed work it sees; a work created before timing was
turned on has no start event and the duration throws on the watchdog — where any exception
aborts the communicators. So the hook is registered only on groups whose NCCL backend was
built with timing on: ``TORCH_NCCL_ENABLE_TIMING=1`` set (:func:`enable_timing_env`, at
``argus.init()``) before the group was created, or set by the user at launch. Other groups,
groups with a hook already registered, and non-NCCL groups fall back (``attach`` returns
False; logged once). The hook itself is a few dictionary operations and never raises.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable

from argus.producer.recorder import _OFFSET, now_ns

__all__ = ["NcclCompletions", "CompletionJoin", "is_nccl", "enable_timing_env", "workinfo_times", "OP_NAMES"]

log = logging.getLogger("argus.producer")

TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
_TRUE = ("1", "true", "yes", "on", "y")

#: OpType name → the op names of ``collectives.PG_METHODS``.
OP_NAMES = {
    "BROADCAST": "broadcast", "ALLREDUCE": "allreduce", "ALLREDUCE_COALESCED": "allreduce", "REDUCE": "reduce",
    "ALLGATHER": "allgather", "_ALLGATHER_BASE": "allgather", "ALLGATHER_COALESCED": "allgather",
    "GATHER": "gather", "SCATTER": "scatter", "REDUCE_SCATTER": "reduce-scatter",
    "_REDUCE_SCATTER_BASE": "reduce-scatter", "REDUCE_SCATTER_TENSOR_COALESCED": "reduce-scatter",
    "ALLTOALL_BASE": "alltoall", "ALLTOALL": "alltoall", "SEND": "send", "RECV": "recv", "RECVANYSOURCE": "recv",
    "BARRIER": "barrier", "COALESCED": "coalesced", "_ALLREDUCE_SPARSE": "allreduce", "UNKNOWN": "unknown",
}
P2P_OPS = frozenset({"send", "recv"})

# enable_timing_env(): None (never called), or (who set the variable, groups that existed then)
_TIMING: tuple[str, Any] | None = None
_logged: set[str] = set()


def _log_once(key: str, msg: str, *args: Any) -> None:
    if key not in _logged:
        _logged.add(key)
        log.info(msg, *args)


def _env_on() -> bool:
    return any(os.environ.get(v, "").strip().lower() in _TRUE
               for v in (TIMING_ENV, "NCCL_ENABLE_TIMING", "TORCH_NCCL_DESYNC_DEBUG", "NCCL_DESYNC_DEBUG"))


def _existing_groups() -> Any:
    out: Any
    try:
        out = weakref.WeakSet()
    except Exception:  # noqa: BLE001
        out = set()
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    try:
        for pg in list(getattr(getattr(c10d, "_world", None), "pg_map", {}) or {}):
            try:
                out.add(pg)
            except TypeError:
                out.add(id(pg))
    except Exception:  # noqa: BLE001
        pass
    return out


def enable_timing_env() -> None:
    """At ``argus.init()``: NCCL process groups created from now on time their collectives
    (``TORCH_NCCL_ENABLE_TIMING=1``; an extra CUDA event per collective). Remembers the groups
    that already exist: they were built without timing and get no hook."""
    global _TIMING
    if _TIMING is not None:
        return
    if _env_on():
        _TIMING = ("user", None)
        return
    os.environ[TIMING_ENV] = "1"
    _TIMING = ("argus", _existing_groups())


def _timed_from_birth(pg: Any) -> bool:
    state = _TIMING
    if state is None:
        return _env_on()  # set by the user at launch
    who, before = state
    if who == "user":
        return True
    try:
        return pg not in before and id(pg) not in before
    except TypeError:
        return id(pg) not in before


def is_nccl(pg: Any) -> bool:
    """Whether ``pg``'s default backend is ProcessGroupNCCL. Never raises."""
    try:
        name = pg._get_backend_name()
        if isinstance(name, str) and name:
            return name.lower() == "nccl"
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch.distributed as dist

        return str(dist.get_backend(pg)).lower() == "nccl"
    except Exception:  # noqa: BLE001
        return False


def _to_ns(value: Any) -> int | None:
    """Nanoseconds of a timedelta, an int (ns) or a float (s); None if neither."""
    if isinstance(value, _dt.timedelta):
        return (value.days * 86400 + value.seconds) * 1_000_000_000 + value.microseconds * 1000
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value * 1e9)
    return None


def _wall_ns(value: _dt.datetime) -> int:
    whole = value.replace(microsecond=0)
    return int(whole.timestamp()) * 1_000_000_000 + value.microsecond * 1000  # naive: local time


class _Clocks:
    """Host clocks (swappable in tests): monotonic, wall, producer, and monotonic → producer."""

    def __init__(self, mono: Callable[[], int] = time.monotonic_ns, wall: Callable[[], int] = time.time_ns,
                 producer: Callable[[], int] = now_ns, mono_offset: int = _OFFSET):
        self.mono, self.wall, self.producer, self.mono_offset = mono, wall, producer, mono_offset
        self.kind: str | None = None  # of WorkInfo timedeltas: 'mono' or 'wall', decided once

    def convert(self, value: Any) -> int | None:
        if isinstance(value, _dt.datetime):
            return _wall_ns(value) - (self.wall() - self.producer())
        ns = _to_ns(value)
        if ns is None:
            return None
        if self.kind is None:
            self.kind = "mono" if abs(ns - self.mono()) <= abs(ns - self.wall()) else "wall"
        if self.kind == "mono":
            return ns + self.mono_offset
        return ns - (self.wall() - self.producer())


def workinfo_times(info: Any, clocks: _Clocks) -> tuple[str, int, int, int, int, int]:
    """(op name, seq, enqueued_ns, start_ns, end_ns, active_ns) of a WorkInfo on the producer's clock."""
    op = getattr(info, "op_type", None)
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    op_name = OP_NAMES.get(str(name).upper(), str(name).lower())
    seq = int(getattr(info, "seq", -1))
    enq = clocks.convert(getattr(info, "time_started", None))
    end = clocks.convert(getattr(info, "time_finished", None))
    active = _to_ns(getattr(info, "active_duration", None)) or 0
    if end is None:
        end = clocks.producer()
    if enq is None:
        enq = end - active
    start = max(end - active, enq) if active > 0 else enq
    return op_name, seq, enq, start, end, end - start


class NcclCompletions:
    """One on-completion hook per NCCL process group, forwarding each completed work as
    ``on_complete(pg_key, op_name, seq, start_ns, end_ns)`` (see the module docstring).
    ``on_complete`` runs on ProcessGroupNCCL's hook thread: it must be quick; its exceptions
    are swallowed (counted in ``errors``)."""

    def __init__(self, on_complete: Callable[[Any, str, int, int, int], None], clocks: _Clocks | None = None):
        self.on_complete = on_complete
        self.clocks = clocks or _Clocks()
        self.closed = False
        self.delivered = 0
        self.errors = 0
        self._lock = threading.Lock()
        try:
            self._attached: Any = weakref.WeakKeyDictionary()
        except Exception:  # noqa: BLE001
            self._attached = {}

    def attach(self, pg: Any, pg_key: Any) -> bool:
        """Enable timing and register the hook on ``pg`` — once per group; True when its works
        will be reported. Never raises."""
        try:
            with self._lock:
                try:
                    found = self._attached.get(pg)
                except TypeError:
                    found = None
                if found is not None:
                    return found
                ok = self._register(pg, pg_key)
                try:
                    self._attached[pg] = ok
                except TypeError:
                    pass
                return ok
        except Exception as exc:  # noqa: BLE001
            _log_once("attach", "argus: NCCL completion hook unavailable (%s)", exc)
            return False

    def attached(self, pg: Any) -> bool:
        try:
            return bool(self._attached.get(pg))
        except Exception:  # noqa: BLE001
            return False

    def _register(self, pg: Any, pg_key: Any) -> bool:
        if not is_nccl(pg):
            return False
        if not _timed_from_birth(pg):
            _log_once("late", "argus: NCCL group created before argus.init() (without %s=1): its collectives are "
                              "timed from Argus's CUDA events only", TIMING_ENV)
            return False
        try:
            if pg._has_hooks():
                _log_once("taken", "argus: an on-completion hook is already registered on an NCCL group: its "
                                   "collectives are timed from Argus's CUDA events only")
                return False
        except Exception:  # noqa: BLE001 - no such method: registration below tells
            pass
        try:
            pg._enable_collectives_timing()
            pg._register_on_completion_hook(self._hook_for(pg_key))
        except Exception as exc:  # noqa: BLE001 - "hook already registered", a non-NCCL default backend
            _log_once("register", "argus: cannot register an NCCL completion hook (%s); falling back", exc)
            return False
        return True

    def _hook_for(self, pg_key: Any) -> Callable[[Any], None]:
        # the closure holds neither the group nor anything that holds it (no cycle through C++)
        def argus_nccl_completion(info: Any) -> None:
            if self.closed:
                return
            try:
                op, seq, _enq, start, end, _active = workinfo_times(info, self.clocks)
                self.on_complete(pg_key, op, seq, start, end)
                self.delivered += 1
            except BaseException:  # noqa: BLE001 - an exception here aborts NCCL's communicators
                self.errors += 1

        return argus_nccl_completion

    @staticmethod
    def seq(pg: Any) -> int | None:
        """The group's collective sequence number now (the last launched collective's seq)."""
        try:
            return int(pg._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001
            return None

    def close(self) -> None:
        """Stop forwarding (a hook cannot be unregistered: it becomes a no-op)."""
        self.closed = True


class CompletionJoin:
    """Joins, per launched collective, Argus's GPU interval (CUDA events: ``t0`` = the launch
    point on the launching stream, ``t1`` = completion, from a mark in the work's future
    callback) with the hook's report, and calls ``record(meta, op_name, start_ns, end_ns)``
    once per collective — ``meta`` is what :meth:`launched` was given, ``None`` for a work
    Python never saw (C++-launched):

    * GPU interval and hook: ``[max(t0, t1 - active), t1]`` (active = hook ``end - start``);
    * hook only: the hook's interval (late by the detection delay);
    * GPU interval only (no hook report ``grace_ns`` after it): ``[t0, t1]`` (t0 is then the
      inputs' readiness, before any backlog on NCCL's stream);
    * a hook report nobody launched (after ``grace_ns``): the hook's interval, ``meta`` None;
      p2p reports (``send``/``recv``) are ignored: Python launches those and times them itself.

    ``grace_ns`` counts from the first half's arrival, so a collective that waits long for a
    straggler is still joined; one with neither half (a hang) waits until evicted. Bounded
    (``cap`` entries, oldest dropped and counted in ``dropped``); thread-safe; never raises."""

    def __init__(self, record: Callable[[Any, str, int, int], None], grace_ns: int = 2_000_000_000,
                 cap: int = 65536, clock: Callable[[], int] = now_ns):
        self.record = record
        self.grace_ns = grace_ns
        self.cap = cap
        self.clock = clock
        self._lock = threading.Lock()
        self._next = 0
        self._entries: dict[int, list] = {}  # handle → [key, meta, gpu (t0, t1) | None, hook (op, s, e) | None]
        self._by_key: dict[tuple, list[int]] = {}
        self._waiting: dict[int, int] = {}  # handle → when its first half came (in that order)
        self._orphans: dict[tuple, tuple] = {}  # key → (op, start, end, t)
        self._last_flush = 0
        self.dropped = 0
        self.errors = 0

    def launched(self, pg_key: Any, seq: int, meta: Any) -> int:
        """Training thread, right after the launch: a handle for :meth:`gpu`."""
        out: list = []
        with self._lock:
            self._next += 1
            handle = self._next
            key = (pg_key, seq)
            entry = [key, meta, None, None]
            self._entries[handle] = entry
            orphan = self._orphans.pop(key, None)
            if orphan is not None:
                entry[3] = orphan[:3]
                self._waiting[handle] = orphan[3]
            self._by_key.setdefault(key, []).append(handle)
            if len(self._entries) > self.cap:
                old = next(iter(self._entries))
                self._drop(old)
                self.dropped += 1
            self._flush_locked(out, self.clock())
        self._emit(out)
        return handle

    def gpu(self, handle: int, t0: int, t1: int) -> None:
        """Resolver thread: the GPU interval of a launched collective."""
        out: list = []
        with self._lock:
            entry = self._entries.get(handle)
            if entry is not None:
                entry[2] = (t0, t1)
                if entry[3] is not None:
                    self._drop(handle)
                    out.append(self._combine(entry))
                else:
                    self._waiting.setdefault(handle, self.clock())
        self._emit(out)

    def hook(self, pg_key: Any, op_name: str, seq: int, start_ns: int, end_ns: int) -> None:
        """NcclCompletions' ``on_complete`` (hook thread)."""
        if op_name in P2P_OPS:
            return
        out: list = []
        with self._lock:
            key = (pg_key, seq)
            handles = self._by_key.get(key)
            if not handles:
                if len(self._orphans) >= self.cap:
                    self._orphans.pop(next(iter(self._orphans)))
                    self.dropped += 1
                self._orphans[key] = (op_name, start_ns, end_ns, self.clock())
            else:
                for handle in list(handles):
                    entry = self._entries[handle]
                    entry[3] = (op_name, start_ns, end_ns)
                    if entry[2] is not None:
                        self._drop(handle)
                        out.append(self._combine(entry))
                    else:
                        self._waiting.setdefault(handle, self.clock())
            self._flush_locked(out, self.clock(), every_ns=500_000_000)
        self._emit(out)

    def flush(self, now: int | None = None, every_ns: int = 0) -> None:
        """Settle what waited longer than ``grace_ns`` (call it periodically, e.g. per tick)."""
        out: list = []
        with self._lock:
            self._flush_locked(out, self.clock() if now is None else now, every_ns)
        self._emit(out)

    @property
    def pending(self) -> int:
        return len(self._entries) + len(self._orphans)

    # -- internals (under the lock) ------------------------------------------------------------
    def _drop(self, handle: int) -> None:
        self._waiting.pop(handle, None)
        entry = self._entries.pop(handle, None)
        if entry is None:
            return
        handles = self._by_key.get(entry[0])
        if handles is not None:
            try:
                handles.remove(handle)
            except ValueError:
                pass
            if not handles:
                del self._by_key[entry[0]]

    @staticmethod
    def _combine(entry: list) -> tuple:
        meta, gpu, hook = entry[1], entry[2], entry[3]
        op = hook[0] if hook is not None else ""
        if gpu is not None and hook is not None:
            t0, t1 = gpu
            active = max(hook[2] - hook[1], 0)
            return (meta, op, max(t0, t1 - active), t1)
        if hook is not None:
            return (meta, op, hook[1], hook[2])
        return (meta, op, gpu[0], gpu[1])

    def _flush_locked(self, out: list, now: int, every_ns: int = 0) -> None:
        if every_ns and now - self._last_flush < every_ns:
            return
        self._last_flush = now
        cutoff = now - self.grace_ns
        for handle, since in list(self._waiting.items()):
            if since > cutoff:
                break  # in the order their first halves came
            entry = self._entries.get(handle)
            self._drop(handle)
            if entry is not None:
                out.append(self._combine(entry))
        for key, (op, start, end, t) in list(self._orphans.items()):
            if t > cutoff:
                break
            del self._orphans[key]
            out.append((None, op, start, end))

    def _emit(self, out: list) -> None:
        for meta, op, start, end in out:
            try:
                self.record(meta, op, start, end)
            except Exception:  # noqa: BLE001 - on the hook's or the resolver's thread
                self.errors += 1
