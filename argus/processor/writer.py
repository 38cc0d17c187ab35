"""The processor's writer thread: closed windows through their exporters, off the loop.

Compression, Parquet and Perfetto take milliseconds to seconds per window; on their own
thread a slow disk never stalls ingestion. The hand-off queue is bounded (``queue_windows``):
when it is full the loop leaves windows in the assembler, whose memory cap counts what it
drops. Each window goes to its attempt's store partition first — it is acknowledged only
once on disk — then to the TSDB sinks (best effort: a failure there costs no ACK), then to
the evidence policy. The answer for each window comes back on a second queue
(:class:`~argus.ingest.WrittenWindow`), and a wake-up tells the loop to send the ACKs.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Iterator, Mapping

from argus.ingest import ClosedWindow, TsdbExporter, WrittenWindow
from argus.processor.attempts import AttemptState
from argus.processor.status import ProcessorStatus

__all__ = ["WriterThread"]

log = logging.getLogger("argus.processor")


class WriterThread:
    def __init__(self, capacity: int, attempts: Mapping[tuple[str, str], AttemptState], tsdb: TsdbExporter | None,
                 status: ProcessorStatus, wake: Callable[[], None]):
        self._work: queue.Queue[ClosedWindow | None] = queue.Queue(maxsize=capacity)
        self._done: queue.Queue[WrittenWindow] = queue.Queue()
        self._attempts = attempts
        self._tsdb = tsdb
        self._status = status
        self._wake = wake
        self._thread = threading.Thread(target=self._loop, name="argus-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def full(self) -> bool:
        return self._work.full()

    @property
    def backlog(self) -> int:
        """Windows queued and not yet taken by the thread."""
        return self._work.qsize()

    def offer(self, window: ClosedWindow) -> None:
        """Queue a window; the caller checked :attr:`full` (only the loop's thread puts)."""
        self._work.put(window)

    def put_stopping(self, window: ClosedWindow | None, heartbeat: Callable[[], None]) -> None:
        """Queue while shutting down (None: the end), calling ``heartbeat`` while it is full."""
        while True:
            try:
                self._work.put(window, timeout=0.5)
                return
            except queue.Full:
                heartbeat()

    def join(self, heartbeat: Callable[[], None]) -> None:
        """Wait for the thread to finish what is queued, calling ``heartbeat`` meanwhile."""
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)
            heartbeat()

    def written(self) -> Iterator[WrittenWindow]:
        """The windows done since the last call (written or failed), without waiting."""
        while True:
            try:
                yield self._done.get_nowait()
            except queue.Empty:
                return

    def _loop(self) -> None:
        while True:
            window = self._work.get()
            if window is None:
                return
            try:
                self._export(window)
                self._done.put(WrittenWindow.of(window, written=True))
            except Exception as exc:  # keep serving: a failed window is logged and counted
                self._status.write_errors += 1
                log.exception("writing window %d failed: %s", window.window, exc)
                self._done.put(WrittenWindow.of(window, written=False))
            self._wake()

    def _export(self, window: ClosedWindow) -> None:
        st = self._attempts[window.key]
        st.store.export(window)
        if self._tsdb is not None:
            try:  # the window is in the store already: nothing here may cost its acknowledgement
                self._tsdb.export(window)
            except Exception as exc:
                self._status.remote_write_errors += 1
                log.exception("remote write of window %d not queued: %s", window.window, exc)
        if st.evidence is not None:
            st.evidence.export(window)
