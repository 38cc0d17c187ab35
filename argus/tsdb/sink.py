"""The processor's remote-write sink: closed windows → series → a TSDB, off the hot path.

The processor's writer thread calls :meth:`RemoteWriteSink.submit`, which only appends to a
bounded queue (when full, the *oldest* window is dropped and counted: fresh data matters
most to whoever watches a live job). One background thread per sink builds the series
(``series.py``), encodes and compresses them (``remote_write.py``) and POSTs them, so the
TSDB being slow, down or refusing never blocks or crashes the processor.

Retries: connection errors, timeouts, 5xx and 429 are retried with exponential backoff
(``backoff_s`` doubling up to ``max_backoff_s``; the level is shared across requests, so a
TSDB that is down is not hammered) up to ``max_attempts`` per request; then the request is
dropped. Other 4xx answers mean the TSDB will never take that body (e.g. samples out of its
time range): dropped at once. Every drop is counted by reason in :meth:`stats` and handed to
the processor (:meth:`take_drops`) for the store's ``drops`` table, table ``remote_write``.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
import time
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

import numpy as np

from argus import env as argus_env
from argus.errors import ConfigError
from argus.tsdb.remote_write import HEADERS, LabelCache, compress, encode_histogram_series, encode_write_request
from argus.tsdb.series import AttemptClock, SeriesBatch, WindowJob, build_window_series

__all__ = ["RemoteWriteConfig", "RemoteWriteSink", "DROP_REASONS", "ENV_JOB", "post_once"]

log = logging.getLogger("argus.tsdb")

_ATTEMPTS_KEPT = 8  # attempts whose clock mapping and last stamps a sink remembers

#: ``job`` label of every series when the caller does not name one.
ENV_JOB = argus_env.TSDB_JOB

#: Why a sink drops data (the ``reason`` of its ``drops`` rows, table ``remote_write``).
DROP_REASONS = {
    "tsdb_queue_full": "a window waited behind ``queue_windows`` others (events: its store rows)",
    "tsdb_unreachable": "a request failed ``max_attempts`` times (connection, timeout, 5xx, 429)",
    "tsdb_rejected": "the TSDB answered 4xx: it will never accept this body",
    "tsdb_out_of_order": "samples not newer than their series' last one (a window written twice)",
    "tsdb_encode_error": "building or encoding the window failed (a bug: see the processor log)",
}


@dataclass(kw_only=True, slots=True)
class RemoteWriteConfig:
    """One remote-write target. ``url`` is the full endpoint, e.g.
    ``http://tsdb:8428/api/v1/write`` (VictoriaMetrics) or ``…:9090/api/v1/write`` (Prometheus)."""

    url: str
    job: str | None = None  # ``job`` label; default $ARGUS_TSDB_JOB, else "argus"
    queue_windows: int = 16
    timeout_s: float = 5.0
    max_attempts: int = 6
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    max_samples_per_request: int = 20_000
    native_histograms: bool = False  # also send kernel sketches as native histograms (Prometheus needs
    # --enable-feature=native-histograms, or it refuses the whole request)
    heartbeat_s: float = 15.0  # the processor's liveness series at least this often, windows or not

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"remote-write URL {self.url!r}: expected http(s)://HOST[:PORT]/PATH, e.g. "
                              "http://127.0.0.1:8428/api/v1/write")
        try:
            _ = parts.port
        except ValueError:
            raise ConfigError(f"remote-write URL {self.url!r}: bad port") from None
        if self.job is None:
            self.job = os.environ.get(ENV_JOB) or "argus"
        if self.queue_windows < 1 or self.max_attempts < 1 or self.max_samples_per_request < 1:
            raise ConfigError("queue_windows, max_attempts and max_samples_per_request must be at least 1")
        if self.heartbeat_s <= 0:
            raise ConfigError(f"heartbeat_s must be positive, not {self.heartbeat_s}")
        if self.timeout_s <= 0 or self.backoff_s <= 0 or self.max_backoff_s < self.backoff_s:
            raise ConfigError("timeout_s and backoff_s must be positive and max_backoff_s ≥ backoff_s")


