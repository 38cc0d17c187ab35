"""The producer → processor wire format: framed, versioned, packed binary batches.

Every frame is a 12-byte header followed by a payload::

    offset  size  field
    0       4     magic  b"ARGS"
    4       2     version (little-endian u16, currently 2)
    6       2     message type (u16, see ``Msg``)
    8       4     payload length in bytes (u32, at most ``MAX_PAYLOAD``)

Data payloads are numpy structured arrays with the little-endian, packed dtypes below
(``np.frombuffer`` decodes a batch without per-record Python work). Strings (phase,
kernel, metric and frame names) are interned per connection: a ``NAMES`` frame maps ids to
strings once, and records carry the ids. ``HELLO`` and ``NAMES`` are small JSON documents.
The server answers ``ACK`` frames (JSON) when a window the client contributed to is on disk.

The server may also send ``CONTROL`` frames (JSON), requests the client acts on when it can
and otherwise ignores. The one defined now is ``{"stacks": {"inprocess_hz": 10.0}}``: the
processor cannot sample this rank's stacks with py-spy (ptrace not permitted), so the rank
should sample its own Python stacks at that rate and send them as ``STACKS`` records; a
later frame with another rate changes it (raised while the rank is under suspicion, lowered
after). Unknown keys are for newer processors: a client ignores them.
"""

from __future__ import annotations

import json
import struct
from enum import IntEnum
from typing import Any

import numpy as np

from argus.errors import ProtocolError
from argus.vocab import GroupKind, KernelKind, PhaseCategory, Rerun, Sensor

__all__ = ["MAGIC", "VERSION", "HEADER", "MAX_PAYLOAD", "MAX_JSON_PAYLOAD", "JSON_MSGS", "Msg", "DTYPES", "CATEGORIES",
           "GROUP_KINDS", "KINDS", "SENSORS", "RERUNS", "GPU_STEP_PHASE",
           "TABLES_BY_MSG", "encode_frame", "encode_json", "encode_array", "decode_header", "decode_json",
           "decode_array"]

MAGIC = b"ARGS"
VERSION = 2  # 2: PHASES carry wait_ns
HEADER = struct.Struct("<4sHHI")
MAX_PAYLOAD = 64 << 20
#: JSON frames (HELLO, NAMES, FLUSH, BYE, ACK, CONTROL) are small documents; a 64 MiB one of
#: ``[],[],…`` would decode to ~1 GB of Python lists, so they are capped far lower (the client
#: splits NAMES to fit). 1 MiB decodes to at most ~30 MB of objects.
MAX_JSON_PAYLOAD = 1 << 20


class Msg(IntEnum):
    HELLO = 1  # JSON: run_id, attempt_id, rank, world_size, host, local_rank, gpu_uuid, layout, order, pid
    NAMES = 2  # JSON: [[id, "name"], ...]
    STEPS = 3
    PHASES = 4
    KERNELS = 5
    STACKS = 6
    HW = 7
    DROPS = 8  # the producer's own drop counters
    FLUSH = 9  # JSON {"seq": n}: asks for an ACK once everything sent so far is on disk
    BYE = 10
    CHECKS = 11  # the correctness sensors: replicas' digests, algebraic checks of sampled GEMMs
    ACK = 20  # server → client, JSON {"window": w, "start_step": a, "end_step": b} or {"seq": n}
    CONTROL = 21  # server → client, JSON request, e.g. {"stacks": {"inprocess_hz": 10.0}}


#: Messages whose payload is JSON (``MAX_JSON_PAYLOAD``); the others are packed arrays.
JSON_MSGS = frozenset({Msg.HELLO, Msg.NAMES, Msg.FLUSH, Msg.BYE, Msg.ACK, Msg.CONTROL})


