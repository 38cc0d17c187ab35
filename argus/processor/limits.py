"""What the processor accepts from a client, and why it drops one: limits and counted reasons.

The daemon serves every rank of a host from one loop, so nothing one client sends may end it
or grow it without bound. Each limit here is a named value with the reason for its size; a
client that passes one is dropped and counted in the status file under ``dropped_clients``
by :class:`DropReason`, and the loop keeps serving the others.
"""

from __future__ import annotations

import resource
from enum import StrEnum

from argus.errors import ArgusError, ProtocolError

__all__ = ["DropReason", "drop_reason", "HELLO_TIMEOUT_S", "ACCEPT_BACKOFF_S", "ATTEMPT_RETRY_S", "ATTEMPT_IDLE_S",
           "MAX_REFUSED", "MAX_PENDING_FRAME_BYTES", "MAX_NAME_TABLE_BYTES", "MAX_NAME_CHARS", "default_max_connections"]

#: A connection that has not sent its HELLO after this long is closed: a real producer sends
#: it with the connect, so only a stuck or hostile peer holds a slot (and an fd) this long.
HELLO_TIMEOUT_S = 30.0
#: After ``accept`` fails for want of file descriptors (EMFILE/ENFILE), the listener is not
#: polled for this long: the pending connection stays in the backlog instead of the loop
#: spinning on a readable listener it cannot accept from.
ACCEPT_BACKOFF_S = 0.5
#: A run whose ``attempt.json`` could not be opened (corrupt, foreign, another layout) is
#: refused without re-reading it for this long, so a job's ranks reconnecting in a loop cost
#: one read per interval, and a repaired store is picked up soon.
ATTEMPT_RETRY_S = 30.0
#: An attempt with no rank connected, no open window and no pending write is released after
#: this long (reopened from the store if a rank comes back): long enough for a job's restart
#: or a rank's reconnect to find its state, short enough that a processor serving many runs
#: over weeks does not keep every run's topology and assembler.
ATTEMPT_IDLE_S = 300.0
#: Refused attempts remembered (for ``ATTEMPT_RETRY_S`` each); past this many, expired
#: refusals are forgotten, so a stream of distinct bad run ids cannot grow the processor.
MAX_REFUSED = 1024
#: Bytes held across all connections for frames not yet complete (each may declare up to
#: ``MAX_PAYLOAD`` = 64 MiB). Real producers send batches of a few hundred KiB; this holds
#: four maximal frames at once. The connection whose bytes would pass it is dropped.
MAX_PENDING_FRAME_BYTES = 256 << 20
#: UTF-8 bytes of one rank's name table (kernel, phase, frame names): ~8,000 names of 2 KiB.
#: Names past it map to ``(name table full)``, as in the ring (``ring.OVERFLOW_NAME``).
MAX_NAME_TABLE_BYTES = 16 << 20
#: Longest name accepted in a NAMES frame (the client cuts to the same length).
MAX_NAME_CHARS = 4096
#: File descriptors kept free for the store (Parquet files, evidence, status) when the
#: connection cap is derived from ``RLIMIT_NOFILE``.
_FD_RESERVE = 128


class DropReason(StrEnum):
    PROTOCOL = "protocol"  # a malformed frame, or one out of order
    HELLO = "bad_hello"  # a HELLO field of the wrong type or out of range
    ATTEMPT_REFUSED = "attempt_refused"  # the run's attempt on disk cannot be opened or differs
    FRAME_BUDGET = "frame_budget"  # its unfinished frame would pass MAX_PENDING_FRAME_BYTES
    TOO_MANY_CONNECTIONS = "too_many_connections"
    HELLO_TIMEOUT = "hello_timeout"
    FOREIGN_PEER = "foreign_peer"  # another user's process (SO_PEERCRED)
    INTERNAL = "internal"  # anything else a client's frame made the processor raise


class HelloRefused(ProtocolError):
    """A HELLO that cannot be served (bad field, refused attempt): the client is dropped."""

    def __init__(self, message: str, reason: DropReason = DropReason.HELLO):
        super().__init__(message)
        self.reason = reason


def drop_reason(exc: BaseException) -> DropReason:
    """The counted reason for an exception raised while handling a client's frame."""
    if isinstance(exc, HelloRefused):
        return exc.reason
    if isinstance(exc, ArgusError):
        return DropReason.PROTOCOL
    return DropReason.INTERNAL


def default_max_connections() -> int:
    """Half the descriptors this process may open, at most 1024 and at least 16: a host runs a
    handful of ranks, and the store needs descriptors of its own."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, min(1024, (soft - _FD_RESERVE) // 2))
