"""A production host-window's trace is byte-identical to the one the previous build wrote.

The window is the processor bench's (``argus.bench.processor.window_tables``: 8 ranks × 5
steps, the simulator's phases with the production workload's 12,370 kernel launches per
rank-step, ~512k slices), as the processor hands it to the Perfetto writer. The digests were
taken with the build before its per-slice loops were vectorised (tree at d11ec5d), so a
faster build must write the same bytes. The inputs are digested too: if the simulator or the
production workload changes, the input digest says so, and both digests must be regenerated
with a build whose output is trusted (the decoding tests in ``test_perfetto.py`` check it).

``overlapping`` moves each step's kernels 0.8 s earlier per step, as the first harness of
``docs/scale.md`` M2 did by accident: every stream's kernels overlap the next step's, so
every stream takes the lane loop (several ``stream N #k`` tracks), not the nesting fast path.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from argus.bench.processor import window_tables
from argus.evidence import build_perfetto_trace

# (workload, variant) → (digest of the input tables, sha256 of the trace)
EXPECTED = {
    ("production", "window"): ("3bc902f373c7638375e282555bed6ab6382538892812f5e9288a3dd1f5b05b8c",
                               "b9b6d669cc72e00731d0a2dfc4acba5a9366cba9fe2ea6160b25e4fea5ebc494"),
    ("production", "overlapping"): ("af9d85d6661e88c08cd20b774067c789cfa247991a2a7947c1e28df767fcea54",
                                    "220826a50bf9fb75eefbe33ed0992c12f644024762039bcf33aeb64068c56f39"),
    ("standard", "window"): ("ba68def0ab5d41a8e371eed6e6645541f13b4616c338cdd17e7fcf885abc9fbb",
                             "8afc18f0f5bcdc749f7478b6ff5965bb67ed488e3df573dc7de3e54383b4e0fa"),
    ("standard", "overlapping"): ("fe5dbdc1b76e9048b6f44f4754f35b5d119fcb866e492cbdd890f6ef24654c97",
                                  "6fd854aed26bce2fa2de12a32d0fbbbfdd797a773763f86b50d6bfbdb61683e2"),
}


def _digest_tables(*tables: pa.Table) -> str:
    h = hashlib.sha256()
    for t in tables:
        for name in t.column_names:
            col = t.column(name).combine_chunks()
            if pa.types.is_dictionary(col.type):  # the processor's names and kinds: their strings
                col = col.cast(col.type.value_type)
            h.update(name.encode())
            if pa.types.is_string(col.type):
                h.update("\0".join(col.to_pylist()).encode())
            else:
                h.update(np.ascontiguousarray(col.to_numpy(zero_copy_only=False)).tobytes())
    return h.hexdigest()


def _overlapping(kernels: pa.Table) -> pa.Table:
    step = kernels.column("step").to_numpy()
    start = kernels.column("start_ns").to_numpy() - (step - step.min()) * 800_000_000
    return kernels.set_column(kernels.column_names.index("start_ns"), "start_ns", pa.array(start, pa.int64()))


@pytest.fixture(scope="module", params=["production", "standard"])
def window(request) -> tuple[str, pa.Table, pa.Table]:
    phases, kernels = window_tables(request.param)
    return request.param, phases, kernels


@pytest.mark.parametrize("variant", ["window", "overlapping"])
def test_host_window_trace_is_byte_identical_to_the_previous_build(window, variant):
    workload, phases, kernels = window
    if variant == "overlapping":
        kernels = _overlapping(kernels)
    inputs, trace = EXPECTED[(workload, variant)]
    assert _digest_tables(phases, kernels) == inputs, "the window changed: regenerate both digests (see docstring)"
    assert pa.types.is_dictionary(kernels.schema.field("name").type)  # as the processor hands them over
    data = build_perfetto_trace(phases=phases, kernels=kernels, hosts={r: f"node-{r // 4}" for r in range(8)},
                                title="w 0")
    assert hashlib.sha256(data).hexdigest() == trace


def test_a_dictionary_name_column_gives_the_bytes_its_strings_give(window):
    """Kernel names and kinds as codes (any dictionary: shuffled, with duplicate and unused
    strings) or as strings: the same trace."""
    _, phases, kernels = window
    kernels = kernels.slice(0, 20_000)
    strings = kernels
    for col in ("name", "kind"):
        strings = strings.set_column(strings.column_names.index(col), col, kernels.column(col).cast(pa.string()))
    names = strings.column("name").combine_chunks()
    table = sorted(set(names.to_pylist())) + ["unused"]
    table = table[::-1] + table[:3]  # reversed, and three strings twice
    codes = pa.array([table.index(s) for s in names.to_pylist()], pa.int32())
    shuffled = kernels.set_column(kernels.column_names.index("name"), "name",
                                  pa.DictionaryArray.from_arrays(codes, pa.array(table)))
    built = [build_perfetto_trace(phases=phases, kernels=k, title="w") for k in (strings, kernels, shuffled)]
    assert built[0] == built[1] == built[2]
