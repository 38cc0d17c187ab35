"""One client connection: its frame reader, its outbox and its name table.

A rank's name ids are its own (the producer interns names as it meets them); the processor's
samplers append to the same per-rank table, so once the two interleave a client id is mapped
to a table index. Ids below ``identity`` map to themselves: most batches need no translation.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.errors import ProtocolError
from argus.processor.assembler import RankInfo
from argus.processor.limits import MAX_NAME_CHARS, MAX_NAME_TABLE_BYTES
from argus.processor.samplers import Samplers
from argus.wire import FrameReader, Msg, RingReader
from argus.wire.ring import OVERFLOW_NAME

__all__ = ["Connection", "OUTBOX_LIMIT", "parse_names"]

log = logging.getLogger("argus.processor")

OUTBOX_LIMIT = 256 << 10  # a client that stops reading its ACKs loses them beyond this


@dataclass
class Connection:
    sock: socket.socket
    rx: FrameReader = field(default_factory=FrameReader)
    tx: bytearray = field(default_factory=bytearray)
    info: RankInfo | None = None
    attempt_key: tuple[str, str] | None = None
    flushes: list[tuple[int, set[tuple[tuple[str, str], int]]]] = field(default_factory=list)
    token: int = field(default_factory=Samplers.new_token)
    # client name id → index in info.names (samplers append to the same table); ids below
    # ``identity`` map to themselves, so most batches need no translation
    id_map: list[int] = field(default_factory=list)
    identity: int = 0
    _id_array: np.ndarray | None = None
    ring: RingReader | None = None  # the rank's shared-memory ring (from its HELLO)
    pid: int | None = None
    cpu_timed: bool = False  # its CPU ops are converted to CPU time (cpu_time.py)
    since: float = field(default_factory=time.monotonic)  # when it connected (HELLO_TIMEOUT_S)
    held: int = 0  # bytes of its unfinished frame counted in the processor's pending bytes
    name_bytes: int = 0  # characters of names it added (MAX_NAME_TABLE_BYTES)
    overflow_index: int = 0  # index of OVERFLOW_NAME in info.names once the table is full

    @property
    def who(self) -> str:
        return f"rank {self.info.rank}" if self.info else "an unidentified client"

    # -- outbox --------------------------------------------------------------------------
    def send(self, frame: bytes) -> bool:
        """Queue a frame and push what the socket takes now: never block the loop on a client.
        False: the outbox is full (a client that stopped reading loses ACKs, nothing else)."""
        if len(self.tx) + len(frame) > OUTBOX_LIMIT:
            return False
        self.tx += frame
        self.push()
        return True

    def push(self) -> None:
        try:
            sent = self.sock.send(self.tx)
            del self.tx[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.tx.clear()

    # -- name table ----------------------------------------------------------------------
    def add_names(self, names: list[str]) -> None:
        """The client's next name ids (in order) → indices of the rank's name table."""
        assert self.info is not None
        for name in names:
            self.name_bytes += len(name)
            if self.name_bytes > MAX_NAME_TABLE_BYTES:  # past the cap: the overflow name, as in the ring
                if self.name_bytes - len(name) <= MAX_NAME_TABLE_BYTES:
                    log.warning("%s: name table past %d bytes; further names read %r", self.who,
                                MAX_NAME_TABLE_BYTES, OVERFLOW_NAME)
                    self.info.names.append(OVERFLOW_NAME)
                    self.overflow_index = len(self.info.names) - 1
                self.id_map.append(self.overflow_index)
                self._id_array = None
                continue
            index = len(self.info.names)
            if self.identity == len(self.id_map) == index:
                self.identity += 1
            self.id_map.append(index)
            self.info.names.append(name)
        self._id_array = None

    def map_names(self, msg: Msg, records: np.ndarray) -> None:
        """Validate the client's name ids and map them to name-table indices (in place)."""
        assert self.info is not None
        for fld in ("name", "frames", "thread", "metric"):
            if fld in (records.dtype.names or ()) and len(records):
                ids = records[fld]
                top = int(ids.max())
                if ids.min() < 0 or top >= len(self.id_map):
                    raise ProtocolError(f"{msg.name} refers to name id {top} never sent")
                if top >= self.identity:
                    if self._id_array is None:
                        self._id_array = np.asarray(self.id_map, dtype=np.int32)
                    records[fld] = self._id_array[ids]

    def name_of(self) -> Any:
        """A name lookup that stays valid after the connection is gone (for a departed rank's view)."""
        assert self.info is not None
        names, id_map = list(self.info.names), list(self.id_map)
        return lambda i: names[id_map[i]] if 0 <= i < len(id_map) else ""


def parse_names(doc: Any, next_id: int) -> list[str]:
    """The names of a NAMES document ``[[id, "name"], ...]``, ids consecutive from ``next_id``."""
    if not isinstance(doc, list):
        raise ProtocolError(f"NAMES must be a list of [id, name] pairs, not {type(doc).__name__}")
    names = []
    for k, item in enumerate(doc):
        if not isinstance(item, list) or len(item) != 2:
            raise ProtocolError(f"NAMES entry {k} is not an [id, name] pair")
        i, name = item
        if type(i) is not int or i != next_id + k:
            raise ProtocolError(f"name id {i!r:.40} out of sequence (expected {next_id + k})")
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
            raise ProtocolError(f"name {i} is not a string of at most {MAX_NAME_CHARS} characters")
        names.append(name)
    return names
