"""GPU timing without synchronising the training thread.

On a CUDA device a phase's start and end are two CUDA events; a background thread (the
*resolver*) polls them and, once both have completed, turns them into timestamps on the
producer's clock (:func:`argus.producer.recorder.now_ns`) and hands them to ``emit``. The
training thread only records events: :meth:`CudaTimer.mark` is one ``cudaEventRecord``
(plus a clock read), :meth:`CudaTimer.rebase` records nothing at all. On CPU the producer
uses the monotonic clock instead and this module is never loaded.

Where events go
---------------
``mark(stream)`` records on ``stream``; by default on ``torch.cuda.current_stream(device)``
— the current stream *of the rank's device*, not of whatever device is current (before the
script's ``torch.cuda.set_device`` that is cuda:0 on every rank). To time a collective by its
completion on the GPU, mark inside the work's future callback: for ProcessGroupNCCL the
future is completed at launch with CUDA events recorded on NCCL's stream, and a callback runs
under a stream guard whose current stream (a pool stream) has been made to wait on them, so
an event recorded there completes when the collective completes on NCCL's stream, without
touching the user's streams (``collectives.py`` does this for every collective Python starts).

While the current stream is capturing a CUDA graph (``torch.cuda.is_current_stream_capturing()``)
``mark`` records nothing and returns ``None``; a span with a ``None`` end is dropped, and the
resolver pauses for a second after a capture was seen. The resolver also switches its own
thread to ``cudaStreamCaptureModeRelaxed`` (best effort, through the process's libcudart), so
its event queries are never "unsafe calls" to another thread's global-mode capture.

Clock mapping (GPU → host)
--------------------------
The resolver measures it itself, never on the training thread: on a private high-priority
stream of the device, with nothing else queued on it, it takes host time ``h0``, records an
event ``E``, spins on ``E.query()`` and takes ``h1`` when it is first seen complete. ``E``'s GPU
timestamp lies in ``[h0, h1]``, so ``T(E) = (h0 + h1) / 2`` is off by at most ``(h1 - h0) / 2``.
Of a few tries the one with the smallest ``h1 - h0`` is kept (typically 5–30 µs; samples over
200 µs are rejected while a better reference is recent). A reference is taken when a step
ends (:meth:`rebase` only asks for one) but at most every 0.2 s, and at least every 1 s while
spans are pending. An event ``x`` is then placed by the newest reference recorded before
``x`` was enqueued (so the elapsed time is non-negative and under a few seconds)::

    T(x) = T(E) + E.elapsed_time(x)
    t0 = T(start), t1 = t0 + start.elapsed_time(end)   # the duration never carries mapping error

Error bound of ``t0``/``t1``: ``(h1 - h0)/2`` of the reference used (measured, exposed as
``clock_error_ns``) + 0.5 µs (``cudaEventElapsedTime`` resolution) + float32 rounding of the
elapsed milliseconds (≤ 61 ns at 1 s) + drift between the GPU timer and ``CLOCK_MONOTONIC``
over the reference's age (NTP slews the host clock by at most 500 ppm, typically < 20 ppm:
≤ 20 µs at a 1 s-old reference). Durations (``t1 - t0``) carry only the 0.5 µs resolution.

Under load the spin may not see ``E`` complete: with ``CUDA_DEVICE_MAX_CONNECTIONS=1``
(Megatron) every stream shares one hardware queue, and ``E`` waits behind the queued work.
The spin is bounded (``SPIN_BUDGET_NS`` per reference, the resolver holds the GIL while it
spins); an ``E`` still running is kept and polled on later passes, and when it is seen
complete at ``h2`` it becomes a reference with bound ``(h2 - h0)/2`` — coarse, stated, never
silence. Every resolved span then narrows the reference it used, because the GPU reaches an
event after the host recorded it and before the resolver saw it complete::

    T(E) ≥ enqueued(start) − E.elapsed_time(start)      T(E) ≤ seen(end) − E.elapsed_time(end)

so a job whose steps start on an idle device (most do, after a step's synchronisation) soon
has a reference as tight as a spin would give.

A span dropped for any reason (the pending cap, a ``None`` token, a CUDA error) is handed to
``dropped(meta)``, so that whoever counted it as started (a collective's in-flight count, read
by hang snapshots) can settle it.

The resolver handles spans whose events lie on different streams: pending spans are queued
per stream of their end event, in record order; within a stream events complete in order, so
a pass stops at the first incomplete end *of that stream* only, and a span whose start lies
on another stream waits for that start without holding others up. Pending spans are capped
(``max_pending``); beyond it new spans are dropped and counted (``stats['dropped_full']``).
Nothing here raises: a failing query or emit drops that span and counts it.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from argus.producer.recorder import now_ns

__all__ = ["CudaTimer"]

log = logging.getLogger("argus.producer")

_RELAXED = 2  # cudaStreamCaptureModeRelaxed


def _stream_key(stream: Any) -> Any:
    for attr in ("cuda_stream", "stream_id"):
        value = getattr(stream, attr, None)
        if value is not None:
            return (getattr(stream, "device_index", None), value)
    return id(stream)


def _relax_capture_mode() -> bool:
    """Set this thread's CUDA stream-capture interaction mode to relaxed (thread-local)."""
    try:
        path = None
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libcudart" in line:
                    path = line.split()[-1]
                    break
        if path is None:
            return False
        fn = ctypes.CDLL(path).cudaThreadExchangeStreamCaptureMode
        mode = ctypes.c_int(_RELAXED)
        return fn(ctypes.byref(mode)) == 0
    except Exception:  # noqa: BLE001 - best effort
        return False