DTYPES: dict[Msg, np.dtype] = {
    Msg.STEPS: np.dtype([("step", "<i8"), ("start_ns", "<i8"), ("end_ns", "<i8")]),
    Msg.PHASES: np.dtype([("step", "<i8"), ("start_ns", "<i8"), ("dur_ns", "<i8"), ("microbatch", "<i4"),
                          ("name", "<i4"), ("category", "u1"), ("group_kind", "u1"), ("wait_ns", "<i8")]),
    Msg.KERNELS: np.dtype([("step", "<i8"), ("start_ns", "<i8"), ("dur_ns", "<i8"), ("name", "<i4"),
                           ("stream", "<i4"), ("device", "<i2"), ("kind", "u1")]),
    Msg.STACKS: np.dtype([("step", "<i8"), ("start_ns", "<i8"), ("end_ns", "<i8"), ("frames", "<i4"),
                          ("thread", "<i4"), ("count", "<i4")]),
    Msg.HW: np.dtype([("ts_ns", "<i8"), ("metric", "<i4"), ("value", "<f8")]),
    Msg.DROPS: np.dtype([("table", "u1"), ("events", "<i8"), ("batches", "<i8")]),
    Msg.CHECKS: np.dtype([("step", "<i8"), ("ts_ns", "<i8"), ("sensor", "u1"), ("tensors", "<i4"),
                          ("elements", "<i8"), ("digest", "<u8"), ("nonfinite", "<i8"), ("violations", "<i4"),
                          ("rerun", "i1")]),
}
#: Store table each data message feeds.
TABLES_BY_MSG = {Msg.STEPS: "steps", Msg.PHASES: "phases", Msg.KERNELS: "kernels", Msg.STACKS: "stacks",
                 Msg.HW: "hw", Msg.CHECKS: "checks"}
#: Code → string for small enumerations carried as bytes: the vocabulary's declaration order
#: is the code table (``tests/wire/test_protocol.py`` pins it, so reordering an enum fails).
CATEGORIES: tuple[PhaseCategory, ...] = tuple(PhaseCategory)
#: Code 0 is "no group" (a phase outside any collective).
GROUP_KINDS: tuple[str, ...] = ("", *GroupKind)
KINDS: tuple[KernelKind, ...] = tuple(KernelKind)
DROP_TABLES = ("steps", "phases", "kernels", "stacks", "hw", "frames", "checks")
#: What a CHECKS record checks (``argus.vocab.Sensor``).
SENSORS: tuple[Sensor, ...] = tuple(Sensor)
#: A GEMM check's re-run after a violation (``argus.vocab.Rerun``).
RERUNS: tuple[Rerun, ...] = tuple(Rerun)
#: A PHASES record of this name is a step's interval on the GPU (between the events recorded at
#: the previous and this step's end on the compute stream): the processor places kernels in
#: steps by it and stores it nowhere else.
GPU_STEP_PHASE = "gpu-step"


def encode_frame(msg: Msg, payload: bytes) -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {len(payload)} bytes exceeds the {MAX_PAYLOAD}-byte frame limit")
    return HEADER.pack(MAGIC, VERSION, int(msg), len(payload)) + payload


def encode_json(msg: Msg, doc: Any) -> bytes:
    return encode_frame(msg, json.dumps(doc, separators=(",", ":")).encode())


def encode_array(msg: Msg, records: np.ndarray) -> bytes:
    dtype = DTYPES[msg]
    if records.dtype != dtype:
        records = records.astype(dtype)
    return encode_frame(msg, records.tobytes())


def decode_header(buf: bytes | memoryview) -> tuple[Msg, int]:
    """``(message type, payload length)`` of a 12-byte header; :class:`ProtocolError` if bad."""
    magic, version, msg, length = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this processor speaks {VERSION})")
    if length > MAX_PAYLOAD:
        raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    try:
        kind = Msg(msg)
    except ValueError:
        raise ProtocolError(f"unknown message type {msg}") from None
    if kind in JSON_MSGS and length > MAX_JSON_PAYLOAD:
        raise ProtocolError(f"{kind.name} frame of {length} bytes exceeds the {MAX_JSON_PAYLOAD}-byte JSON limit")
    return kind, length


def decode_json(payload: bytes | memoryview) -> Any:
    """The document; :class:`ProtocolError` for bad UTF-8 or JSON, too much nesting (a 100k-deep
    ``[[[…`` exhausts the parser's recursion) or a payload over ``MAX_JSON_PAYLOAD``."""
    if len(payload) > MAX_JSON_PAYLOAD:
        raise ProtocolError(f"JSON payload of {len(payload)} bytes exceeds the {MAX_JSON_PAYLOAD}-byte limit")
    try:
        return json.loads(bytes(payload))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"undecodable JSON payload ({exc})") from None
    except RecursionError:
        raise ProtocolError("JSON payload nested too deeply") from None


def decode_array(msg: Msg, payload: bytes | memoryview) -> np.ndarray:
    dtype = DTYPES[msg]
    if len(payload) % dtype.itemsize:
        raise ProtocolError(f"{msg.name} payload of {len(payload)} bytes is not a multiple of {dtype.itemsize}")
    return np.frombuffer(payload, dtype=dtype).copy()