class _Http:
    """One keep-alive connection, reopened after any error."""

    def __init__(self, url: str, timeout_s: float):
        p = urlsplit(url)
        self.https = p.scheme == "https"
        self.host, self.port = p.hostname or "", p.port
        self.path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> tuple[int, str]:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout_s)
        try:
            self._conn.request("POST", self.path, body=body, headers=HEADERS)
            resp = self._conn.getresponse()
            text = resp.read(4096).decode(errors="replace")
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
            return resp.status, text
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def post_once(url: str, body: bytes, timeout_s: float = 10.0) -> tuple[int, str]:
    """One remote-write request (an already compressed body), for a one-off push such as a health
    check's figures: (HTTP status, the start of the reply)."""
    conn = _Http(url, timeout_s)
    try:
        return conn.post(body)
    finally:
        conn.close()


@dataclass(frozen=True)
class Liveness:
    """What the processor says about itself and its jobs in every heartbeat: the alert rules on
    absence read it (a processor that stops saying it, a job whose ranks are connected but whose
    steps stopped)."""

    host: str
    runs: tuple[tuple[str, str, int, float], ...] = ()  # (run, attempt, ranks connected, last step's wall s)
    queued_windows: int = 0
    last_window_s: float = 0.0  # wall time the last window was written (0: none yet)


