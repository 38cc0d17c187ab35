import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from argus.compress import REFINED_W1_BOUND, CompressConfig, RefineConfig, sketch_from_row, summarize_durations, summarize_kernels
from argus.sim import Engine, SimConfig
from argus.store import TABLES


@pytest.fixture(scope="module")
def window():
    recs = list(Engine(SimConfig(ranks=16, steps=4)).run())
    return pa.concat_tables([r.kernels_table() for r in recs[2:]])


def test_one_row_per_cluster_and_counts_add_up_per_kernel(window):
    summaries, sketches = summarize_kernels(window, 7, 2, 3)
    assert summaries.schema == TABLES["kernel_summaries"].schema
    assert sketches.schema == TABLES["kernel_sketches"].schema
    assert set(summaries.column("window").to_pylist()) == {7}
    assert sum(summaries.column("count").to_pylist()) == window.num_rows
    assert sum(sketches.column("count").to_pylist()) == window.num_rows
    # every sketch's bucket counts add up to its non-zero events
    for row in sketches.slice(0, 50).to_pylist():
        assert sum(row["counts"]) + row["zero_count"] == row["count"]
    names = set(summaries.column("kernel").to_pylist())
    assert "flash_fwd_kernel" in names and "AllReduce" in names and not any("<" in n for n in names)
    comm = summaries.filter(pc.equal(summaries.column("kernel"), "ReduceScatter"))
    assert set(comm.column("category").to_pylist()) == {"comm"} and set(comm.column("op").to_pylist()) == {"reduce_scatter"}


def test_vectorised_window_agrees_with_the_single_distribution_path(window):
    summaries, sketches = summarize_kernels(window, 0, 2, 3)
    mask = pc.and_(pc.equal(window.column("rank"), 3), pc.equal(window.column("stream"), 7))
    sub = window.filter(mask)
    flash = sub.filter(pc.match_substring(sub.column("name"), "flash_fwd_kernel"))
    expected = summarize_durations(flash.column("dur_ns").to_numpy())
    got = summaries.filter(pc.and_(pc.equal(summaries.column("rank"), 3),
                                   pc.equal(summaries.column("kernel"), "flash_fwd_kernel"))).to_pylist()
    assert [(r["count"], r["p50_ns"], r["p99_ns"]) for r in got] == [(c.count, c.p50, c.p99) for c in expected]
    row = sketches.filter(pc.and_(pc.equal(sketches.column("rank"), 3),
                                  pc.equal(sketches.column("kernel"), "flash_fwd_kernel"))).to_pylist()[0]
    sk = sketch_from_row(row)
    assert sk.count == flash.num_rows
    assert abs(sk.quantile(0.5) / np.median(flash.column("dur_ns").to_numpy()) - 1) < 0.02


def test_a_gemm_name_shared_by_two_sizes_is_two_modes(window):
    kde_only = CompressConfig(refine=RefineConfig(max_w1_rel_mean=None))
    for config, rows_at_most in ((kde_only, 2), (CompressConfig(refine=RefineConfig(max_w1_rel_mean=REFINED_W1_BOUND)), RefineConfig().max_clusters)):
        summaries, _ = summarize_kernels(window, 0, 2, 3, config)
        rows = summaries.filter(pc.and_(pc.equal(summaries.column("rank"), 0),
                                        pc.equal(summaries.column("kernel"), "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n")))
        p50 = np.array(rows.column("p50_ns").to_pylist())
        # 480 µs (QKV) and 960 µs (MLP) GEMMs share one cuBLAS kernel: two modes, never one row across both
        assert 2 <= rows.num_rows <= rows_at_most and (p50 < 700e3).any() and (p50 > 700e3).any()
        assert not ((np.array(rows.column("min_ns").to_pylist()) < 700e3)
                    & (np.array(rows.column("max_ns").to_pylist()) > 700e3)).any()


def test_unfinished_and_invalid_events_are_left_out():
    t = pa.table({"rank": [0, 0, 0, 0], "step": [0] * 4, "kind": ["kernel"] * 4, "device": [0] * 4,
                  "stream": [7] * 4, "name": ["k"] * 4, "start_ns": [0, 1, 2, 3], "dur_ns": [100, -1, 100, 120]})
    summaries, sketches = summarize_kernels(t, 0, 0, 0)
    assert sum(summaries.column("count").to_pylist()) == 3
    assert sketches.column("count").to_pylist() == [3]
    empty = summarize_kernels(t.slice(0, 0), 0, 0, 0)
    assert empty[0].num_rows == 0 and empty[1].num_rows == 0
