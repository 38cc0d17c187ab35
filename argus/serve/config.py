"""Settings of the web UI, validated before anything binds a socket."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from argus import env as argus_env
from argus.errors import ConfigError

__all__ = ["ServeConfig", "is_loopback", "ENV_TOKEN", "DEFAULT_PORT", "MIN_TOKEN_CHARS", "MAX_PENDING_CONNECTIONS",
           "MAX_CONNECTIONS", "PENDING_DEADLINE_S", "SOCKET_TIMEOUT_S"]

DEFAULT_PORT = 8765
ENV_TOKEN = argus_env.SERVE_TOKEN  # the access token, when not given as --token (keeps it out of `ps`)
#: Shortest token accepted. 16 characters of even a lowercase-and-digits alphabet are ~82
#: bits: not guessable over HTTP, while a one-word token falls to a dictionary in seconds.
MIN_TOKEN_CHARS = 16
#: Connections not yet authorised, at most. A browser opens ~6 per host; the cap stops a local
#: user (or, beyond loopback, anyone) from holding a thread each with idle sockets.
MAX_PENDING_CONNECTIONS = 32
#: Connections in all (one thread each), authorised or not: a few browsers' worth of tabs.
MAX_CONNECTIONS = 128
#: Seconds a new connection has to deliver a complete, authorised request, counted from
#: accept: ample for any client on a LAN, short enough that a slow drip frees its slot soon.
PENDING_DEADLINE_S = 5.0
#: Seconds any single read or write may block: an idle keep-alive connection, or a client
#: that stops reading a response, is dropped after this long.
SOCKET_TIMEOUT_S = 30.0
_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no space: travels in a header as written
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    """True for names and addresses that only this machine can reach."""
    h = host.strip("[]").lower()
    if h in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@dataclass(kw_only=True, slots=True)
class ServeConfig:
    """``host`` defaults to loopback. Any other address serves the store's data to the
    network, so it needs a ``token`` (every request then carries it) or an explicit
    ``insecure``. ``poll_s`` is how often pages ask the server whether the store changed.
    The connection limits are described at their defaults (``MAX_PENDING_CONNECTIONS`` …)."""

    store: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    insecure: bool = False
    poll_s: float = 3.0
    quiet: bool = True  # no per-request log lines
    max_pending: int = MAX_PENDING_CONNECTIONS
    max_connections: int = MAX_CONNECTIONS
    pending_deadline_s: float = PENDING_DEADLINE_S
    socket_timeout_s: float = SOCKET_TIMEOUT_S

    def __post_init__(self) -> None:
        self.store = Path(self.store)
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an integer in 0..65535 (0: any free port), got {self.port!r}")
        if not self.host:
            raise ConfigError("host must not be empty (use 127.0.0.1 for this machine only)")
        if self.token is not None and not self.token.strip():
            raise ConfigError("token must not be empty")
        if self.token is not None:
            make = "make one with: python -c 'import secrets; print(secrets.token_urlsafe(24))'"
            if len(self.token) < MIN_TOKEN_CHARS:
                raise ConfigError(f"--token (or {ENV_TOKEN}) must be at least {MIN_TOKEN_CHARS} characters, got "
                                  f"{len(self.token)}: a short token can be guessed; {make}")
            if not _TOKEN_CHARS.match(self.token):
                raise ConfigError(f"--token (or {ENV_TOKEN}) may hold only printable ASCII without spaces (it "
                                  f"travels in an HTTP header); {make}")
        if not 1 <= self.max_pending <= self.max_connections:
            raise ConfigError(f"max_pending must be between 1 and max_connections ({self.max_connections}), "
                              f"got {self.max_pending!r}")
        if not 0.05 <= self.pending_deadline_s <= 600 or not 0.05 <= self.socket_timeout_s <= 3600:
            raise ConfigError("pending_deadline_s must be in 0.05..600 s and socket_timeout_s in 0.05..3600 s, got "
                              f"{self.pending_deadline_s!r} and {self.socket_timeout_s!r}")
        if not 0.5 <= self.poll_s <= 3600:
            raise ConfigError(f"poll_s must be between 0.5 and 3600 seconds, got {self.poll_s!r}")
        if not is_loopback(self.host) and self.token is None and not self.insecure:
            raise ConfigError(
                f"binding {self.host} would serve the store to the network without authentication: pass --token T "
                f"(or set {ENV_TOKEN}; clients send 'Authorization: Bearer T' or open the UI once with ?token=T), "
                "or --insecure if the network is trusted, or bind 127.0.0.1 and use an SSH tunnel")

    @classmethod
    def from_env(cls, **explicit: object) -> "ServeConfig":
        """Explicit values win; the token falls back to ``ARGUS_SERVE_TOKEN``."""
        if explicit.get("token") is None and os.environ.get(ENV_TOKEN):
            explicit["token"] = os.environ[ENV_TOKEN]
        return cls(**explicit)  # type: ignore[arg-type]