class RemoteWriteSink:
    """Bounded queue + one sender thread; :meth:`close` flushes within a deadline. With
    ``liveness``, the thread also sends the processor's heartbeat (``Liveness``) every
    ``config.heartbeat_s`` — the series the absence rules watch."""

    def __init__(self, config: RemoteWriteConfig, *, post: Callable[[bytes], tuple[int, str]] | None = None,
                 wall_ns: Callable[[], int] = time.time_ns, liveness: Callable[[], Liveness] | None = None):
        self.config = config
        self._liveness = liveness
        self._last_beat = 0.0
        self._http = _Http(config.url, config.timeout_s)
        self._post = post or self._http.post
        self._wall_ns = wall_ns
        self._queue: deque[WindowJob] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name="argus-remote-write", daemon=True)
        # per attempt, most recent last: its clock mapping and each series' last stamp
        self._attempt_state: OrderedDict[tuple[str, str], tuple[AttemptClock, dict[tuple, int]]] = OrderedDict()
        self._labels = LabelCache()
        self._backoff_level = 0
        self._drops: dict[tuple[str, str], list[tuple[int, int, int, str]]] = defaultdict(list)
        self._stats: dict[str, Any] = {"url": config.url, "windows_sent": 0, "requests_sent": 0, "samples_sent": 0,
                                       "bytes_sent": 0, "bytes_uncompressed": 0, "retries": 0, "failed_requests": 0,
                                       "dropped_windows": 0, "dropped": defaultdict(int),
                                       "last_error": None, "last_success": None}
        self._self_metrics_ms = -1

    # -- the processor's side ------------------------------------------------------------
    def start(self) -> "RemoteWriteSink":
        self._thread.start()
        return self

    def submit(self, job: WindowJob) -> bool:
        """Queue a window; never blocks. False when an older window had to make room."""
        with self._cond:
            if self._closing:
                self._drop_window(job)
                return False
            dropped = False
            while len(self._queue) >= self.config.queue_windows:
                self._drop_window(self._queue.popleft())
                dropped = True
            self._queue.append(job)
            self._cond.notify()
            return not dropped

    def take_drops(self, key: tuple[str, str]) -> list[tuple[int, int, int, str]]:
        """Drops of one attempt since the last call: ``(window, events, batches, reason)``."""
        with self._cond:
            return self._drops.pop(key, [])

    def stats(self) -> dict[str, Any]:
        with self._cond:
            out = dict(self._stats, queued=len(self._queue), series_cached=len(self._labels))
            out["dropped"] = dict(self._stats["dropped"])
            return out

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued for at most ``timeout_s``, then drop (and count) the rest."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s + self.config.timeout_s + 1.0)
        self._http.close()

    def __enter__(self) -> "RemoteWriteSink":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the sender thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing and not self._beat_due():
                    self._cond.wait(self._beat_wait())
                if not self._queue and not self._closing:
                    job = None  # a heartbeat is due
                elif not self._queue:
                    return
                elif time.monotonic() > self._deadline:
                    while self._queue:
                        self._drop_window(self._queue.popleft())
                    return
                else:
                    job = self._queue.popleft()
            if job is None:
                self._beat()
                continue
            try:
                self._send_window(job)
            except Exception as exc:  # never let one bad window stop the sink
                log.exception("remote write of window %d failed: %s", job.window, exc)
                self._count_drop(job, 0, 1, "tsdb_encode_error")
            if self._beat_due():
                self._beat()

    def _beat_due(self) -> bool:
        return self._liveness is not None and time.monotonic() >= self._last_beat + self.config.heartbeat_s

    def _beat_wait(self) -> float | None:
        return None if self._liveness is None else max(0.0, self._last_beat + self.config.heartbeat_s - time.monotonic())

    def _beat(self) -> None:
        """The processor's liveness series, sent now (a failure is counted like any request's)."""
        self._last_beat = time.monotonic()
        try:
            live = self._liveness() if self._liveness is not None else None
        except Exception as exc:  # noqa: BLE001 - a heartbeat never stops the sink
            log.debug("no heartbeat: %s", exc)
            return
        if live is None:
            return
        ms = max(self._wall_ns() // 1_000_000, self._self_metrics_ms + 1)
        self._self_metrics_ms = ms
        batch = SeriesBatch()
        base = (("job", self.config.job or "argus"), ("host", live.host))
        t, now_s = np.array([ms]), ms / 1000.0
        batch.add("argus_processor_heartbeat_seconds", base, {}, t, np.array([now_s]))
        batch.add("argus_processor_queued_windows", base, {}, t, np.array([float(live.queued_windows)]))
        if live.last_window_s > 0:
            batch.add("argus_processor_last_window_seconds", base, {}, t, np.array([live.last_window_s]))
        for run, attempt, ranks, last_step_s in live.runs:
            labels = (*base, ("run", run), ("attempt", attempt))
            batch.add("argus_run_ranks_connected", labels, {}, t, np.array([float(ranks)]))
            if last_step_s > 0:
                batch.add("argus_run_last_step_seconds", labels, {}, t, np.array([last_step_s]))
        series, ts, values = batch.arrays()
        body = encode_write_request([self._labels.get(k) for k in batch.keys], series, ts, values)
        try:
            status, text = self._post(compress(body))
        except (OSError, http.client.HTTPException) as exc:
            status, text = 0, f"{type(exc).__name__}: {exc}"
        with self._cond:
            if 200 <= status < 300:
                self._stats["heartbeats"] = self._stats.get("heartbeats", 0) + 1
            else:
                self._stats["failed_requests"] += 1
                self._stats["last_error"] = f"heartbeat: HTTP {status}: {text.strip()[:200]}" if status else text

    def _send_window(self, job: WindowJob) -> None:
        clock, last_ms = self._state(job.key)
        batch = build_window_series(job, clock, self.config.job or "argus", now_ns=self._wall_ns())
        self._add_self_metrics(batch, job)
        series, ts, values = batch.arrays()
        series, ts, values, stale = _only_newer(last_ms, batch, series, ts, values)
        if stale:
            self._count_drop(job, stale, 0, "tsdb_out_of_order")
        labels = [self._labels.get(k) for k in batch.keys]
        ok = True
        for lo, hi in _chunks(series, self.config.max_samples_per_request):
            body = encode_write_request(labels, series[lo:hi], ts[lo:hi], values[lo:hi])
            ok &= self._send(compress(body), len(body), hi - lo, job)
        if self.config.native_histograms and batch.histograms:
            ok &= self._send_histograms(batch, job)
        if ok:
            with self._cond:
                self._stats["windows_sent"] += 1

    def _send_histograms(self, batch: SeriesBatch, job: WindowJob) -> bool:
        ok = True
        step = max(1, self.config.max_samples_per_request // 50)  # a histogram is ~50 samples' bytes
        for lo in range(0, len(batch.histograms), step):
            parts = [encode_histogram_series(self._labels.get(k), ts, row["schema"], row["count"], row["zero_count"],
                                             row["sum_ns"], np.asarray(row["buckets"]), np.asarray(row["counts"]))
                     for k, ts, row in batch.histograms[lo:lo + step]]
            body = b"".join(parts)
            ok &= self._send(compress(body), len(body), len(parts), job)
        return ok

    def _state(self, key: tuple[str, str]) -> tuple[AttemptClock, dict[tuple, int]]:
        """An attempt's clock and last stamps; only the most recent attempts are remembered
        (a processor serves one job's attempts in turn, and must not grow without bound)."""
        state = self._attempt_state.get(key)
        if state is None:
            state = self._attempt_state[key] = (AttemptClock(), {})
            while len(self._attempt_state) > _ATTEMPTS_KEPT:
                self._attempt_state.popitem(last=False)
        self._attempt_state.move_to_end(key)
        return state

    def _add_self_metrics(self, batch: SeriesBatch, job: WindowJob) -> None:
        """The sink's own counters, so a dashboard sees a TSDB link losing data."""
        ms = max(self._wall_ns() // 1_000_000, self._self_metrics_ms + 1)
        self._self_metrics_ms = ms
        base = (("job", self.config.job or "argus"), ("host", job.host))
        with self._cond:
            s = self._stats
            counters = [("argus_remote_write_samples_total", (), s["samples_sent"]),
                        ("argus_remote_write_retries_total", (), s["retries"]),
                        *[("argus_remote_write_dropped_total", (("reason", r),), n)
                          for r, n in s["dropped"].items()]]
        for name, extra, value in counters:
            batch.add(name, (*base, *extra), {}, np.array([ms]), np.array([float(value)]))

    def _send(self, body: bytes, raw_bytes: int, samples: int, job: WindowJob) -> bool:
        attempts = 0
        while True:
            try:
                status, text = self._post(body)
            except (OSError, http.client.HTTPException) as exc:
                status, text = 0, f"{type(exc).__name__}: {exc}"
            if 200 <= status < 300:
                with self._cond:
                    s = self._stats
                    s["requests_sent"] += 1
                    s["samples_sent"] += samples
                    s["bytes_sent"] += len(body)
                    s["bytes_uncompressed"] += raw_bytes
                    s["last_success"] = time.time()
                    self._backoff_level = 0
                return True
            error = f"HTTP {status}: {text.strip()[:200]}" if status else text
            with self._cond:
                self._stats["last_error"] = error
            if 400 <= status < 500 and status != 429:
                log.warning("remote write to %s rejected (%s); %d samples dropped", self.config.url, error, samples)
                self._count_drop(job, samples, 1, "tsdb_rejected")
                return False
            attempts += 1
            if attempts >= self.config.max_attempts or time.monotonic() > self._deadline:
                log.warning("remote write to %s failed %d times (%s); %d samples dropped", self.config.url,
                            attempts, error, samples)
                self._count_drop(job, samples, 1, "tsdb_unreachable")
                return False
            with self._cond:
                self._stats["retries"] += 1
                delay = min(self.config.max_backoff_s, self.config.backoff_s * 2 ** self._backoff_level)
                self._backoff_level = min(self._backoff_level + 1, 30)
                self._cond.wait_for(lambda: time.monotonic() > self._deadline,
                                    timeout=min(delay, max(self._deadline - time.monotonic(), 0.0)))

    def _drop_window(self, job: WindowJob) -> None:
        """Called with the lock held."""
        rows = sum(t.num_rows for t in (job.steps, job.phases, job.hw, job.summaries) if t is not None)
        self._stats["dropped_windows"] += 1
        self._stats["dropped"]["tsdb_queue_full"] += rows
        self._drops[job.key].append((job.window, rows, 1, "tsdb_queue_full"))

    def _count_drop(self, job: WindowJob, samples: int, batches: int, reason: str) -> None:
        with self._cond:
            self._stats["dropped"][reason] += samples
            if reason in ("tsdb_unreachable", "tsdb_rejected"):
                self._stats["failed_requests"] += batches
            self._drops[job.key].append((job.window, samples, batches, reason))


def _only_newer(last_ms: dict[tuple, int], batch: SeriesBatch, series: np.ndarray, ts: np.ndarray,
                values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Keep samples newer than their series' last sent one (the TSDB would refuse the whole
    request otherwise); of equal stamps within the batch, the last. Updates ``last_ms``."""
    if len(series) == 0:
        return series, ts, values, 0
    last = np.array([last_ms.get(k, -1) for k in batch.keys], np.int64)
    keep = ts > last[series]
    keep[:-1] &= ~((series[1:] == series[:-1]) & (ts[1:] == ts[:-1]))
    dropped = int((~keep).sum())
    series, ts, values = series[keep], ts[keep], values[keep]
    if len(series):
        ends = np.r_[np.flatnonzero(np.diff(series)), len(series) - 1]
        for sid, t in zip(series[ends].tolist(), ts[ends].tolist()):
            last_ms[batch.keys[sid]] = t
    return series, ts, values, dropped


def _chunks(series: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Split sorted samples into requests of ≤ ``limit`` samples, at series boundaries when
    a series fits (a longer one is split: its parts stay in time order)."""
    n = len(series)
    out, lo = [], 0
    while lo < n:
        hi = min(lo + limit, n)
        if hi < n and series[hi] == series[hi - 1]:
            cut = int(np.searchsorted(series, series[hi], side="left"))
            hi = cut if cut > lo else hi
        out.append((lo, hi))
        lo = hi
    return out
