"""The hand-written remote-write encoding decodes with Prometheus' own message definitions."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from argus.tsdb.remote_write import (LabelCache, compress, decompress, encode_labels, encode_varints,
                                     encode_write_request)
from argus.tsdb.sink import _chunks


def _write_request_class():
    """``prometheus.WriteRequest`` built at run time from prompb's field numbers (no protoc)."""
    fd = descriptor_pb2.FileDescriptorProto(name="test_prompb.proto", package="prometheus", syntax="proto3")
    label = fd.message_type.add(name="Label")
    label.field.add(name="name", number=1, type=9, label=1)
    label.field.add(name="value", number=2, type=9, label=1)
    sample = fd.message_type.add(name="Sample")
    sample.field.add(name="value", number=1, type=1, label=1)
    sample.field.add(name="timestamp", number=2, type=3, label=1)
    span = fd.message_type.add(name="BucketSpan")
    span.field.add(name="offset", number=1, type=17, label=1)  # sint32
    span.field.add(name="length", number=2, type=13, label=1)  # uint32
    h = fd.message_type.add(name="Histogram")  # the integer-count fields Argus writes
    h.field.add(name="count_int", number=1, type=4, label=1)
    h.field.add(name="sum", number=3, type=1, label=1)
    h.field.add(name="schema", number=4, type=17, label=1)
    h.field.add(name="zero_threshold", number=5, type=1, label=1)
    h.field.add(name="zero_count_int", number=6, type=4, label=1)
    h.field.add(name="positive_spans", number=11, type=11, label=3, type_name=".prometheus.BucketSpan")
    h.field.add(name="positive_deltas", number=12, type=18, label=3)  # sint64, packed
    h.field.add(name="timestamp", number=15, type=3, label=1)
    ts = fd.message_type.add(name="TimeSeries")
    ts.field.add(name="labels", number=1, type=11, label=3, type_name=".prometheus.Label")
    ts.field.add(name="samples", number=2, type=11, label=3, type_name=".prometheus.Sample")
    ts.field.add(name="histograms", number=4, type=11, label=3, type_name=".prometheus.Histogram")
    wr = fd.message_type.add(name="WriteRequest")
    wr.field.add(name="timeseries", number=1, type=11, label=3, type_name=".prometheus.TimeSeries")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest"))


WriteRequest = _write_request_class()


def _decode(body: bytes) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    msg = WriteRequest()
    msg.ParseFromString(decompress(compress(body)))
    return [({lab.name: lab.value for lab in t.labels}, [(s.timestamp, s.value) for s in t.samples])
            for t in msg.timeseries]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-2**62, 2**62), st.floats(allow_nan=False)),
                min_size=1, max_size=60))
def test_any_samples_decode_to_what_was_encoded(rows):
    rows.sort(key=lambda r: r[0])
    sid, ts, val = (np.array(c) for c in zip(*rows))
    labels = [encode_labels([("__name__", "argus_x"), ("rank", str(i)), ("kernel", "gemm·ü" * i)]) for i in range(6)]
    decoded = _decode(encode_write_request(labels, sid, ts, val))
    assert [s for _, series in decoded for s in series] == [(int(t), float(v)) for _, t, v in rows]
    assert [d["rank"] for d, _ in decoded] == [str(i) for i in sorted(set(sid.tolist()))]


def test_labels_are_sorted_by_name_and_cached():
    cache = LabelCache(max_entries=2)
    key = (("rank", "3"), ("__name__", "argus_step"), ("job", "j"))
    msg = WriteRequest()
    msg.ParseFromString(encode_write_request([cache.get(key)], np.array([0]), np.array([1]), np.array([2.0])))
    assert [lab.name for lab in msg.timeseries[0].labels] == ["__name__", "job", "rank"]
    assert cache.get(key) is cache.get(key) and len(cache) == 1
    cache.get((("a", "1"),)), cache.get((("b", "1"),))
    assert len(cache) == 2  # least recently used evicted


def test_varints_match_the_reference_encoding():
    values = np.array([0, 1, 127, 128, 300, 2**35, 2**63 - 1, -1])
    blob, sizes = encode_varints(values)
    ref = b""
    for v in values.tolist():
        v &= (1 << 64) - 1
        while True:
            ref += bytes([(v & 0x7F) | (0x80 if v > 0x7F else 0)])
            v >>= 7
            if not v:
                break
    assert blob == ref and sizes.tolist() == [1, 1, 1, 2, 2, 6, 9, 10]


def test_unsorted_samples_are_refused():
    with pytest.raises(ValueError, match="sorted by series"):
        encode_write_request([b"", b""], np.array([1, 0]), np.array([1, 2]), np.array([1.0, 2.0]))


def test_requests_split_at_series_boundaries():
    series = np.repeat(np.arange(5), [3, 3, 3, 1, 10])
    chunks = _chunks(series, 4)
    assert [series[a:b].tolist() for a, b in chunks][:3] == [[0, 0, 0], [1, 1, 1], [2, 2, 2, 3]]
    assert sum(b - a for a, b in chunks) == len(series) and max(b - a for a, b in chunks) <= 4
