"""The simulator's timing semantics, checked on the records it stores."""

import numpy as np
import pytest

from argus.sim import Engine, SimConfig, prepare


def _median_by_rank(attempt, name: str, steps: tuple[int, int], table: str = "phases") -> dict[int, float]:
    col = "name" if table == "phases" else "name"
    rows = attempt.sql(
        f"SELECT rank, median(dur_ns) AS d FROM {table} WHERE {col} LIKE '{name}' "
        f"AND step BETWEEN {steps[0]} AND {steps[1]} AND dur_ns >= 0 GROUP BY rank").to_pylist()
    return {r["rank"]: r["d"] for r in rows}


def test_step_ends_align_across_ranks_without_clock_skew():
    config = SimConfig(ranks=64, steps=6, clock_skew_ms=0.0)
    for rec in Engine(config).run():
        dur = rec.step_end - rec.step_start
        spread = rec.step_end.max() - rec.step_end.min()
        assert spread < 0.01 * np.median(dur), (rec.step, spread)


def test_step_ends_align_within_the_per_host_clock_offsets(simulated):
    attempt, truth = simulated("healthy")
    skew_ns = truth["natural"]["clock_skew_ms"] * 1e6
    spread = attempt.sql("SELECT step, max(end_ns) - min(end_ns) AS s FROM steps GROUP BY step").column("s")
    assert max(spread.to_pylist()) < 2 * skew_ns + 2e6


def test_compute_straggler_has_longer_compute_and_shorter_collectives_than_its_peers(simulated):
    attempt, truth = simulated("compute_straggler")
    fault = truth["faults"][0]
    lay, culprit = attempt.layout, fault["culprit_ranks"][0]
    window = (fault["window"]["start_step"] + 1, fault["window"]["end_step"])
    peers = [r for r in lay.peer_set(culprit).tolist() if r not in fault["culprit_ranks"]]
    attn = _median_by_rank(attempt, "self_attention", window)
    assert attn[culprit] > 3 * np.median([attn[p] for p in peers])
    # Waiting for the late rank inflates everyone else's collective kernels, not the culprit's.
    rs = _median_by_rank(attempt, "%ReduceScatter%", window, table="kernels")
    assert rs[culprit] < min(rs[p] for p in peers)
    ar = _median_by_rank(attempt, "dp-reduce-scatter", window)
    assert ar[culprit] < np.median([ar[p] for p in peers]) / 2


def test_masked_straggler_comm_looks_shorter_while_its_mlp_is_slower(simulated):
    attempt, truth = simulated("masked_compute_straggler")
    fault = truth["faults"][0]
    culprits = set(fault["culprit_ranks"])
    assert len(culprits) == 8 and len(fault["culprit_hosts"]) == 1
    window = (fault["window"]["start_step"] + 1, fault["window"]["end_step"])
    mlp = _median_by_rank(attempt, "mlp", window)
    comm = _median_by_rank(attempt, "dp-reduce-scatter", window)
    others = [r for r in mlp if r not in culprits]
    assert min(mlp[r] for r in culprits) > 4 * max(mlp[r] for r in others)
    assert max(comm[r] for r in culprits) < np.median([comm[r] for r in others])
    alarm = attempt.sql("SELECT DISTINCT rank FROM hw WHERE metric = 'nic_port_up' AND value = 0").column("rank")
    assert set(alarm.to_pylist()) == culprits


def _bubble_by_stage(records, layout, pipeline) -> np.ndarray:
    """Total pp-recv wait per stage of one pipeline (a pp group) over the step records."""
    recv_id = records[0].names.id("pp-recv")
    out = np.zeros(layout.pp)
    for rec in records:
        for ranks, _mb, name, _c, _g, _start, dur in rec.phase_chunks:
            if name == recv_id:
                mine = np.isin(ranks, pipeline)
                out[layout.stage_of(ranks[0])] += dur[mine].sum()
    return out


def test_a_slow_stage_raises_bubbles_on_the_stages_before_and_after_it():
    config = SimConfig(ranks=32, steps=6, layout="pp=4,dp=8", warmup_steps=0)
    _, ctx, plan, truth = prepare(config, "pipeline_bubble", {"ranks": "9", "start_step": "0"})
    assert ctx.layout.stage_of(9) == 1
    faulty = list(Engine(config, plan, topology=ctx.topology).run())
    healthy = list(Engine(config, None, topology=ctx.topology).run())
    pipeline = ctx.layout.group_of("pp", 9)
    bf, bh = _bubble_by_stage(faulty, ctx.layout, pipeline), _bubble_by_stage(healthy, ctx.layout, pipeline)
    assert bf[0] > 1.5 * bh[0]  # upstream: gradients from stage 1 arrive late
    assert bf[2] > 1.5 * bh[2] and bf[3] > 1.5 * bh[3]  # downstream: activations arrive late
    # Step totals still align: every rank of the step ends together.
    for rec in faulty:
        assert rec.step_end.max() - rec.step_end.min() < 0.01 * np.median(rec.step_end - rec.step_start) + 5e6