class _Span:
    __slots__ = ("m0", "m1", "meta")

    def __init__(self, m0: tuple, m1: tuple, meta: tuple):
        self.m0, self.m1, self.meta = m0, m1, meta


class _Ref:
    """A clock reference: event ``ev`` reached the GPU at host time ``t`` ± ``err`` (ns), as
    measured by ``h1`` (when it was seen complete). Narrowed by the spans placed with it."""

    __slots__ = ("h1", "lo", "hi", "ev")

    def __init__(self, h1: int, lo: int, hi: int, ev: Any):
        self.h1, self.lo, self.hi, self.ev = h1, lo, hi, ev

    @property
    def t(self) -> int:
        return (self.lo + self.hi) // 2

    @property
    def err(self) -> int:
        return (self.hi - self.lo + 1) // 2

    def narrow(self, lo: int, hi: int) -> None:
        """Keep the bounds consistent: a bound past the other (drift, a late clock read)
        moves both to it rather than inverting the interval."""
        if lo > self.lo:
            self.lo = min(lo, self.hi)
        if hi < self.hi:
            self.hi = max(hi, self.lo)


class _DeviceClock:
    """One device's clock references (an event's elapsed time is defined between events of one
    device only): its private stream, the references kept, one the spin did not see complete."""

    __slots__ = ("device", "refs", "late", "stream", "want", "last_try")

    def __init__(self, device: int, kept: int):
        self.device = device
        self.refs: deque[_Ref] = deque(maxlen=kept)
        self.late: tuple[int, Any] | None = None  # (h0, E)
        self.stream: Any = None
        self.want = True
        self.last_try: int | None = None


