"""The processor's settings: one dataclass, validated when built (``argus processor`` and
``argus run`` take their flags' defaults from it)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argus.errors import ConfigError
from argus.processor.assembler import WINDOW_TIMEOUT_S
from argus.processor.hangs import HangConfig
from argus.processor.limits import (ATTEMPT_IDLE_S, HELLO_TIMEOUT_S, MAX_PENDING_FRAME_BYTES,
                                    default_max_connections)
from argus.store.window import WINDOW_STEPS
from argus.wire import default_socket_path

__all__ = ["ProcessorConfig"]


@dataclass(kw_only=True)
class ProcessorConfig:
    store: Path
    socket_path: Path = field(default_factory=default_socket_path)
    host: str = field(default_factory=socket.gethostname)
    window_steps: int = WINDOW_STEPS
    window_timeout_s: float = WINDOW_TIMEOUT_S
    max_buffered_events: int = 20_000_000
    queue_windows: int = 4
    raw_kernels: bool = False
    evidence: bool = True
    evidence_max_bytes: int = 512 << 20
    evidence_max_age_s: float = 24 * 3600.0
    evidence_interval_s: float = 10.0  # evidence for a normal window at most this often (slow ones always)
    status_interval_s: float = 2.0
    durable: bool = True
    stacks: bool = True  # sample local ranks' Python stacks with py-spy
    stack_hz: float = 0.5  # always-on rate per rank: one py-spy dump ≈ 8 ms CPU (argus bench overhead)
    suspect_stack_hz: float = 10.0  # rate for ranks under suspicion (stalled, slow last step)
    py_spy: str | None = None  # py-spy executable (default: $ARGUS_PY_SPY, next to Python, PATH)
    hw_interval_s: float = 5.0  # NVML telemetry and host counters period (NVML: off without it)
    host_root: str = "/"  # where the host counters' /proc and /sys are (host_counters.py; tests: a fake tree)
    host_counters: bool = True  # off for jobs that are not this host's (a simulator or a replay feeding it)
    remote_write: list[Any] = field(default_factory=list)  # argus.tsdb.RemoteWriteConfig per TSDB
    remote_write_flush_s: float = 10.0  # at shutdown, time the sinks get to send what is queued
    hang: HangConfig = field(default_factory=HangConfig)  # live hang detection (processor/hangs.py)
    attempt_idle_s: float = ATTEMPT_IDLE_S  # an attempt with nothing to serve this long is released
    max_pending_frame_bytes: int = MAX_PENDING_FRAME_BYTES  # unfinished frames, all connections (limits.py)
    max_connections: int = field(default_factory=default_max_connections)  # beyond it: accepted, closed, counted
    hello_timeout_s: float = HELLO_TIMEOUT_S  # a connection without a HELLO by then is closed (limits.py)

    def __post_init__(self) -> None:
        self.store, self.socket_path = Path(self.store), Path(self.socket_path)
        if self.window_steps < 1 or self.window_timeout_s <= 0 or self.max_buffered_events < 1:
            raise ConfigError("window_steps, window_timeout_s and max_buffered_events must be positive")
        if self.queue_windows < 1:
            raise ConfigError("queue_windows must be at least 1")
        if not self.host or "/" in self.host or self.host.startswith("."):
            raise ConfigError(f"host name {self.host!r} cannot name a store partition")
        if not 0 < self.stack_hz <= 100 or not 0 < self.suspect_stack_hz <= 100:
            raise ConfigError(f"stack_hz ({self.stack_hz}) and suspect_stack_hz ({self.suspect_stack_hz}) "
                              "must be in (0, 100]")
        if self.hw_interval_s <= 0:
            raise ConfigError(f"hw_interval_s must be positive, not {self.hw_interval_s}")
        if self.remote_write_flush_s < 0:
            raise ConfigError(f"remote_write_flush_s must not be negative, not {self.remote_write_flush_s}")
        if self.max_pending_frame_bytes < 1 or self.max_connections < 1 or self.hello_timeout_s <= 0:
            raise ConfigError("max_pending_frame_bytes, max_connections and hello_timeout_s must be positive")
