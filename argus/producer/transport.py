"""The producer's background thread: pack buffered events and ship them to the processor.

Never blocks training: the training thread only appends to the recorder; this thread wakes
every ``flush_interval_s`` (data flows while the job runs — real jobs end with ``os._exit``
or SIGKILL and no exit hook runs), drains, packs into the wire dtypes and sends. When the
processor is absent, slow or restarting, the batch is dropped and counted, and the thread
reconnects with backoff; the counts reach the processor as ``DROPS`` once it is back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from argus.processor.client import ProcessorClient
from argus.processor.protocol import DTYPES, Msg, encode_array, encode_json
from argus.producer.recorder import TABLES, Recorder

__all__ = ["Transport"]

log = logging.getLogger("argus.producer")

_MSG = {"steps": Msg.STEPS, "phases": Msg.PHASES, "kernels": Msg.KERNELS, "stacks": Msg.STACKS}


class Transport:
    def __init__(self, recorder: Recorder, socket_path: str, hello: dict[str, Any], flush_interval_s: float,
                 on_control: Callable[[dict], None] | None = None):
        self.recorder = recorder
        self.flush_interval_s = flush_interval_s
        self.client = ProcessorClient(socket_path, hello, timeout_s=2.0)
        self.on_control = on_control
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="argus-transport", daemon=True)
        self._backoff = 0.5
        self._next_connect = 0.0
        self._sent_names = 0
        self.sent_events = 0
        self.reported_drops = {t: 0 for t in TABLES}
        self.connected = False
        self.reconnects = 0
        self._warned = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Flush what is buffered and stop (best effort: a closed socket just drops it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self.flush()
        self.flush()
        self.client.close()

    # -- connection --------------------------------------------------------------------
    def _ensure_connected(self) -> bool:
        if self.connected:
            return True
        now = time.monotonic()
        if now < self._next_connect:
            return False
        try:
            self.client.connect()
            self.connected = True
            self._sent_names = 0  # a new processor knows none of our names
            if self.reconnects and not self._warned:
                log.info("argus: reconnected to the processor")
            self.reconnects += 1
            self._backoff = 0.5
            return True
        except (OSError, ConnectionError):
            self._next_connect = now + self._backoff
            self._backoff = min(self._backoff * 2, 2.0)  # a failed unix connect costs µs: retry soon
            if not self._warned:
                log.warning("argus: processor not reachable at %s; dropping and counting events until it is",
                            self.client.socket_path)
                self._warned = True
            return False

    # -- shipping ----------------------------------------------------------------------
    def flush(self) -> None:
        try:
            self._flush()
        except Exception as exc:  # the transport must never die: log and keep going
            log.debug("argus: flush failed: %s", exc)
            self._disconnect()

    def _disconnect(self) -> None:
        self.connected = False
        try:
            self.client.close(bye=False)
        except OSError:
            pass

    def _flush(self) -> None:
        batches = self.recorder.drain()
        if not self._ensure_connected():
            for table, rows in batches.items():
                self.recorder.dropped[table] += len(rows)
            return
        try:
            names = list(self.recorder.names.items())
            if len(names) > self._sent_names:
                new = sorted(names, key=lambda kv: kv[1])[self._sent_names:]
                self.client.send_raw(encode_json(Msg.NAMES, [[i, n] for n, i in new]))
                self._sent_names = len(names)
            for table, rows in batches.items():
                if rows:
                    records = np.array(rows, dtype=DTYPES[_MSG[table]])
                    self.client.send_raw(encode_array(_MSG[table], records))
                    self.sent_events += len(rows)
            self._send_drops()
            self._read_controls()
        except OSError:
            for table, rows in batches.items():
                self.recorder.dropped[table] += len(rows)
            self._disconnect()

    def _send_drops(self) -> None:
        new = [(i, self.recorder.dropped[t] - self.reported_drops[t]) for i, t in enumerate(TABLES)]
        new = [(i, n) for i, n in new if n > 0]
        if not new:
            return
        rows = np.zeros(len(new), DTYPES[Msg.DROPS])
        rows["table"] = [i for i, _ in new]
        rows["events"] = [n for _, n in new]
        rows["batches"] = 0
        self.client.send_raw(encode_array(Msg.DROPS, rows))
        for i, n in new:
            self.reported_drops[TABLES[i]] += n

    def _read_controls(self) -> None:
        self.client.poll_acks()
        self.client.acks.clear()  # nobody waits on ACKs here; keep memory flat
        while self.client.controls:
            doc = self.client.controls.pop(0)
            if self.on_control is not None:
                self.on_control(doc)
