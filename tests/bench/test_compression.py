import numpy as np
import pytest

from argus.bench.compression import RAW_RECORD_BYTES, kernel_mix, real_trace_mix, run
from argus.compress import categorize_kernel, normalize_kernel_name
from argus.errors import ConfigError
from argus.sim.production import ProductionConfig, ProductionWorkload
from argus.sim.workload import STREAMS
from argus.store import TABLES


@pytest.fixture(scope="module")
def workload() -> ProductionWorkload:
    return ProductionWorkload()


def test_the_production_workload_has_the_paper_scale_mix(workload):
    assert workload.launches_per_step >= 10_000
    assert len(set(workload.names)) >= 200 and len(np.unique(workload.name_id)) == len(workload.names)
    cats = {categorize_kernel(n) for n in workload.names}
    assert {op for c, op in cats if c == "comm"} >= {"all_gather", "reduce_scatter", "send_recv", "all_reduce"}
    assert set(workload.stream.tolist()) >= {STREAMS[k] for k in ("compute", "tp", "ep", "dp", "pp")}
    assert any(n.startswith("triton_") for n in workload.names)  # compiled element-wise tails


def test_generated_events_are_per_rank_and_step_and_seeded(workload):
    a, b = workload.generate(2, 3), workload.generate(2, 3)
    n = workload.launches_per_step
    assert len(a) == 2 * 3 * n and np.array_equal(a.dur_ns, b.dur_ns)
    assert not np.array_equal(a.dur_ns, workload.generate(2, 3, seed=99).dur_ns)
    assert np.array_equal(np.bincount(a.rank), [3 * n, 3 * n]) and set(a.step.tolist()) == {0, 1, 2}
    assert (a.dur_ns >= 1_000).all()
    table = a.to_table()
    assert table.schema == TABLES["kernels"].schema and table.num_rows == len(a)
    assert table.column("name").to_pylist()[:3] == [a.names[i] for i in a.name_id[:3]]


def test_collectives_are_waiting_dominated_and_compute_is_tight(workload):
    k = workload.generate(1, 4)
    short = np.array([normalize_kernel_name(n) for n in k.names])[k.name_id]
    world = k.dur_ns[(short == "AllReduce") & (k.stream == STREAMS["world"])]
    flash = k.dur_ns[short == "flash_fwd_kernel"]
    assert world.max() / world.min() > 10  # stragglers: over a decade
    assert flash.max() / flash.min() < 1.5


def test_bad_production_settings_are_refused():
    with pytest.raises(ConfigError):
        ProductionConfig(pp_stage=4, pp_stages=4)


def test_kernel_mix_of_the_real_traces():
    rows = {r["source"]: r for r in real_trace_mix()}
    ddp = rows["ddp_nccl_rank-0.json.gz"]
    assert ddp["launches_per_rank_step"] == 900 and ddp["distinct_kernels"] >= ddp["distinct_short_names"] > 10
    assert 0 < ddp["comm_time_share"] < 1 and ddp["log10_dur_ns_p5"] < ddp["log10_dur_ns_p95"]


def test_kernel_mix_counts_what_it_is_given():
    names = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "void k<1>(int)", "void k<2>(int)"]
    mix = kernel_mix(names, np.array([0, 1, 2, 1]), np.array([300.0, 100.0, 100.0, 100.0]), rank_steps=2)
    assert mix["launches_per_rank_step"] == 2 and mix["distinct_kernels"] == 3 and mix["distinct_short_names"] == 2
    assert mix["comm_time_share"] == 0.5


def test_production_bench_row_reports_bytes_and_fidelity_per_option():
    (row,) = run(window_steps=2, workload="production")
    assert row["raw_record_bytes"] == RAW_RECORD_BYTES and row["launches_per_rank_step"] >= 10_000
    assert row["raw_bytes_per_rank_step"] == round(row["launches_per_rank_step"] * RAW_RECORD_BYTES)
    for opt in ("kde", "refined", "kde_plus_sketch", "refined_plus_sketch", "sketch"):
        assert row[f"{opt}_ratio"] > 1
        for cat in ("compute", "comm"):
            assert f"w1_{opt}_{cat}_rel_mean_p95" in row and f"w1_{opt}_{cat}_rel_median_p95" in row
    # the refinement buys fidelity with rows; the hybrids meet the goal everywhere
    assert row["refined_bytes_per_rank_step"] > row["kde_bytes_per_rank_step"]
    assert row["w1_refined_comm_rel_mean_p95"] < row["w1_kde_comm_rel_mean_p95"]
    assert row["refined_plus_sketch_comm_share_within_goal"] == 1.0


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="production"):
        run(workload="paper")
