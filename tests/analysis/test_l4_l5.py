"""L4 (replay, pipeline, device gaps) and L5 (stacks) on the simulator's production cases,
scored against the simulator's truth (the same seed re-run without the fault)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from argus.analysis.l4_gaps import _union_ns, gpu_idle
from argus.analysis.l4_pipeline import pipeline_bubbles
from argus.analysis.l5_stacks import classify_frames, stack_cause
from argus.store import conform


def _evidence(incident: dict, kind: str) -> dict:
    found = [e for e in incident["evidence"] if e["kind"] == kind]
    assert found, f"no {kind} evidence in {[e['kind'] for e in incident['evidence']]}"
    return found[0]


def _only(diagnosis, klass: str) -> dict:
    incs = [i for i in diagnosis.document()["incidents"] if i["severity"] != "info"]
    assert [i["class"] for i in incs] == [klass]
    return incs[0]


def test_pipeline_bubble_origin_stage_and_what_if_within_15pct_of_truth(diagnosed):
    attempt, truth, d = diagnosed("pipeline_bubble")
    fault = truth["faults"][0]
    inc = _only(d, "pipeline_imbalance")
    pipe = _evidence(inc, "pipeline")
    culprit = fault["culprit_ranks"][0]
    assert pipe["origin_rank"] == culprit
    assert pipe["origin_stage"] == int(attempt.layout.stage_of(culprit))
    origin = pipe["stages"][pipe["origin_stage"]]
    assert origin["bwd_ms_per_mb"] > 1.5 * origin["peer_bwd_ms_per_mb"]  # backward ~1.9× its peers'
    assert abs(origin["fwd_ms_per_mb"] / origin["peer_fwd_ms_per_mb"] - 1) < 0.2  # forward normal
    others = [s for s in pipe["stages"] if s["stage"] != pipe["origin_stage"]]
    assert all(s["bubble_ms"] > 1.5 * s["peer_bubble_ms"] for s in others)  # they idle waiting for it
    assert pipe["amplification"] > 0.3
    wi = _evidence(inc, "what_if")
    true_extra = fault["impact"]["extra_s"]
    assert abs(wi["extra_s"] - true_extra) <= 0.15 * true_extra, (wi["extra_s"], true_extra)
    assert abs(inc["impact"]["gpu_hours_lost"] - fault["impact"]["gpu_hours_lost"]) <= \
        0.15 * fault["impact"]["gpu_hours_lost"]
    assert max(wi["replay_error_pct"]) < 10  # the replay reproduces the recorded steps
    crit = _evidence(inc, "critical_path")
    assert crit["by_rank"][0]["rank"] == culprit
    assert inc["state"] == "confirmed" and "pipeline_origin" in _evidence(inc, "agreement")["with"]


def test_jit_stall_cause_gaps_and_what_if_within_15pct_of_truth(diagnosed):
    attempt, truth, d = diagnosed("jit_stall", kernels=True)
    fault = truth["faults"][0]
    inc = _only(d, "host_stall")
    assert inc["culprit_ranks"] == fault["culprit_ranks"]
    assert inc["steps"] == fault["steps"] and inc["phase"] == fault["phase"]
    stacks = _evidence(inc, "stacks")
    assert stacks["cause"] == "jit_compile" and stacks["top_frames"]
    gaps = _evidence(inc, "gpu_idle")
    assert gaps["method"] == "raw_kernels" and gaps["microbatch"] == fault["microbatch"]
    assert gaps["idle_pct"] > 90 and gaps["host_stall"]
    assert gaps["launches_per_ms"] < 0.05 * gaps["peer_launches_per_ms"]  # launches sparse
    assert gaps["kernels"] == pytest.approx(gaps["peer_kernels"], rel=0.2)  # same work, spread out
    wi = _evidence(inc, "what_if")
    true_extra = fault["impact"]["extra_s"]
    assert abs(wi["extra_s"] - true_extra) <= 0.15 * true_extra, (wi["extra_s"], true_extra)
    assert set(_evidence(inc, "agreement")["with"]) >= {"gpu_idle", "stacks"}


@pytest.mark.parametrize("scenario", ["compute_straggler", "masked_compute_straggler", "gc_pause"])
def test_what_if_matches_truth_for_other_faults(diagnosed, scenario):
    _, truth, d = diagnosed(scenario)
    inc = [i for i in d.document()["incidents"] if i["severity"] != "info"][0]
    true_extra = truth["faults"][0]["impact"]["extra_s"]
    assert abs(_evidence(inc, "what_if")["extra_s"] - true_extra) <= 0.15 * true_extra


def test_replay_reproduces_a_healthy_job_and_a_healthy_rank_costs_nothing(diagnosed):
    """The graph replayed with what was recorded gives the recorded steps; a healthy rank set to
    its peers' typical durations changes the step by little, as does any single healthy rank."""
    attempt, _, d = diagnosed("healthy")
    outcomes = [o for o in d.attribution if o.modeled]
    # the simulator skews every host's clock by ~2 ms: aligned from the collectives, within a few percent
    assert outcomes and all(o.attribution.error_pct < 3.0 for o in outcomes)
    for o in outcomes:
        ranks = [s for s in o.attribution.shares if s.kind == "rank" and s.part == "worker"]
        assert ranks and all(s.gain_pct < 5.0 for s in ranks)
    assert not [i for i in d.incidents if i.severity != "info"]