class CudaTimer:
    """CUDA-event spans, resolved off the training thread.

    A token from :meth:`mark` is ``(event, stream key, host ns before the record, seq, device)``.
    Spans are placed through references of their own device (the rank's, or the device of a
    collective's tensor where that differs)."""

    MAX_PENDING = 65536
    CAL_TRIES = 5
    GOOD_RTT_NS = 20_000
    MAX_RTT_NS = 200_000
    SPIN_LIMIT_NS = 1_000_000
    SPIN_BUDGET_NS = 300_000  # all tries of one reference together: beyond it, poll E on later passes
    CAL_MIN_INTERVAL_NS = 200_000_000
    CAL_MAX_AGE_NS = 1_000_000_000
    CAPTURE_QUIET_NS = 1_000_000_000
    REFS_KEPT = 64

    def __init__(self, emit: Callable[[int, int, tuple], None], device: int = 0, poll_s: float = 0.05,
                 torch_module: Any = None, *, clock: Callable[[], int] | None = None,
                 max_pending: int = MAX_PENDING, dropped: Callable[[tuple], None] | None = None):
        if torch_module is None:
            import torch as torch_module
        self.torch = torch_module
        self.cuda = torch_module.cuda
        self.device = int(device)
        self.emit = emit  # (start_ns, end_ns, meta) → recorder, on the resolver thread
        self.dropped = dropped  # (meta) of a span never emitted, on whichever thread dropped it
        self.clock = clock or now_ns
        self.max_pending = max_pending
        self._poll_s = poll_s
        self._real_torch = getattr(torch_module, "__name__", "") == "torch"
        self._incoming: deque = deque()  # training thread → resolver
        self._queues: dict[Any, list[_Span]] = {}  # resolver only: end stream → spans by end seq
        self._held = 0  # spans in _queues (written by the resolver only)
        self._clocks: dict[int, _DeviceClock] = {}  # device → its references (one per device marked on)
        self._seq = itertools.count()
        self._capture_seen: int | None = None
        self._stop = threading.Event()
        self._started = False
        self._thread = threading.Thread(target=self._loop, name="argus-cuda-events", daemon=True)
        self.cpu_ns = 0  # the resolver thread's CPU time so far
        #: called after each pass with ``final`` (the Flight Recorder's reader rides this thread)
        self.on_pass: list[Callable[[bool], None]] = []
        self.stats = {"emitted": 0, "dropped_full": 0, "dropped_none": 0, "dropped_error": 0, "dropped_negative": 0,
                      "emit_errors": 0, "refs": 0, "refs_late": 0, "refs_rejected": 0, "capture_skips": 0,
                      "refs_narrowed": 0}

    @property
    def clock_error_ns(self) -> int:
        """The bound of the rank's device's newest reference; -1: none yet."""
        dc = self._clocks.get(self.device)
        return dc.refs[-1].err if dc is not None and dc.refs else -1

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the resolver after a last pass (spans already complete are emitted)."""
        self._stop.set()
        if self._started and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- the training thread -----------------------------------------------------------------
    def rebase(self) -> None:
        """A step ended: ask the resolver for fresh clock references. Records nothing."""
        for dc in list(self._clocks.values()):
            dc.want = True

    def capturing(self) -> bool:
        """Whether the current stream is capturing a CUDA graph (False on any CUDA error)."""
        try:
            return bool(self.cuda.is_current_stream_capturing())
        except Exception:  # noqa: BLE001
            return False

    def mark(self, stream: Any = None, device: int | None = None) -> Any:
        """An event on ``stream`` (default: the current stream of ``device``, by default the
        rank's — a collective on a tensor of another device ends on *that* device's current
        stream, not on the user's stream of the rank's); ``None`` while the current stream is
        capturing a CUDA graph, or on any CUDA error."""
        try:
            cuda = self.cuda
            if cuda.is_current_stream_capturing():
                self._capture_seen = self.clock()
                return None
            if stream is None:
                stream = cuda.current_stream(self.device if device is None else device)
            dev = getattr(stream, "device_index", None)
            dev = int(dev) if isinstance(dev, int) else (self.device if device is None else int(device))
            ev = cuda.Event(enable_timing=True)
            t = self.clock()
            ev.record(stream)
            if dev not in self._clocks:
                self._clocks[dev] = _DeviceClock(dev, self.REFS_KEPT)
            return (ev, _stream_key(stream), t, next(self._seq), dev)
        except Exception:  # noqa: BLE001 - never into the training loop
            return None

    def phase(self, start: Any, end: Any, meta: tuple) -> None:
        """Emit ``meta`` with the span's times once both events completed; ``None`` tokens drop it."""
        if start is None or end is None:
            self.stats["dropped_none"] += 1
            self._drop(meta)
            return
        if len(self._incoming) + self._held >= self.max_pending:
            self.stats["dropped_full"] += 1
            self._drop(meta)
            return
        self._incoming.append(_Span(start, end, meta))

    def _drop(self, meta: tuple) -> None:
        if self.dropped is not None:
            try:
                self.dropped(meta)
            except Exception:  # noqa: BLE001 - never into the training loop or the resolver
                pass

    @property
    def pending(self) -> int:
        return len(self._incoming) + self._held

    # -- the resolver ------------------------------------------------------------------------
    def _loop(self) -> None:
        if self._real_torch:
            _relax_capture_mode()
        while not self._stop.wait(self._poll_s):
            self.resolve()
            self.cpu_ns = time.thread_time_ns()  # read by the producer's CPU accounting
        self.resolve(final=True)

    def resolve(self, final: bool = False) -> None:
        """One pass: take new spans, refresh the clock reference when due, emit what completed."""
        try:
            now = self.clock()
            if self._capture_seen is not None and now - self._capture_seen < self.CAPTURE_QUIET_NS and not final:
                self.stats["capture_skips"] += 1
                return
            self._take_incoming()
            for dc in list(self._clocks.values()):
                if dc.late is not None:
                    self._check_late_ref(dc)
                elif self._reference_due(dc, now):
                    self._calibrate(dc)
            for key in list(self._queues):
                self._resolve_stream(key)
        except Exception as exc:  # noqa: BLE001 - the resolver never dies
            log.debug("argus: CUDA timing pass failed: %s", exc)
        for hook in list(self.on_pass):
            try:
                hook(final)
            except Exception as exc:  # noqa: BLE001
                log.debug("argus: CUDA timing hook failed: %s", exc)

    def _take_incoming(self) -> None:
        incoming = self._incoming
        while True:
            try:
                span = incoming.popleft()
            except IndexError:
                return
            q = self._queues.setdefault(span.m1[1], [])
            seq = span.m1[3]
            if not q or q[-1].m1[3] <= seq:
                q.append(span)
            else:  # an end recorded earlier but handed over later: keep the queue in record order
                i = len(q)
                while i > 0 and q[i - 1].m1[3] > seq:
                    i -= 1
                q.insert(i, span)
            self._held += 1

    def _resolve_stream(self, key: Any) -> None:
        q = self._queues[key]
        kept: list[_Span] = []
        for i, span in enumerate(q):
            try:
                end_done = span.m1[0].query()
                seen = self.clock()  # the end reached the GPU before this
            except Exception:  # noqa: BLE001
                self.stats["dropped_error"] += 1
                self._drop(span.meta)
                continue
            if not end_done:  # later ends on this stream are not done either
                kept.extend(q[i:])
                break
            try:
                start_done = span.m0[0].query()
            except Exception:  # noqa: BLE001
                self.stats["dropped_error"] += 1
                self._drop(span.meta)
                continue
            if not start_done:  # its start lies on another stream, still running
                kept.append(span)
                continue
            dc = self._clocks.get(span.m0[4])
            if dc is None or not dc.refs:  # no reference for its device yet: place it later
                kept.append(span)
                continue
            self._finish(span, seen, dc)
        self._held -= len(q) - len(kept)
        if kept:
            self._queues[key] = kept
        else:
            del self._queues[key]

    def _finish(self, span: _Span, seen: int, dc: _DeviceClock) -> None:
        ev0, _, enq0 = span.m0[:3]
        ev1 = span.m1[0]
        try:
            ref = self._reference_for(dc, enq0)
            g0 = int(round(ref.ev.elapsed_time(ev0) * 1e6))  # GPU ns from E to the start
            dur = int(round(ev0.elapsed_time(ev1) * 1e6))
        except Exception:  # noqa: BLE001 - a destroyed context at exit, events on two devices
            self.stats["dropped_error"] += 1
            self._drop(span.meta)
            return
        if dur < 0:
            self.stats["dropped_negative"] += 1
            self._drop(span.meta)
            return
        # the start reached the GPU after the host recorded it, the end before it was seen
        before = ref.err
        ref.narrow(enq0 - g0, seen - g0 - dur)
        if ref.err < before:
            self.stats["refs_narrowed"] += 1
        t0 = ref.t + g0
        try:
            self.emit(t0, t0 + dur, span.meta)
            self.stats["emitted"] += 1
        except Exception:  # noqa: BLE001
            self.stats["emit_errors"] += 1

    @staticmethod
    def _reference_for(dc: _DeviceClock, enqueued_ns: int) -> _Ref:
        """The newest reference completed before ``enqueued_ns`` (else the oldest kept)."""
        refs = dc.refs
        for ref in reversed(refs):
            if ref.h1 <= enqueued_ns:
                return ref
        return refs[0]

    def _reference_due(self, dc: _DeviceClock, now: int) -> bool:
        last = dc.last_try
        if last is None:
            return True
        age = now - last
        if age < self.CAL_MIN_INTERVAL_NS:
            return False
        if dc.want or (not dc.refs and self._held > 0):
            return True
        return age >= self.CAL_MAX_AGE_NS and self._held > 0

    def _calibrate(self, dc: _DeviceClock) -> None:
        """A clock reference: an event on an idle private stream, its completion spun on for at
        most ``SPIN_BUDGET_NS``; one the spin did not see complete is polled on later passes."""
        clock, cuda = self.clock, self.cuda
        dc.want = False
        dc.last_try = clock()
        if dc.stream is None:
            try:
                dc.stream = cuda.Stream(device=dc.device, priority=-1)
            except TypeError:
                dc.stream = cuda.Stream(device=dc.device)
        best = None
        began = clock()
        for _ in range(self.CAL_TRIES):
            ev = cuda.Event(enable_timing=True)
            h0 = clock()
            ev.record(dc.stream)
            h1 = None
            while True:
                if ev.query():
                    h1 = clock()
                    break
                now = clock()
                if now - h0 > self.SPIN_LIMIT_NS or now - began > self.SPIN_BUDGET_NS:
                    break
            if h1 is None:  # the device's queue holds it: see it complete on a later pass
                if best is None:
                    dc.late = (h0, ev)
                break
            if best is None or h1 - h0 < best[1] - best[0]:
                best = (h0, h1, ev)
            if h1 - h0 <= self.GOOD_RTT_NS or clock() - began > self.SPIN_BUDGET_NS:
                break
        if best is not None:
            self._add_ref(dc, *best)

    def _check_late_ref(self, dc: _DeviceClock) -> None:
        h0, ev = dc.late  # type: ignore[misc]
        if ev.query():
            dc.late = None
            self.stats["refs_late"] += 1
            self._add_ref(dc, h0, self.clock(), ev)
        elif self.clock() - h0 > 10 * self.CAL_MAX_AGE_NS:  # a queue that never drains: try afresh
            dc.late = None

    def _add_ref(self, dc: _DeviceClock, h0: int, h1: int, ev: Any) -> None:
        rtt = h1 - h0
        newest = dc.refs[-1] if dc.refs else None
        stale = newest is None or h1 - newest.h1 > 2 * self.CAL_MAX_AGE_NS
        if rtt > self.MAX_RTT_NS and not stale:
            self.stats["refs_rejected"] += 1
            return
        dc.refs.append(_Ref(h1, h0, h1, ev))
        self.stats["refs"] += 1
