"""The host's kernel log while the job runs: what the driver or the OS did to a rank.

A job's own output cannot say that the GPU driver reported an Xid (a GPU fallen off the bus,
a double-bit ECC error), that the kernel's OOM killer ended a rank (the launcher only sees a
SIGKILL), or that a NIC port lost its link: the kernel log does. ``KernelLog`` tails it from
the moment ``argus run`` starts (``/dev/kmsg``: one record per read, ``prio,seq,µs,flags;text``;
or any text file, such as ``/var/log/kern.log``, line by line), matches each line against
``signatures.KERNEL_SIGNATURES`` and keeps the matches as events of the process a line names
(its rank, once the processor knows the pid) or of the host (rank -1). Lines that match nothing
are not kept. Unreadable (no permission, a container without ``/dev/kmsg``): one log line and
the channel is off; the job never notices.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from typing import Callable

from argus.joblog.scanner import LogEvent
from argus.joblog.signatures import KERNEL_SIGNATURES, Signature

__all__ = ["KernelLog", "KMSG", "parse_kernel_line"]

log = logging.getLogger("argus.joblog")

KMSG = "/dev/kmsg"
MAX_EVENTS = 10_000  # a flapping port must not grow memory without bound
MAX_TEXT = 400


def parse_kernel_line(line: str) -> tuple[Signature, int, str] | None:
    """(signature, pid, text) of a kernel log line one of the signatures knows, else None. A
    ``/dev/kmsg`` record's ``prio,seq,µs,flags;`` header is taken off; its continuation lines
    (``' KEY=value'``) match nothing."""
    if not line or line[0] == " ":
        return None
    head, sep, rest = line.partition(";")
    if sep and head.count(",") >= 3 and head.split(",", 1)[0].isdigit():
        line = rest
    line = line.rstrip("\r\n")
    for sig in KERNEL_SIGNATURES:
        m = sig.pattern.search(line)
        if m is not None:
            pid = next((int(v) for k, v in m.groupdict().items() if k.startswith("pid") and v), -1)
            return sig, pid, line[:MAX_TEXT]
    return None


class KernelLog:
    """A thread reading the kernel log every ``interval_s`` from its end at :meth:`start`."""

    def __init__(self, path: str = KMSG, interval_s: float = 1.0, clock: Callable[[], int] = time.time_ns):
        self.path, self.interval_s, self.clock = path, interval_s, clock
        self._fd = -1
        self._partial = b""
        self._lock = threading.Lock()
        self._pending: list[LogEvent] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events = 0
        self.dropped = 0
        self.off: str | None = None  # why the channel is off

    def start(self) -> "KernelLog":
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)  # only what happens from now on
        except OSError as exc:
            self._close()
            self.off = f"{self.path} not readable ({exc.strerror or exc})"
            log.info("argus: kernel log channel off: %s", self.off)
            return self
        self._thread = threading.Thread(target=self._loop, name="argus-kernel-log", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.read_once()
        self._close()

    def take(self) -> list[LogEvent]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def _close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = -1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.read_once()
            except Exception as exc:  # noqa: BLE001 - the channel stops, the job runs on
                log.info("argus: kernel log channel stopped: %s", exc)
                self._close()
                return

    def read_once(self) -> None:
        """Everything written since the last read (``/dev/kmsg`` answers one record a read)."""
        while self._fd >= 0:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them: go on from here
                    continue
                raise
            if not chunk:
                break
            data = self._partial + chunk
            lines = data.split(b"\n")
            self._partial = lines.pop()[-MAX_TEXT * 4:]
            for raw in lines:
                self._line(raw.decode("utf-8", "replace"))

    def _line(self, line: str) -> None:
        hit = parse_kernel_line(line)
        if hit is None:
            return
        sig, pid, text = hit
        with self._lock:
            if self.events >= MAX_EVENTS:
                self.dropped += 1
                return
            self.events += 1
            self._pending.append(LogEvent(self.clock(), -1, "kernel", sig.kind, sig.severity, text, pid))
