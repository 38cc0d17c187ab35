"""Pass a job's output through unchanged while the scanner reads along.

The job writes into a pipe — or, where ``argus run``'s own output is a terminal, a pseudo
terminal with output processing off, so that the job still sees a terminal (line-buffered
Python, colours) and its bytes arrive as written. One thread per stream reads what is there
(``os.read``: no waiting for a full line or buffer) and writes it at once to the same stream
of ``argus run``, then hands a copy to the scanner. Writing comes first and never depends on
the scanner: a scanner that fails is switched off and the bytes keep flowing. If ``argus
run``'s own stream is gone (a closed pipe), the job's output is still drained, so the job
never blocks on a pipe nobody reads.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from argus.joblog.scanner import LogScanner

__all__ = ["Tee", "job_streams"]

log = logging.getLogger("argus.joblog")

_CHUNK = 1 << 16


def _terminal_pair(like_fd: int) -> tuple[int, int]:
    """(read end, job's end) of a pseudo terminal sized like ``like_fd``, output unprocessed."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # no "\n" → "\r\n": the bytes as the job wrote them
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    try:
        size = fcntl.ioctl(like_fd, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    except OSError:
        pass
    return master, slave


def job_streams(out_fd: int = 1, err_fd: int = 2) -> list[tuple[str, int, int, int]]:
    """``[(stream, read end, the job's end, where it goes), …]`` for stdout and stderr."""
    streams = []
    for name, fd in (("stdout", out_fd), ("stderr", err_fd)):
        try:
            tty = os.isatty(fd)
        except OSError:
            tty = False
        if tty:
            try:
                r, w = _terminal_pair(fd)
            except (OSError, ImportError):
                r, w = os.pipe()
        else:
            r, w = os.pipe()
        streams.append((name, r, w, fd))
    return streams


class Tee:
    """Copies ``read_fd`` to ``out_fd`` on a thread, feeding ``scanner`` along the way."""

    def __init__(self, stream: str, read_fd: int, out_fd: int, scanner: LogScanner | None):
        self.stream, self.read_fd, self.out_fd, self.scanner = stream, read_fd, out_fd, scanner
        self.bytes = 0
        self.out_broken = False
        self._thread = threading.Thread(target=self._run, name=f"argus-tee-{stream}", daemon=True)

    def start(self) -> "Tee":
        self._thread.start()
        return self

    def join(self, timeout: float) -> bool:
        """Whether the stream reached its end (every writer closed it) within ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.out_broken:
            try:
                n = os.write(self.out_fd, view)
            except InterruptedError:
                continue
            except OSError:  # our own stream is gone: keep draining the job's
                self.out_broken = True
                return
            view = view[n:]

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, _CHUNK)
            except InterruptedError:
                continue
            except OSError:  # EIO: a pseudo terminal whose last writer closed it
                data = b""
            if not data:
                break
            self._write(data)
            self.bytes += len(data)
            if self.scanner is not None:
                try:
                    self.scanner.feed(self.stream, data)
                except Exception as exc:  # noqa: BLE001 - the bytes keep flowing without it
                    log.warning("argus: job log scanning off for %s: %s", self.stream, exc)
                    self.scanner = None
        try:
            os.close(self.read_fd)
        except OSError:
            pass

    def status(self) -> dict[str, Any]:
        return {"stream": self.stream, "bytes": self.bytes, "out_broken": self.out_broken}