def test_pipeline_analysis_needs_a_pipeline(diagnosed):
    attempt, _, _ = diagnosed("compute_straggler", layout="tp=2,dp=32")
    assert pipeline_bubbles(attempt, [3], 10) is None


def test_union_of_device_intervals():
    busy, gap = _union_ns(np.array([0, 5, 20, 22]), np.array([10, 8, 25, 30]))
    assert busy == 20 and gap == 10  # [0,10] ∪ [20,30]
    assert _union_ns(np.array([], np.int64), np.array([], np.int64)) == (0.0, 0.0)


def test_gpu_idle_is_none_without_the_phase(diagnosed):
    attempt, _, _ = diagnosed("healthy")
    assert gpu_idle(attempt, 0, [5], "no-such-phase") is None


def _stacks(rows: list[tuple[int, int, str, int]]) -> pa.Table:
    r, s, f, c = zip(*rows)
    return conform("stacks", {"rank": list(r), "step": list(s), "start_ns": [0] * len(r), "end_ns": [1] * len(r),
                              "thread": ["MainThread"] * len(r), "frames": list(f), "count": list(c)})


def test_stack_causes_are_summed_over_distinct_stacks(diagnosed):
    attempt, _, _ = diagnosed("healthy", ranks=16, steps=12)
    base = "main (train.py:1);step (train.py:9)"
    rows = [(3, s, base, 5) for s in range(10)]
    # the stall: five different compiler stacks, one sample each, in steps 4 and 7
    rows += [(3, s, f"{base};script (torch/jit/_script.py:{i});build (torch/jit/frontend.py:{i})", 1)
             for s in (4, 7) for i in range(5)]
    rows += [(3, 4, f"{base};load (data.py:3)", 1)]
    attempt.writer("test").write("stacks", _stacks(rows), window=900)
    cause = stack_cause(attempt, 3, [4, 7])
    assert cause.cause == "jit_compile" and cause.by_cause["jit_compile"] == 10
    assert all("torch/jit" in f for f, _ in cause.top_frames[:5])
    assert stack_cause(attempt, 3, [2]).cause == "unknown"  # a normal step shows nothing extra


def test_a_cause_below_the_naming_bar_is_not_told_beside_the_real_one(diagnosed):
    """CI's checkpoint job: four save samples and one all-reduce wait caught a little more often
    by chance in the saving steps — the wait is not a cause of its own, its sample is unknown."""
    attempt, _, _ = diagnosed("healthy", ranks=16, steps=12)
    base = "main (train.py:1);step (train.py:9)"
    wait = f"{base};all_reduce (torch/distributed/distributed_c10d.py:2)"
    rows = [(5, s, base, 5) for s in range(10)] + [(5, s, wait, 1) for s in range(10)]
    rows += [(5, s, f"{base};save (torch/serialization.py:{i})", 1) for s in (3, 6) for i in range(2)]
    rows += [(5, 3, wait, 1)]  # one more wait sample in a saving step
    attempt.writer("test").write("stacks", _stacks(rows), window=901)
    cause = stack_cause(attempt, 5, [3, 6])
    assert cause.cause == "checkpoint_io" and cause.by_cause["checkpoint_io"] == 4
    assert "synchronisation" not in cause.by_cause and cause.by_cause.get("unknown", 0) >= 1


@pytest.mark.parametrize("frames,cause", [
    ("a;collect (gc)", "garbage_collection"),
    ("a;_next_data (torch/utils/data/dataloader.py:1)", "data_loading"),
    ("a;save (torch/serialization.py:1)", "checkpoint_io"),
    ("a;barrier (torch/distributed/distributed_c10d.py:1)", "synchronisation"),
    ("a;forward (model.py:3)", "unknown"),
])
def test_frames_are_classified(frames, cause):
    assert classify_frames(frames) == cause