def test_fault_free_rerun_has_identical_noise_before_the_fault(simulated):
    _, truth = simulated("compute_straggler")
    onset = truth["faults"][0]["window"]["start_step"]
    assert truth["step_time_s"][:onset] == truth["baseline_step_time_s"][:onset]
    assert truth["faults"][0]["impact"]["slowdown_pct"] > 20


def test_healthy_job_stays_within_its_natural_variance(simulated):
    attempt, truth = simulated("healthy", steps=16)
    assert truth["faults"] == [] and truth["class"] == "healthy"
    times = np.array(truth["step_time_s"])
    normal = [s for s in range(len(times)) if s not in truth["natural"]["warmup_steps"]
              and s not in truth["natural"]["checkpoint_steps"]]
    assert times[normal].std() / times[normal].mean() < 0.10
    assert times[0] > 1.5 * np.median(times[normal])  # warm-up is slow for everyone
    assert times[10] > 3 * np.median(times[normal])  # checkpoint-save step
    ckpt = attempt.sql("SELECT count(DISTINCT rank) AS n FROM phases WHERE name = 'checkpoint-save'")
    assert ckpt.column("n")[0].as_py() == 64
    # No rank's compute is persistently off its peers: per-rank medians within 15% of the peer median.
    attn = _median_by_rank(attempt, "self_attention", (2, 9))
    for rank, value in attn.items():
        peers = attempt.layout.peer_set(rank)
        assert abs(value / np.median([attn[p] for p in peers]) - 1) < 0.15


def test_moe_routing_imbalance_changes_from_step_to_step(simulated):
    attempt, _ = simulated("healthy", steps=16)
    rows = attempt.sql("SELECT step, rank, sum(dur_ns) AS d FROM phases WHERE name = 'moe_experts' "
                       "GROUP BY step, rank ORDER BY step, rank").to_pylist()
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r["d"])
    slowest = [int(np.argmax(v)) for s, v in sorted(by_step.items()) if s >= 2]
    assert len(set(slowest)) > 3  # a different rank carries the most tokens in different steps


def test_hang_stops_the_job_with_unfinished_collectives(simulated):
    attempt, truth = simulated("hang")
    fault = truth["faults"][0]
    culprit, step = fault["culprit_ranks"][0], fault["steps"][0]
    assert attempt.step_range() == (0, step)
    ends = attempt.sql(f"SELECT count(*) AS n FROM steps WHERE step = {step} AND end_ns = -1").column("n")
    assert ends[0].as_py() == 64
    mine = attempt.sql(f"SELECT name, dur_ns FROM phases WHERE step = {step} AND rank = {culprit}").to_pylist()
    assert mine == [{"name": "dataloader", "dur_ns": -1}]  # never joined a collective
    open_comm = attempt.sql(f"SELECT count(DISTINCT rank) AS n FROM phases WHERE step = {step} "
                            "AND category = 'comm' AND dur_ns = -1").column("n")[0].as_py()
    assert open_comm == 63
    assert fault["impact"]["stalled"] is True
    stuck = attempt.sql(f"SELECT frames FROM stacks WHERE step = {step} AND rank = {culprit}").column("frames")
    assert any("dataloader" in f for f in stuck.to_pylist())


def test_jit_stall_has_sparse_kernels_and_compile_stacks(simulated):
    attempt, truth = simulated("jit_stall")
    fault = truth["faults"][0]
    rank, mb, step = fault["culprit_ranks"][0], fault["microbatch"], fault["steps"][0]
    phase = attempt.sql(f"SELECT start_ns, dur_ns FROM phases WHERE rank = {rank} AND step = {step} "
                        f"AND microbatch = {mb} AND name = 'backward-compute'").to_pylist()[0]
    others = _median_by_rank(attempt, "backward-compute", (step, step))
    assert phase["dur_ns"] > 20 * np.median(list(others.values()))
    busy = attempt.sql(
        f"SELECT sum(dur_ns) AS b FROM kernels WHERE rank = {rank} AND step = {step} AND stream = 7 "
        f"AND start_ns >= {phase['start_ns']} AND start_ns < {phase['start_ns'] + phase['dur_ns']}").column("b")
    assert busy[0].as_py() < 0.1 * phase["dur_ns"]  # the GPU is mostly idle: kernels are sparse
    frames = attempt.sql(f"SELECT frames, count FROM stacks WHERE rank = {rank} AND step = {step}").to_pylist()
    compile_samples = sum(r["count"] for r in frames if "triton/compiler" in r["frames"])
    assert compile_samples >= 0.9 * fault["params"]["stall_ms"] / 1000 * 20


def test_gc_pause_appears_in_stacks_of_the_culprit_only(simulated):
    attempt, truth = simulated("gc_pause")
    fault = truth["faults"][0]
    rows = attempt.sql("SELECT DISTINCT rank, step FROM stacks WHERE frames LIKE '%gc_collect%'").to_pylist()
    assert {r["rank"] for r in rows} == set(fault["culprit_ranks"])
    assert {r["step"] for r in rows} == set(fault["steps"])


