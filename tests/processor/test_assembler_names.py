"""Name decoding at window close against the row-by-row loop it replaced: one dictionary for
all chunks, a table that grows between chunks, a rank that reconnected with a new table."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import pyarrow as pa

from argus.processor.assembler import RankInfo, _concat, _materialise, _name_dictionary, _names
from argus.wire.protocol import DTYPES, Msg


def _chunk(ids: list[int]) -> np.ndarray:
    r = np.zeros(len(ids), DTYPES[Msg.KERNELS])
    r["name"] = ids
    return r


chunks = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6), st.lists(st.integers(0, 5), max_size=8)),
                  min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(chunks)
def test_names_decode_like_the_per_row_loop(spec):
    """(table, names known when the chunk came, ids): ids stay below the names known then,
    as the daemon's id check guarantees; tables 0 and 1 are the same rank (a reconnect)."""
    tables = [RankInfo(rank=0), RankInfo(rank=0), RankInfo(rank=1)]
    parts = []
    for t, known, ids in spec:
        info = tables[t]
        while len(info.names) < known:  # the table grows as names arrive
            info.names.append(f"t{t}-n{len(info.names)}")
        n_names = len(info.names)
        parts.append((info, _chunk([i % n_names for i in ids]), n_names))
    expected = [info.names[:n][i] for info, recs, n in parts for i in recs["name"].tolist()]
    assert _names(parts, "name").to_pylist() == expected
    codes = _name_dictionary(parts, "name")  # what the kernels table holds: dictionary_encode's numbering
    want = pa.array(expected, pa.string()).dictionary_encode()
    assert codes.indices.to_pylist() == want.indices.to_pylist()
    assert codes.dictionary.to_pylist() == want.dictionary.to_pylist()


def test_kernel_names_as_codes_compress_to_the_same_tables():
    """The writer's compression reads the dictionary column as it read the strings."""
    from argus.compress import summarize_kernels

    infos = [RankInfo(rank=r, names=[f"k{r % 2}-{i}" for i in range(6)] + ["nccl:all_reduce"]) for r in range(3)]
    rng = np.random.default_rng(1)
    parts = []
    for step in range(4):
        for info in infos:
            r = _chunk(rng.integers(0, 7, 50).tolist())
            r["step"], r["dur_ns"], r["stream"] = step, rng.integers(1_000, 90_000, 50), rng.integers(7, 9, 50)
            r["kind"] = rng.integers(0, 3, 50)
            parts.append((info, r, len(info.names)))
    kernels = _materialise(Msg.KERNELS, parts)
    assert pa.types.is_dictionary(kernels.schema.field("name").type)
    strings = kernels
    for col in ("name", "kind"):
        strings = strings.set_column(strings.column_names.index(col), col, kernels.column(col).cast(pa.string()))
    for got, want in zip(summarize_kernels(kernels, 0, 0, 3), summarize_kernels(strings, 0, 0, 3)):
        assert got.equals(want)


def test_concat_matches_numpy_and_keeps_the_dtype():
    a, b = _chunk([1, 2, 3]), _chunk([4])
    a["dur_ns"], b["dur_ns"] = [10, 20, 30], [40]
    out = _concat([a, b, _chunk([])])
    assert out.dtype == a.dtype and out.tobytes() == np.concatenate([a, b]).tobytes()
