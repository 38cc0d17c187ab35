"""Asynchronous NCCL collectives timed by PyTorch's own records: the Flight Recorder's durations.

A collective launched with ``async_op=True`` runs on ProcessGroupNCCL's internal stream. The only
ways Python has to see its end on the GPU — a callback on ``work.get_future()``, ``fut.wait()``,
``work.wait()`` on a stream of one's own — all have side effects on the job: a future callback
runs under a stream from the global pool (the pool ``torch.cuda.Stream()`` draws user streams
from) made to wait on the collective, and records the outputs' memory on it
(``recordDataPtrOnStream``: the deferred frees FSDP2 and ProcessGroupNCCL avoid on purpose);
``work.wait()`` also releases the tensors the process group keeps alive until the user's own wait.
Holding the ``Work`` until the GPU is done keeps its outputs allocated meanwhile.

ProcessGroupNCCL already measures each collective itself when ``TORCH_NCCL_ENABLE_TIMING`` is on: a
start and an end event on its stream, their elapsed time kept in the Flight Recorder's ring
(``duration_ms``, on by default with 2,000 entries). Argus reads the ring in bulk on its CUDA-event
thread, only while some collective waits for its duration: once half the ring was written since the
last read, at most once a second and at least every 5 s (a read of 2,000 records holds the GIL ~30 ms;
its phases reach the processor up to 5 s late, and it writes them with their window as a later
part). It places each collective with what it measured itself: the arrival event on the launching stream
(this rank's inputs were ready). A group's collectives run one after another on its stream, so

    end_k = max(arrival_k, end_(k-1)) + duration_k

in sequence order. The record is found by the group's name and its collective sequence number,
read right after the launch (``pg._get_sequence_number_for_group()``: the number the Flight
Recorder stores as ``collective_seq_id``). A collective whose record left the ring before it was
read, or never got a duration, settles its in-flight count without a phase.

Enabling the timing is the one change Argus makes to the job here: :func:`enable_timing` sets
``TORCH_NCCL_ENABLE_TIMING=1`` before any process group exists, unless the job set it itself.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from typing import Any, Callable, MutableMapping

__all__ = ["FlightRecorderTimes", "enable_timing", "fr_key", "nccl_dump", "ENV_TIMING", "write_live_dump"]

log = logging.getLogger("argus.producer")

ENV_TIMING = "TORCH_NCCL_ENABLE_TIMING"
_TRUE = {"1", "true", "yes", "y", "on"}


def enable_timing(environ: MutableMapping[str, str] | None = None) -> bool:
    """Turn ProcessGroupNCCL's per-collective timing on for groups created from now on, unless the
    job decided itself; whether it will be on."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_TIMING)
    if value is None:
        env[ENV_TIMING] = "1"
        return True
    return value.strip().lower() in _TRUE


def fr_key(pg: Any) -> tuple[str, int] | None:
    """(group name, sequence number of its latest collective), read right after a launch: the
    Flight Recorder's ``process_group[0]`` and ``collective_seq_id`` of that collective."""
    try:
        return str(pg.group_name), int(pg._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a backend without sequence numbers: no record to find
        return None


def nccl_dump() -> Callable[[], dict] | None:
    """ProcessGroupNCCL's Flight Recorder ring as plain data (None: no NCCL in this torch)."""
    try:
        from torch._C import _distributed_c10d as c10d

        dump = c10d._dump_nccl_trace  # type: ignore[attr-defined]  # NCCL builds only; the stubs lack it
    except (ImportError, AttributeError):
        return None
    return lambda: pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))


def _fr_trace_bytes() -> bytes | None:
    """This process's Flight Recorder ring as torch's own pickle (every backend that records:
    NCCL by default, gloo with ``TORCH_FR_BUFFER_SIZE``), or None where torch has no such call."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return None
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            return bytes(dump(True, True, False))  # collectives, stack traces, not only active ones
    return None


def write_live_dump(directory: str, rank: int, dump: Callable[[], bytes | None] = _fr_trace_bytes) -> bool:
    """At a hang the processor saw: this rank's Flight Recorder ring into ``directory/rank<N>``
    (temp + rename: a reader never sees half a file). On the transport thread, which a hung
    training thread does not hold up; never raises."""
    try:
        data = dump()
        if not data:
            return False
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rank{int(rank)}")
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except Exception as exc:  # noqa: BLE001 - a dump that fails costs the evidence, never the job
        log.warning("argus: Flight Recorder dump not written (%s)", exc)
        return False


def _ring_capacity() -> int:
    """The Flight Recorder's ring size as torch reads it (2,000 unless the job set it)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        try:
            return max(0, int(os.environ[name]))
        except (KeyError, ValueError):
            continue
    return 2000


def _letters(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalpha())


class _Pending:
    __slots__ = ("launch", "op", "t0", "dur_ns", "lost")

    def __init__(self, launch: Any, op: str = ""):
        self.launch = launch
        self.op = _letters(op)  # "allreduce": found in the record's "nccl:all_reduce"
        self.t0: int | None = None
        self.dur_ns: int | None = None
        self.lost = False


