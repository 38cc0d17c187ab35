"""A rank's ``HELLO``, validated: every field typed and in range before the processor acts on it.

The processor sizes per-attempt arrays by ``world_size``, names store directories by the run
and attempt ids and writes ``attempt.json`` on a run's first ``HELLO``; a value it trusted
unchecked (``world_size=10**15``, ``rank=1e999``, a 300-character run id) used to end the
daemon or pin memory for its lifetime, and one written to disk broke every later restart.
:func:`parse_hello` turns the JSON document into a :class:`Hello` or raises
:class:`~argus.errors.ProtocolError` naming the field, so nothing is allocated or written for a
document that fails. ``bool`` is never taken for an integer (``true`` is not rank 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from argus.errors import ProtocolError

__all__ = ["MAX_WORLD_SIZE", "MAX_ID_CHARS", "MAX_TEXT_CHARS", "Hello", "parse_hello", "strict_int"]

#: Largest world the processor accepts. Per-attempt topology arrays are sized by it (three
#: 8-byte columns: 6 MiB at this size); the largest jobs today are ~10**5 ranks.
MAX_WORLD_SIZE = 1 << 18
#: Run and attempt ids name store directories (``runs/<run>/<attempt>``): short (a file name
#: is at most 255 bytes), and as ``RunIdentity`` requires, no ``/`` or ``\``, no leading ``.``;
#: also no control characters (they would reach terminals and logs).
MAX_ID_CHARS = 128
_ID = re.compile(r"[^./\\\x00-\x1f\x7f-\x9f][^/\\\x00-\x1f\x7f-\x9f]*")
#: Host, GPU UUID, layout, order, kernel channel and ring path: free text, bounded (a path is
#: at most PATH_MAX = 4096 bytes on Linux).
MAX_TEXT_CHARS = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_INT64 = (-(1 << 63), (1 << 63) - 1)


def strict_int(doc: dict[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int:
    """``doc[key]`` if it is an ``int`` (not a ``bool``, not a float) in ``[lo, hi]``."""
    value = doc.get(key, default)
    if value is None and default is None and key not in doc:
        raise ProtocolError(f"HELLO has no {key!r}")
    if type(value) is not int:
        raise ProtocolError(f"HELLO {key!r} must be an integer, not {_show(value)}")
    if not lo <= value <= hi:
        raise ProtocolError(f"HELLO {key}={value} outside [{lo}, {hi}]")
    return value


def _text(doc: dict[str, Any], key: str, default: str = "") -> str:
    value = doc.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise ProtocolError(f"HELLO {key!r} must be a string, not {_show(value)}")
    if len(value) > MAX_TEXT_CHARS or _CONTROL.search(value):
        raise ProtocolError(f"HELLO {key!r} is longer than {MAX_TEXT_CHARS} characters or has control characters")
    return value


def _ident(doc: dict[str, Any], key: str, default: str) -> str:
    value = doc.get(key)
    if value is None or value == "":
        return default
    if type(value) is int:  # a numeric job id (SLURM) sent as a number
        value = str(value)
    if not isinstance(value, str):
        raise ProtocolError(f"HELLO {key!r} must be a string, not {_show(value)}")
    if len(value) > MAX_ID_CHARS or not _ID.fullmatch(value):
        raise ProtocolError(f"HELLO {key} {_show(value)} must be 1-{MAX_ID_CHARS} characters without '/', '\\' "
                            "or control characters, not starting with '.'")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True, slots=True)
class Hello:
    run_id: str
    attempt_id: str
    rank: int
    world_size: int
    local_rank: int  # -1: unknown
    host: str  # "": the processor's own host name
    pid: int | None
    layout: str
    order: str | None
    gpu_uuid: str
    tid: int | None
    clock_offset_ns: int
    kernels: str
    ring: str  # "": no ring

    def to_doc(self) -> dict[str, Any]:
        """The validated fields as the document the samplers read (``rank_joined``)."""
        return {"run_id": self.run_id, "attempt_id": self.attempt_id, "rank": self.rank,
                "world_size": self.world_size, "local_rank": self.local_rank, "host": self.host, "pid": self.pid,
                "layout": self.layout, "order": self.order, "gpu_uuid": self.gpu_uuid, "tid": self.tid,
                "clock_offset_ns": self.clock_offset_ns, "kernels": self.kernels, "ring": self.ring}


def parse_hello(doc: Any) -> Hello:
    """A validated :class:`Hello`; :class:`ProtocolError` naming the first bad field."""
    if not isinstance(doc, dict):
        raise ProtocolError(f"HELLO must be a JSON object, not {type(doc).__name__}")
    world = strict_int(doc, "world_size", 1, MAX_WORLD_SIZE)
    rank = strict_int(doc, "rank", 0, world - 1)
    local_rank = strict_int(doc, "local_rank", -1, world - 1, default=-1) if doc.get("local_rank") is not None else -1
    pid = strict_int(doc, "pid", 1, (1 << 31) - 1) if doc.get("pid") is not None else None
    tid = strict_int(doc, "tid", 1, (1 << 31) - 1) if doc.get("tid") is not None else None
    offset = strict_int(doc, "clock_offset_ns", *_INT64, default=0) if doc.get("clock_offset_ns") is not None else 0
    order = _text(doc, "order") or None
    return Hello(run_id=_ident(doc, "run_id", "run"), attempt_id=_ident(doc, "attempt_id", "0"), rank=rank,
                 world_size=world, local_rank=local_rank, host=_text(doc, "host"), pid=pid,
                 layout=_text(doc, "layout"), order=order, gpu_uuid=_text(doc, "gpu_uuid"), tid=tid,
                 clock_offset_ns=offset, kernels=_text(doc, "kernels"), ring=_text(doc, "ring"))
