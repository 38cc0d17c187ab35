"""The attribution on the public traces of real jobs (tests/data/stragglers): the job's slowdown
within 10% of what the authors published, and their root cause named — without microbatch
labels, which the analysis must not need — with no other claim."""

import json

import pytest

from argus.bench.whatif import DEFAULT_DATA, Expected, expected_for, run, score


@pytest.fixture(scope="module")
def rows():
    return {r["trace"]: r for r in run(labels=(False,)) if not r.get("summary")}


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_public_trace_slowdown_and_root_cause(rows, name):
    r = rows[f"trace-{name}"]
    assert r["windows_modeled"] == r["windows"] > 0
    assert r["replay_error_pct_max"] < 1.0
    assert 0.9 <= r["S_ratio"] <= 1.1, r
    assert r["root_cause_named"], r
    assert r["other_claims"] == [], r


def test_expected_root_causes_follow_the_published_split():
    pub = json.loads((DEFAULT_DATA / "published.json").read_text())["traces"]
    ar = expected_for("AR", pub["AR"], dp=4)
    assert (ar.klass, ar.culprits) == ("compute_straggler", (0,))
    assert expected_for("ST", pub["ST"], dp=2).culprits == (6, 7)
    se = expected_for("SE", pub["SE"], dp=32)
    assert se.klass == "input_imbalance" and se.culprits == ()
    assert se.also_stage == tuple(range(32, 64))  # their own stage split: stage 1 ×1.44


def test_score_wants_the_culprits_and_nothing_else():
    exp = Expected("compute_straggler", (0,), "")
    inc = {"class": "compute_straggler", "culprit_ranks": [0], "severity": "warning"}
    assert score({"incidents": [inc]}, exp) == {"root_cause_named": True, "other_claims": []}
    wrong = {**inc, "culprit_ranks": [0, 1]}
    assert score({"incidents": [wrong]}, exp)["root_cause_named"] is False
    extra = {"class": "link_degradation", "culprit_ranks": [3], "severity": "warning"}
    assert score({"incidents": [inc, extra]}, exp)["other_claims"] == ["link_degradation:[3]"]


def test_a_stage_their_what_if_finds_heavier_is_no_other_claim():
    exp = Expected("input_imbalance", (), "", also_stage=(2, 3))
    stage = {"class": "pipeline_imbalance", "culprit_ranks": [2, 3], "severity": "warning"}
    assert score({"incidents": [stage], "observations": [{"kind": "variance"}]}, exp)["other_claims"] == []
    other = {**stage, "culprit_ranks": [0, 1]}
    assert score({"incidents": [other]}, exp)["other_claims"] == ["pipeline_imbalance:[0, 1]"]