class FlightRecorderTimes:
    """Collectives waiting for their Flight Recorder duration, completed in sequence order per group.

    ``done(launch, t0, t1)`` receives each one's interval (``None`` times: no interval, the
    in-flight count is settled all the same). :meth:`expect` runs on the training thread,
    :meth:`arrived` and :meth:`poll` on the CUDA-event thread."""

    MAX_PENDING = 65536

    MAX_INTERVAL_S = 5.0

    def __init__(self, dump: Callable[[], dict], done: Callable[[Any, int | None, int | None], None],
                 interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic, capacity: int | None = None):
        self.dump = dump
        self.done = done
        self.interval_s = interval_s  # the shortest time between two reads
        self.capacity = capacity if capacity is not None else _ring_capacity()
        self._since_read = 0  # collectives expected since the last read
        self.clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, dict[int, _Pending]] = {}  # group → seq → pending
        self._last_end: dict[str, int] = {}
        self._last_read = float("-inf")
        self.stats = {"timed": 0, "lost": 0, "reads": 0, "read_errors": 0, "read_ms": 0.0}
        self.untimed = 0  # records completed without a duration
        self.empty_reads = 0
        self.mismatched = 0  # records of another op under the key read after a launch

    @property
    def usable(self) -> bool:
        """False once the ring showed it cannot time collectives here (empty, or no durations):
        the caller times the next ones another way."""
        return self.empty_reads == 0 and self.untimed == 0 and self.mismatched == 0 and self.stats["read_errors"] < 3

    @property
    def pending(self) -> int:
        return sum(len(g) for g in self._groups.values())

    def expect(self, key: tuple[str, int], launch: Any, op: str = "") -> bool:
        """Wait for ``key``'s record (a record of another ``op`` is not this collective's); False
        when full (the caller times it another way)."""
        if self.pending >= self.MAX_PENDING:
            return False
        group, seq = key
        with self._lock:
            self._groups.setdefault(group, {})[seq] = _Pending(launch, op)
            self._since_read += 1
        return True

    def due(self, now: float) -> bool:
        """A read is due once half the ring has been written since the last one, never sooner
        than ``interval_s`` after it, at the latest ``MAX_INTERVAL_S`` after it. A read of a full
        ring (2,000 records) holds the GIL ~30 ms here, so it is made as seldom as the ring allows:
        ≤ 0.6% of the training thread at one read per 5 s."""
        age = now - self._last_read
        if age < self.interval_s:
            return False
        return age >= self.MAX_INTERVAL_S or self._since_read >= 0.5 * self.capacity

    def arrived(self, key: tuple[str, int], t0: int | None, _t1: int | None = None) -> None:
        """The arrival event resolved (``None``: the timer dropped it)."""
        with self._lock:
            p = self._groups.get(key[0], {}).get(key[1])
            if p is None:
                return
            if t0 is None:
                p.lost = True
            else:
                p.t0 = t0
        self._complete(key[0])

    def poll(self, final: bool = False) -> None:
        """Read the ring when a duration is awaited and the last read is ``interval_s`` old."""
        now = self.clock()
        if not self._groups or not any(self._groups.values()):
            return
        if not final and not self.due(now):
            return
        self._last_read = now
        self._since_read = 0
        t = time.perf_counter()
        try:
            entries = self.dump().get("entries", [])
        except Exception as exc:  # noqa: BLE001 - never into the resolver
            self.stats["read_errors"] += 1
            log.debug("argus: Flight Recorder read failed: %s", exc)
            return
        finally:
            self.stats["reads"] += 1
            self.stats["read_ms"] += (time.perf_counter() - t) * 1e3
        oldest: dict[str, int] = {}
        with self._lock:
            for e in entries:
                if e.get("is_p2p"):
                    continue
                pg = e.get("process_group")
                group = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else None
                seq = e.get("collective_seq_id")
                if group is None or not isinstance(seq, int):
                    continue
                oldest[group] = min(seq, oldest.get(group, seq))
                p = self._groups.get(group, {}).get(seq)
                if p is None or p.dur_ns is not None or p.lost:
                    continue
                if p.op and p.op not in _letters(str(e.get("profiling_name", ""))):
                    # the sequence number read after the launch was not this collective's (a group
                    # with two backends counts on the other one): never another op's duration
                    p.lost = True
                    self.mismatched += 1
                    continue
                dur = e.get("duration_ms")
                if e.get("state") == "completed" and dur is not None:
                    p.dur_ns = int(round(float(dur) * 1e6))
                elif e.get("retired") and e.get("state") == "completed":
                    p.lost = True  # completed without a duration: timing is off for this group
                    self.untimed += 1
            for group, waiting in self._groups.items():
                low = oldest.get(group)
                for seq, p in waiting.items():
                    # recorded at its launch, before the caller saw it: a record that is not in
                    # the ring any more was overwritten before this read
                    if p.dur_ns is None and not p.lost and (low is None or seq < low):
                        p.lost = True
            if not entries:
                self.empty_reads += 1  # a ring that records nothing (TORCH_FR_BUFFER_SIZE=0)
        for group in list(self._groups):
            self._complete(group, final)

    def _complete(self, group: str, final: bool = False) -> None:
        """Emit the group's leading collectives whose arrival and duration are both known."""
        out: list[tuple[Any, int | None, int | None]] = []
        with self._lock:
            waiting = self._groups.get(group)
            if not waiting:
                return
            for seq in sorted(waiting):
                p = waiting[seq]
                if p.lost or (final and (p.t0 is None or p.dur_ns is None)):
                    out.append((p.launch, None, None))
                    self.stats["lost"] += 1
                elif p.t0 is not None and p.dur_ns is not None:
                    t1 = max(p.t0, self._last_end.get(group, p.t0)) + p.dur_ns
                    self._last_end[group] = t1
                    out.append((p.launch, p.t0, t1))
                    self.stats["timed"] += 1
                else:
                    break  # later ones wait for this one: its end is their earliest start
                del waiting[seq]
        for launch, start_ns, end_ns in out:
            try:
                self.done(launch, start_ns, end_ns)
            except Exception:  # noqa: BLE001
                pass
