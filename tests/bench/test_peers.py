"""``argus bench peers``: one small job through Argus and Holistic Trace Analysis, scored against truth."""

from __future__ import annotations

import json
import math

import pytest

from argus.bench.peers import (
    HTA_CANDIDATES,
    PeerRun,
    culprit_scores,
    run_one,
    summarize,
)

_VARIANTS = {"as_shipped", "load_fix", "widened_nccl", "load_fix+widened_nccl", "failed"}


def test_culprit_scores_count_ranks_and_flag_any_rank_on_a_healthy_run():
    truth = {"faults": [{"culprit_ranks": [8, 9]}]}
    assert culprit_scores({8, 4}, truth) == (0.5, 0.5, None)
    assert culprit_scores(set(), truth) == (0.0, 0.0, None)
    assert culprit_scores({4, 5}, {"faults": []}) == (None, None, True)
    assert culprit_scores(set(), {"faults": []}) == (None, None, False)


def test_one_scenario_runs_through_both_tools_and_is_scored(tmp_path):
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    pytest.importorskip("psutil")

    run = run_one("compute_straggler", seed=0, ranks=8, steps=8, workdir=tmp_path)

    assert isinstance(run, PeerRun)
    assert not any(tmp_path.iterdir()), "the temp dir is removed"
    assert (run.scenario, run.ranks, run.steps, run.seed) == ("compute_straggler", 8, 8, 0)
    assert run.truth_ranks and set(run.truth_ranks) <= set(range(8))
    for value in (run.argus.precision, run.argus.recall):
        assert isinstance(value, float) and 0.0 <= value <= 1.0
    assert isinstance(run.argus.class_ok, bool) and run.argus.false_alarm is None
    assert run.argus.wall_s > 0 and run.hta.peak_extra_mb is not None and math.isfinite(run.hta.peak_extra_mb)
    assert run.hta_variant in _VARIANTS
    assert run.hta.class_ok is None  # HTA has no classes
    if run.hta_variant != "failed":
        assert len(run.hta.predicted) == HTA_CANDIDATES  # always its top k: no "nothing found"
        assert 0.0 <= run.hta.precision <= 1.0 and 0.0 <= run.hta.recall <= 1.0
    assert run.trace_mb > 0

    line = json.loads(json.dumps(run.to_json()))
    assert line["argus_precision"] == pytest.approx(run.argus.precision, abs=1e-4)
    assert {"hta_predicted", "hta_variant", "hta_errors", "hta_wall_s", "export_s"} <= set(line)

    rows = summarize([run])
    assert [r["scenario"] for r in rows] == ["compute_straggler", "ALL"]
    assert rows[0]["hta_class_accuracy"] is None and rows[0]["argus_false_alarm_rate"] is None
    assert isinstance(rows[0]["argus_precision"], float) and isinstance(rows[0]["argus_recall"], float)
    assert rows[0]["hta_variants"] == {run.hta_variant: 1}


def test_hta_on_ncclDevKernel_names_escalates_to_the_widened_name_test(tmp_path):  # noqa: N802 - the kernel's own name
    """Without ``hta_compat`` HTA 0.5 as shipped finds no communication kernel (upstream issue #360)."""
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    from argus.bench.peers import hta_stragglers
    from argus.kineto import export_kineto
    from argus.sim import SimConfig, simulate_to_store

    simulate_to_store(SimConfig(ranks=4, steps=4, kernels=True), "compute_straggler", tmp_path / "s", baseline=False)
    export_kineto(tmp_path / "s", tmp_path / "plain")

    answer = hta_stragglers(tmp_path / "plain")

    assert answer.variant == "widened_nccl"
    assert any("stragglers as shipped" in e for e in answer.errors)
    assert len(answer.ranks) == HTA_CANDIDATES and set(answer.ranks) <= {0, 1, 2, 3}
