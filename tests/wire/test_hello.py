"""A HELLO is validated field by field before the processor acts on it (``wire/hello.py``)."""

from __future__ import annotations

import json

import pytest

from argus.errors import ProtocolError
from argus.wire import Msg, decode_json, encode_frame
from argus.wire.hello import MAX_ID_CHARS, MAX_WORLD_SIZE, parse_hello
from argus.wire.protocol import MAX_JSON_PAYLOAD, decode_header

GOOD = {"run_id": "job-1", "attempt_id": "0", "rank": 3, "world_size": 8, "local_rank": 3, "host": "node-0",
        "pid": 4242, "layout": "tp=2,dp=4", "order": "tp-cp-ep-dp-pp", "gpu_uuid": "GPU-1", "tid": 4242,
        "clock_offset_ns": -17, "kernels": "cpu_ops", "ring": "/dev/shm/x.ring"}


def test_a_producers_hello_is_accepted_as_sent():
    hello = parse_hello(dict(GOOD))
    assert (hello.run_id, hello.rank, hello.world_size, hello.local_rank, hello.pid) == ("job-1", 3, 8, 3, 4242)
    assert hello.to_doc() == GOOD


def test_missing_optional_fields_take_their_defaults():
    hello = parse_hello({"rank": 0, "world_size": 1})
    assert (hello.run_id, hello.attempt_id, hello.local_rank, hello.pid, hello.ring) == ("run", "0", -1, None, "")


@pytest.mark.parametrize("field,value", [
    ("rank", True), ("rank", 1.0), ("rank", float("inf")), ("rank", -1), ("rank", 8), ("rank", "0"), ("rank", None),
    ("world_size", 0), ("world_size", MAX_WORLD_SIZE + 1), ("world_size", 10 ** 15), ("world_size", False),
    ("local_rank", float("nan")), ("local_rank", 8), ("local_rank", -2), ("pid", 0), ("pid", 1 << 40),
    ("pid", True), ("tid", "1"), ("clock_offset_ns", 1 << 63), ("clock_offset_ns", 1e300),
    ("run_id", "x" * (MAX_ID_CHARS + 1)), ("run_id", "../up"), ("run_id", ".hidden"), ("run_id", "a/b"),
    ("run_id", "a\x1b[31m"), ("run_id", ["job"]), ("attempt_id", "a\\b"), ("gpu_uuid", "x\x9b31m"), ("host", 5), ("host", "a\nb"),
    ("layout", {"tp": 2}), ("ring", "r" * 5000), ("kernels", ["cpu_ops"]),
])
def test_a_bad_field_is_a_protocol_error_naming_it(field, value):
    doc = dict(GOOD, **{field: value})
    with pytest.raises(ProtocolError, match=field):
        parse_hello(doc)


def test_a_numeric_run_id_is_taken_as_text_and_any_printable_one_is_kept():
    assert parse_hello(dict(GOOD, run_id=123456)).run_id == "123456"
    assert parse_hello(dict(GOOD, run_id="my job: 2026-12-01 ü")).run_id == "my job: 2026-12-01 ü"


def test_json_frames_are_capped_at_the_header_and_nesting_is_an_error():
    with pytest.raises(ProtocolError, match="JSON limit"):
        decode_header(encode_frame(Msg.HELLO, b" " * (MAX_JSON_PAYLOAD + 1))[:12])
    with pytest.raises(ProtocolError, match="nested too deeply"):
        decode_json(b"[" * 100_000 + b"]" * 100_000)
    assert decode_json(json.dumps([[0, "k"]]).encode()) == [[0, "k"]]