def test_a_costly_claim_the_replay_refutes_is_inconclusive(diagnosed):
    """A comparison charges 10% to a healthy rank; the attribution, evaluating that rank, finds the
    job gains nothing without its (nonexistent) excess: the levels disagree, and the incident
    says so rather than claiming."""
    from argus.analysis.arbiter import arbitrate
    from argus.analysis.attribution import attribute_window
    from argus.analysis.frames import load_phases
    from argus.analysis.incident import Incident

    attempt, _, d = diagnosed("healthy")
    topo = attempt.topology()
    step_time = {int(s): float(t) for s, t in zip(*(c.to_numpy() for c in (
        attempt.sql("SELECT step, max(end_ns - start_ns) / 1e9 AS t FROM steps GROUP BY step ORDER BY step").columns)))}
    inc = Incident("compute_straggler", [5], [str(topo.hosts[5])], [str(topo.gpu_uuids[5])], 8, 12, "mlp", [],
                   "confirmed", "warning", 10.0, 1.0, "cordon_node",
                   [{"level": "L2", "kind": "busy_outlier", "rank": 5}], list(range(8, 13)))
    outcome = attribute_window(load_phases(attempt, 5, 14), attempt.layout, topo.hosts, None, 5, 14,
                               [("candidate 0", [5])])
    (out,) = [i for i in arbitrate([inc], [outcome], topo, d.l1, step_time)[0] if i.klass == "compute_straggler"]
    assert (out.severity, out.state, out.action) == ("info", "inconclusive", "observe")
    kinds = [e["kind"] for e in out.evidence]
    assert "what_if" in kinds and "disagreement" in kinds


def test_the_interleaved_schedules_wrap_around_transfers_are_paired_and_replayed(tmp_path):
    """Interleaved 1F1B: the last stage sends chunk 0's activations to the first stage's chunk 1
    (and the first stage sends gradients back the same way). Unpaired, those transfers replayed
    as fixed waits, so removing a pause on one rank gained nearly nothing (150 ms GC pauses:
    0.02 s of their 0.1–0.19 s per step)."""
    from argus.analysis.collectives import pair_p2p
    from argus.analysis.frames import load_phases
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    cfg = SimConfig(ranks=32, steps=6, seed=3, layout="tp=2,pp=4,dp=4", virtual_stages=2, warmup_steps=0,
                    checkpoint_every=0)
    simulate_to_store(cfg, "gc_pause", tmp_path / "s", params={"pause_ms": 150.0, "ranks": "29",
                                                                     "probability": 1.0}, baseline=True)
    attempt = Store.open(tmp_path / "s").attempt()
    f = load_phases(attempt, 3, 3, None)
    recv, send = pair_p2p(f, attempt.layout, f.start.astype(np.float64))
    n_recv = int(sum(1 for i in np.flatnonzero(f.is_comm) if f.names[f.name[i]] == "pp-recv"))
    assert len(recv) == len(send) == n_recv  # every receive, the wrap-around ones included
    from argus.analysis.attribution import attribute_window

    outcome = attribute_window(load_phases(attempt, 2, 5), attempt.layout, attempt.topology().hosts, None, 2, 5,
                               [("candidate 0", [29])])
    wa = outcome.attribution
    assert outcome.modeled and wa.error_pct < 5.0  # the wrap-around pairs hold the step's dependencies
    (fix,) = [s for s in wa.shares if s.label == "candidate 0" and s.part == "worker" and s.kind == "ranks"]
    assert np.mean(fix.per_step_gain_s) > 0.05  # most of the 150 ms pause is on the critical path


def test_an_intermittent_stall_is_charged_over_its_span():
    """400 ms pauses in every third 70 ms step: over the stalled steps alone they read +795%;
    the cost is stated over the span from the first to the last, as a user sees it."""
    from argus.analysis.arbiter import _Cost

    steps = [6, 9, 12]
    step_time = {s: (0.47 if s in steps else 0.07) for s in range(20)}
    extra = 0.4 * len(steps)
    cost = _Cost(extra, sum(step_time[s] for s in steps), steps, [], 0.0, intermittent=True)
    assert cost.slowdown_pct > 500
    cost.spread(step_time)
    span = sum(step_time[s] for s in range(6, 13))
    assert abs(cost.slowdown_pct - 100 * extra / (span - extra)) < 1e-6 and cost.slowdown_pct < 300
    one = _Cost(0.4, 0.47, [6], [], 0.0, intermittent=True)
    one.spread(step_time)  # a one-off: over the whole run
    assert abs(one.slowdown_pct - 100 * 0.4 / (sum(step_time.values()) - 0.4)) < 1e-6
