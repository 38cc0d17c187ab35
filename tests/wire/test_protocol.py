import numpy as np
import pytest

from argus.errors import ProtocolError
from argus.wire.protocol import (DTYPES, HEADER, MAX_PAYLOAD, VERSION, Msg, decode_array, decode_header,
                                      decode_json, encode_array, encode_frame, encode_json)


def test_array_frames_round_trip_for_every_data_message():
    for msg, dtype in DTYPES.items():
        recs = np.zeros(5, dtype)
        for name in dtype.names:
            recs[name] = np.arange(5)
        frame = encode_array(msg, recs)
        got_msg, length = decode_header(frame[:HEADER.size])
        assert got_msg == msg and length == 5 * dtype.itemsize
        assert (decode_array(msg, frame[HEADER.size:]) == recs).all()


def test_json_frames_round_trip():
    frame = encode_json(Msg.HELLO, {"rank": 3, "host": "h"})
    msg, length = decode_header(frame[:HEADER.size])
    assert msg == Msg.HELLO and decode_json(frame[HEADER.size:HEADER.size + length]) == {"rank": 3, "host": "h"}


@pytest.mark.parametrize("header, message", [
    (HEADER.pack(b"XXXX", 1, 3, 0), "bad magic"),
    (HEADER.pack(b"ARGS", 9, 3, 0), "unsupported protocol version 9"),
    (HEADER.pack(b"ARGS", VERSION, 99, 0), "unknown message type 99"),
    (HEADER.pack(b"ARGS", VERSION, 3, MAX_PAYLOAD + 1), "exceeds"),
])
def test_bad_headers_are_protocol_errors(header, message):
    with pytest.raises(ProtocolError, match=message):
        decode_header(header)


def test_bad_payloads_are_protocol_errors():
    with pytest.raises(ProtocolError, match="not a multiple"):
        decode_array(Msg.STEPS, b"\x00" * 7)
    with pytest.raises(ProtocolError, match="undecodable JSON"):
        decode_json(b"\xff{")
    with pytest.raises(ProtocolError, match="exceeds"):
        encode_frame(Msg.KERNELS, b"\x00" * (MAX_PAYLOAD + 1))


def test_wire_code_tables_are_pinned():
    """The code tables are derived from ``argus.vocab``'s declaration order; a reordered enum
    would silently re-map every stored byte, so the tables are pinned to their literal values."""
    from argus.wire.protocol import CATEGORIES, GROUP_KINDS, KINDS, RERUNS, SENSORS

    assert tuple(map(str, CATEGORIES)) == ("compute", "comm", "host")
    assert tuple(map(str, GROUP_KINDS)) == ("", "tp", "cp", "ep", "dp", "edp", "pp", "world")
    assert tuple(map(str, KINDS)) == ("kernel", "memcpy", "memset", "cpu_op")
    assert tuple(map(str, SENSORS)) == ("grads", "params", "gemm")
    assert tuple(map(str, RERUNS)) == ("none", "passed", "reproduced", "reference_agrees")