def test_link_degradation_is_constant_slows_its_groups_and_keeps_step_time_stable(simulated):
    attempt, truth = simulated("link_degradation", steps=16)
    fault = truth["faults"][0]
    assert fault["window"] == {"start_step": 0, "end_step": 15}
    times = np.array(truth["step_time_s"])
    normal = [s for s in range(2, 16) if s not in truth["natural"]["checkpoint_steps"]]
    assert times[normal].std() / times[normal].mean() < 0.10  # no spike, no level shift
    # Transfers inside groups that include a degraded host are slower; the pcie link says why.
    hosts = set(fault["culprit_hosts"])
    bad = attempt.sql("SELECT DISTINCT host FROM topology t JOIN hw h ON t.rank = h.rank "
                      "WHERE h.metric = 'pcie_width' AND h.value = 4").column("host").to_pylist()
    assert set(bad) == hosts
    lay = attempt.layout
    culprit = fault["culprit_ranks"][0]
    slow_group = lay.group_of("dp", culprit).tolist()
    rs = _median_by_rank(attempt, "%ReduceScatter%", (2, 15), table="kernels")
    fast = [r for r in rs if lay.stage_of(r) != lay.stage_of(culprit)]
    if fast:
        assert np.median([rs[r] for r in slow_group]) > 1.5 * np.median([rs[r] for r in fast])


def test_link_flap_slows_collectives_only_while_flapping(simulated):
    attempt, truth = simulated("link_flap", steps=16)
    fault = truth["faults"][0]
    flap = set(fault["steps"])
    per_step = attempt.sql("SELECT step, max(dur_ns) AS d FROM kernels WHERE name LIKE '%ReduceScatter%' "
                           "GROUP BY step ORDER BY step").to_pylist()
    on = [r["d"] for r in per_step if r["step"] in flap]
    off = [r["d"] for r in per_step if r["step"] not in flap and r["step"] >= 2]
    assert min(on) > 1.5 * np.median(off)


def test_thermal_throttle_ramps_compute_and_reports_temperature(simulated):
    attempt, truth = simulated("thermal_throttle", steps=16)
    fault = truth["faults"][0]
    rank = fault["culprit_ranks"][0]
    start, end = fault["window"]["start_step"], fault["window"]["end_step"]
    attn = attempt.sql(f"SELECT step, median(dur_ns) AS d FROM phases WHERE rank = {rank} "
                       f"AND name = 'self_attention' GROUP BY step ORDER BY step").to_pylist()
    d = {r["step"]: r["d"] for r in attn}
    assert d[end] > 1.3 * d[start - 1] and d[end] > d[start + 1]
    temp = attempt.sql(f"SELECT step_ts.value AS v FROM (SELECT ts_ns, value FROM hw WHERE rank = {rank} "
                       "AND metric = 'temperature_c' ORDER BY ts_ns) AS step_ts").column("v").to_pylist()
    assert temp[-1] > 85 and temp[0] < 75


def test_simulation_is_deterministic_per_seed():
    def run(seed):
        recs = list(Engine(SimConfig(ranks=16, steps=3, seed=seed)).run())
        return np.concatenate([r.step_end for r in recs])

    assert np.array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_custom_rank_order_still_gives_aligned_steps():
    config = SimConfig(ranks=32, steps=3, layout="tp=2,pp=2,ep=2,dp=4", order="tp-dp-ep-cp-pp", clock_skew_ms=0)
    for rec in Engine(config).run():
        assert rec.step_end.max() - rec.step_end.min() < 0.01 * np.median(rec.step_end - rec.step_start)


def test_ten_thousand_ranks_fit_in_memory():
    import resource

    config = SimConfig(ranks=10240, steps=2)
    engine = Engine(config)
    assert str(engine.layout) == "tp=8,cp=1,ep=8,dp=20,pp=8"
    events = sum(r.n_phase_events + r.n_kernel_events for r in engine.run())
    assert events > 10_000_000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 8 * 1024 * 1024  # KiB: < 8 GiB


@pytest.mark.parametrize("scenario", ["pipeline_bubble", "link_degradation"])
def test_scenarios_explain_what_they_need(scenario):
    from argus.errors import ScenarioError

    config = SimConfig(ranks=8, steps=4, layout="dp=8")
    with pytest.raises(ScenarioError, match="pp >= 2|at least 2 hosts"):
        prepare(config, scenario)


def test_kernels_on_one_compute_stream_never_overlap_at_ns_precision(simulated):
    attempt, _ = simulated("healthy", steps=16)
    rows = attempt.sql("SELECT start_ns, dur_ns FROM kernels WHERE rank = 5 AND stream = 7 AND step = 3 "
                       "ORDER BY start_ns").to_pylist()
    starts = np.array([r["start_ns"] for r in rows])
    ends = starts + np.array([r["dur_ns"] for r in rows])
    assert len(rows) > 100
    assert (starts[1:] >= ends[:-1]).all()
