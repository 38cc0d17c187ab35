"""The producer's one background thread: keep the processor told where this rank's ring is.

Records never travel through this thread (they are in the ring the moment they are made);
it connects to the host's processor, sends ``HELLO`` with the ring's path, reads the
processor's ``CONTROL`` requests, and reconnects with backoff when the processor is absent
or restarted (a new processor continues draining the ring where the old one stopped: the
ring's read position lives in the ring). It also performs ring writes that threads left to
the lock's holder (``RingWriter.settle``) and the runtime's periodic duties.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from argus.wire import ProcessorClient, RingWriter

__all__ = ["Transport"]

log = logging.getLogger("argus.producer")

#: say the processor is unreachable only once it has been for this long: ``argus run`` starts
#: the job beside its processor, which may come up a little after a fast rank's first try
WARN_AFTER_S = 5.0


class Transport:
    def __init__(self, ring: RingWriter, socket_path: str, hello: dict[str, Any], interval_s: float,
                 on_control: Callable[[dict], None] | None = None, on_tick: Callable[[], None] | None = None,
                 other_cpu_ns: Callable[[], int] = lambda: 0):
        self.ring = ring
        self.interval_s = interval_s
        self.client = ProcessorClient(socket_path, {**hello, "ring": str(ring.path)}, timeout_s=2.0)
        self.on_control = on_control
        self.on_tick = on_tick
        self.other_cpu_ns = other_cpu_ns  # CPU of the producer's other threads (stacks, CUDA events, CUPTI)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="argus-transport", daemon=True)
        self._backoff = 0.2
        self._next_connect = 0.0
        self.connected = False
        self.ever_connected = False
        self._warned = False
        self._unreachable_since: float | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def forget_in_child(self) -> None:
        """After ``fork``: the connection belongs to the parent; close our copy of the socket
        (the parent's stays open) and never use it."""
        self._stop.set()
        sock, self.client.sock = self.client.sock, None
        if sock is not None:
            try:
                sock.close()  # our descriptor only: close() never shuts the shared connection down
            except OSError:
                pass

    def _loop(self) -> None:
        self._tick()
        while not self._stop.wait(self.interval_s):
            self._tick()
        self.ring.settle()
        if self.connected:
            self.client.close(bye=True)

    def _tick(self) -> None:
        try:
            self.ring.settle()
            if self.on_tick is not None:
                self.on_tick()
            self.ring.inflight.own_cpu(time.thread_time_ns() + self.other_cpu_ns())
            if self._ensure_connected():
                self.client.poll_acks()
                self.client.acks.clear()
                if self.client.peer_closed:
                    self._disconnect()
                while self.client.controls:
                    doc = self.client.controls.pop(0)
                    if self.on_control is not None:
                        self.on_control(doc)
        except Exception as exc:  # noqa: BLE001 - the thread must never die
            log.debug("argus: transport tick failed: %s", exc)
            self._disconnect()

    def _ensure_connected(self) -> bool:
        if self.connected:
            return True
        now = time.monotonic()
        if now < self._next_connect:
            return False
        try:
            self.client.connect()
            self.connected = self.ever_connected = True
            self._backoff, self._unreachable_since = 0.2, None
            return True
        except (OSError, ConnectionError):
            self._next_connect = now + self._backoff
            self._backoff = min(self._backoff * 2, 2.0)
            if self._unreachable_since is None:
                self._unreachable_since = now
            if not self._warned and now - self._unreachable_since >= WARN_AFTER_S:
                log.warning("argus: processor not reachable at %s; recording into the ring until it is",
                            self.client.socket_path)
                self._warned = True
            return False

    def _disconnect(self) -> None:
        self.connected = False
        try:
            self.client.close(bye=False)
        except OSError:
            pass
