"""What the processor observes about its ranks by itself: the common frame of its samplers.

Two samplers watch the local ranks from outside: Python stacks (``stacks.py``, py-spy) and
GPU telemetry (``hardware.py``, NVML). Each samples on its own thread(s) and never touches
the window assembler, which is not thread-safe: threads put raw observations on one bounded
queue, and the daemon's loop drains it every cycle (:meth:`Samplers.collect`), where the
sampler turns them into packed records (``protocol.DTYPES``) of a rank, its strings interned
into that rank's name table (``RankInfo.names``), exactly as a client's own records.

A full queue (the loop stalled) drops observations; the samplers count them.
"""

from __future__ import annotations

import itertools
import logging
import queue
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from argus.processor.assembler import RankInfo
from argus.wire.protocol import Msg

__all__ = ["QUEUE_ITEMS", "Output", "RankHandle", "Sampler", "Samplers", "hw_output"]

log = logging.getLogger("argus.processor")

#: Bound of the queue from sampler threads to the daemon's loop (observations, not records).
QUEUE_ITEMS = 10_000
_TOKENS = itertools.count(1)


@dataclass(eq=False)
class RankHandle:
    """One connected rank as the samplers see it (main thread only, except ``token``/``pid``)."""

    token: int  # unique per connection
    info: RankInfo
    attempt_key: tuple[str, str]
    pid: int | None = None
    local_rank: int = -1
    _ids: dict[str, int] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.info.rank

    def intern(self, name: str) -> int:
        """Id of ``name`` in the rank's name table, appending it once (main thread only)."""
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = len(self.info.names)
            self.info.names.append(name)
        return found


#: A batch for the assembler: (rank, message type, records of ``DTYPES[msg]``). ``Msg.DROPS``
#: batches are the samplers' own drop counts (reason ``queue_full``).
Output = tuple[RankHandle, Msg, np.ndarray]


def hw_output(handle: RankHandle, ts_ns: int, metrics: list[tuple[str, float]]) -> Output:
    """``(metric, value)`` samples taken at ``ts_ns`` as ``hw`` records of ``handle``'s rank."""
    from argus.wire.protocol import DTYPES

    recs = np.zeros(len(metrics), DTYPES[Msg.HW])
    recs["ts_ns"] = ts_ns
    recs["metric"] = [handle.intern(m) for m, _ in metrics]
    recs["value"] = [v for _, v in metrics]
    return handle, Msg.HW, recs


class Sampler:
    """Base of a sampler: everything but ``receive`` is optional; all run on the main thread."""

    name = "sampler"

    def __init__(self) -> None:
        self.queue: queue.Queue | None = None  # set by Samplers

    def put(self, payload: Any) -> bool:
        """From a sampler thread: hand an observation to the loop; False when it was dropped
        (the queue full, or no loop attached yet: a sampler thread must never die of it)."""
        if self.queue is None:
            return False
        try:
            self.queue.put_nowait((self, payload))
            return True
        except queue.Full:
            return False

    def start(self) -> None: ...

    def close(self) -> list[Output]:
        return []

    def rank_joined(self, handle: RankHandle) -> None: ...

    def rank_left(self, handle: RankHandle) -> list[Output]:
        return []

    def steps_reported(self, handle: RankHandle, records: np.ndarray) -> None: ...

    def receive(self, payload: Any, ranks: Iterable[RankHandle]) -> list[Output]:
        return []

    def tick(self, now_ns: int) -> list[Output]:
        return []

    def take_controls(self) -> list[tuple[RankHandle, dict[str, Any]]]:
        return []

    def status(self) -> dict[str, Any]:
        return {}


class Samplers:
    """The daemon's one handle on all samplers: rank registry, the queue, their outputs."""

    def __init__(self, samplers: list[Sampler], max_items: int = QUEUE_ITEMS):
        self.queue: queue.Queue = queue.Queue(maxsize=max_items)
        self.samplers = samplers
        self.ranks: dict[int, RankHandle] = {}
        self._closed = False
        for s in samplers:
            s.queue = self.queue

    @staticmethod
    def new_token() -> int:
        """A connection's identity for the samplers (file descriptors are reused)."""
        return next(_TOKENS)

    def start(self) -> None:
        for s in self.samplers:
            try:
                s.start()
            except Exception as exc:  # noqa: BLE001 - a sampler that cannot start leaves the processor serving
                log.warning("%s sampler off: %s", s.name, exc)

    def rank_joined(self, token: int, info: RankInfo, attempt_key: tuple[str, str], hello: dict[str, Any]) -> None:
        if self._closed:
            return
        handle = RankHandle(token=token, info=info, attempt_key=attempt_key, pid=_int(hello.get("pid"), None),
                            local_rank=_int_or(hello.get("local_rank"), -1))
        self.ranks[token] = handle
        for s in self.samplers:
            s.rank_joined(handle)

    def rank_left(self, token: int) -> list[Output]:
        handle = self.ranks.pop(token, None)
        if handle is None:
            return []
        out: list[Output] = []
        for s in self.samplers:
            out += s.rank_left(handle)
        return out

    def steps_reported(self, token: int, records: np.ndarray) -> None:
        handle = self.ranks.get(token)
        if handle is not None:
            for s in self.samplers:
                s.steps_reported(handle, records)

    def collect(self, now_ns: int, max_items: int = 5_000) -> list[Output]:
        """Drain what the threads queued (bounded per call, so the socket loop stays live)."""
        out: list[Output] = []
        ranks = list(self.ranks.values())
        for _ in range(max_items):
            try:
                sampler, payload = self.queue.get_nowait()
            except queue.Empty:
                break
            out += sampler.receive(payload, ranks)
        for s in self.samplers:
            out += s.tick(now_ns)
        return out

    def take_controls(self) -> list[tuple[int, dict[str, Any]]]:
        return [(h.token, doc) for s in self.samplers for h, doc in s.take_controls()]

    def status(self) -> dict[str, Any]:
        return {s.name: s.status() for s in self.samplers}

    def close(self, now_ns: int) -> list[Output]:
        """Stop every thread and return what is still held (idempotent)."""
        if self._closed:
            return []
        self._closed = True
        out: list[Output] = []
        for s in self.samplers:
            out += s.close()
        out += self.collect(now_ns, max_items=QUEUE_ITEMS)
        for token in list(self.ranks):
            out += self.rank_left(token)
        return out


def _int_or(value: Any, default: int) -> int:
    """``value`` as an int, else ``default``."""
    out = _int(value, default)
    return default if out is None else out


def _int(value: Any, default: int | None) -> int | None:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default
