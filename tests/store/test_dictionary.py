"""Dictionary string columns: codes and a table, numbered as ``dictionary_encode`` would, and
written to the store as plain strings."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from argus.store import Store, WindowData, WindowWriter, conform
from argus.store.dictionary import first_seen_codes, first_seen_dictionary
from argus.topology import RunIdentity, parse_layout


def test_codes_and_table_are_those_of_dictionary_encode():
    rng = np.random.default_rng(3)
    for trial in range(300):
        size = int(rng.integers(1, 40))
        values = [f"s{int(x)}" for x in rng.integers(0, max(size // 2, 1), size)]  # duplicates, unused
        codes = rng.integers(0, size, int(rng.integers(0, 200)))
        if trial % 3 == 0:
            codes = np.sort(codes)
        got = first_seen_dictionary(codes, values)
        want = pa.array([values[i] for i in codes], pa.string()).dictionary_encode()
        assert got.indices.to_pylist() == want.indices.to_pylist()
        assert got.dictionary.to_pylist() == want.dictionary.to_pylist()


def test_codes_already_first_seen_are_kept():
    codes = np.array([0, 1, 0, 2, 1], np.int32)
    out, table = first_seen_codes(codes, ["a", "b", "c"])
    assert out is codes and table == ["a", "b", "c"]
    out, table = first_seen_codes(np.zeros(4, np.int32), ["kernel", "memcpy"])  # one value of a vocabulary
    assert out.tolist() == [0] * 4 and table == ["kernel"]


def test_a_dictionary_kernels_table_is_stored_as_strings(tmp_path):
    codes = np.array([2, 0, 2, 1], np.int32)
    cols = {"rank": np.zeros(4, np.int32), "step": np.zeros(4, np.int64),
            "kind": first_seen_dictionary(np.zeros(4, np.int32), ["kernel", "memcpy"]),
            "device": np.zeros(4, np.int16), "stream": np.full(4, 7, np.int32),
            "name": first_seen_dictionary(codes, ["gemm", "nccl", "relu"]),
            "start_ns": np.arange(4, dtype=np.int64), "dur_ns": np.ones(4, np.int64)}
    kernels = conform("kernels", cols, dictionaries=True)
    assert pa.types.is_dictionary(kernels.schema.field("name").type)
    assert kernels.column("name").to_pylist() == ["relu", "gemm", "relu", "nccl"]
    plain = conform("kernels", cols)
    assert plain.schema == conform("kernels", kernels).schema and plain.column("name").type == pa.string()

    store = Store.create(tmp_path / "store")
    attempt = store.open_or_create_attempt(RunIdentity("job", "0"), parse_layout("dp=1", world_size=1),
                                           source="processor")
    WindowWriter(attempt, "node-0", raw_kernels=True, durable=False).write(WindowData(0, 0, 0, kernels=kernels))
    files = attempt.files("kernels")
    assert len(files) == 1
    stored = pq.read_table(files[0])
    assert stored.schema.field("name").type == pa.string() and stored.schema.field("kind").type == pa.string()
    assert stored.column("name").to_pylist() == ["relu", "gemm", "relu", "nccl"]
    assert attempt.read("kernels").column("name").to_pylist() == ["relu", "gemm", "relu", "nccl"]
