"""Name decoding at window close against the row-by-row loop it replaced: one dictionary for
all chunks, a table that grows between chunks, a rank that reconnected with a new table."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from argus.processor.assembler import RankInfo, _concat, _names
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


def test_concat_matches_numpy_and_keeps_the_dtype():
    a, b = _chunk([1, 2, 3]), _chunk([4])
    a["dur_ns"], b["dur_ns"] = [10, 20, 30], [40]
    out = _concat([a, b, _chunk([])])
    assert out.dtype == a.dtype and out.tobytes() == np.concatenate([a, b]).tobytes()
