"""The job log channel of ``argus run``: tee the job's streams, scan them, keep the events.

Events wait in memory until the job's attempt exists (the processor makes it when the first
rank connects) and are written to its ``logs`` table every ``flush_s`` and at the end; a job
none of whose ranks connected keeps nothing in a store, but ``argus run`` still prints what it
saw.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, Callable

import pyarrow as pa

from argus.joblog.kernel import KernelLog
from argus.joblog.scanner import LogEvent, LogScanner
from argus.joblog.signatures import QUIET_KINDS, LogKind
from argus.joblog.tee import Tee, job_streams

__all__ = ["JobLog", "events_table"]

log = logging.getLogger("argus.joblog")


def events_table(events: list[LogEvent], other: dict[tuple[int, str], int], host: str, now_ns: int) -> pa.Table:
    from argus.store import conform

    cols: dict[str, list] = {k: [] for k in ("rank", "ts_ns", "host", "stream", "kind", "severity", "text", "lines")}
    for e in events:
        for k, v in zip(cols, (e.rank, e.ts_ns, host, e.stream, str(e.kind), e.severity, e.text, 1)):
            cols[k].append(v)
    for (rank, stream), n in sorted(other.items()):
        for k, v in zip(cols, (rank, now_ns, host, stream, str(LogKind.OTHER), "info", "", n)):
            cols[k].append(v)
    return conform("logs", cols)


class JobLog:
    """Streams for the job (``popen_kwargs``), the tee threads, and the flushes into the store."""

    def __init__(self, store: str, host: str, flush_s: float = 5.0, kernel_log: str | None = None,
                 local_offset: int | None = None):
        """``kernel_log``: the host's kernel log to read alongside (``kernel.KMSG``; None: not read);
        ``local_offset``: the global rank of the node's local rank 0, where the launch says it
        (``launch.local_rank_offset``)."""
        self.store, self.host, self.flush_s = store, host, flush_s
        self.scanner = LogScanner(pid_rank=self._pid_rank, local_offset=local_offset)
        self.kernel = KernelLog(kernel_log) if kernel_log else None
        self._streams = job_streams()
        self._tees: list[Tee] = []
        self._pids: dict[int, int] = {}
        self._held: tuple[list[LogEvent], dict[tuple[int, str], int]] = ([], {})
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._window = 0
        self.written = 0
        self.kinds: dict[str, int] = {}

    def popen_kwargs(self) -> dict[str, Any]:
        out, err = (w for _, _, w, _ in self._streams)
        return {"stdout": out, "stderr": err}

    def start(self) -> None:
        """After the job is started: our copies of its ends are closed, the tees run."""
        import os

        for name, r, w, fd in self._streams:
            os.close(w)
            self._tees.append(Tee(name, r, fd, self.scanner).start())
        self._flusher = threading.Thread(target=self._flush_loop, name="argus-joblog-flush", daemon=True)
        self._flusher.start()
        if self.kernel is not None:
            self.kernel.start()

    def _resolve_pids(self, events: list[LogEvent], wait_s: float) -> list[LogEvent]:
        """Ranks for lines that named only their pid; the processor writes its status every few
        seconds, so a rank that connected just before is waited for up to ``wait_s``."""
        import time

        deadline = time.monotonic() + wait_s
        while True:
            self._load_pids()
            if all(e.pid in self._pids for e in events if e.rank < 0 and e.pid >= 0) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        return [replace(e, rank=self._pids.get(e.pid, -1)) if e.rank < 0 and e.pid >= 0 else e for e in events]

    def finish(self, drain_s: float = 3.0) -> None:
        """After the job exited: read what is left (a lingering grandchild may hold the streams:
        not past ``drain_s``), scan the last partial lines, write everything."""
        for t in self._tees:
            t.join(drain_s)
        self.scanner.close()
        if self.kernel is not None:
            self.kernel.stop()
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(5.0)
        self.flush(pid_wait_s=3.0)

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - the job runs on whatever happens here
                log.warning("argus: job log flush failed: %s", exc)

    def _pid_rank(self, pid: int) -> int | None:
        if pid not in self._pids:
            self._load_pids()
        return self._pids.get(pid)

    def _load_pids(self) -> None:
        """pid → rank of every rank that connected to this host's processor (its status file)."""
        from argus.processor.status import read_status

        status = read_status(self.store, self.host)
        try:
            if status is not None:
                self._pids.update({int(p): int(r) for p, r in (status.rank_pids or {}).items()})
        except (ValueError, TypeError, AttributeError):
            pass

    def _attempt(self, runs: Callable[[], list[str]] | None = None) -> Any:
        from argus.store import Store

        from argus.processor.status import read_status

        status = read_status(self.store, self.host)
        try:
            keys = [str(k).split("/") for k in status.runs] if status is not None else []
        except (TypeError, AttributeError):
            return None
        if not keys:
            return None
        run_id, attempt_id = keys[-1][0], keys[-1][1] if len(keys[-1]) > 1 else None
        try:
            return Store.open(self.store).attempt(run_id, attempt_id)
        except Exception:  # noqa: BLE001 - not created yet, or unreadable: next time
            return None

    def flush(self, pid_wait_s: float = 0.0) -> None:
        """Write what was scanned since the last flush into the job's attempt (held until it exists)."""
        import time

        events, other = self.scanner.take()
        if self.kernel is not None:
            events = sorted(events + self.kernel.take(), key=lambda e: e.ts_ns)
        held_events, held_other = self._held
        events = held_events + events
        for k, n in other.items():
            held_other[k] = held_other.get(k, 0) + n
        for e in events[len(held_events):]:
            self.kinds[str(e.kind)] = self.kinds.get(str(e.kind), 0) + 1
        if not events and not held_other:
            self._held = ([], {})
            return
        attempt = self._attempt()
        if attempt is None:
            self._held = (events, held_other)
            return
        if any(e.rank < 0 and e.pid >= 0 for e in events):  # a pid the processor now knows
            events = self._resolve_pids(events, pid_wait_s)
        table = events_table(events, held_other, self.host, time.time_ns())
        attempt.writer(f"joblog-{self.host}").write("logs", table, self._window)
        self._window += 1
        self.written += len(events)
        self._held = ([], {})

    def summary(self) -> str:
        """One line for ``argus run``'s end (empty when nothing was recognised)."""
        shown = {k: n for k, n in self.kinds.items() if k not in QUIET_KINDS}
        if not shown:
            return ""
        return ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(shown.items(), key=lambda kv: -kv[1]))
