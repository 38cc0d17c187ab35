"""Each cause gets its own remedy; no structural or software cause is told to touch a node."""

from __future__ import annotations

import pytest

from argus.analysis.remedies import STALL_REMEDIES, in_the_job, remedy
from argus.report.page import cost_per_hour


@pytest.mark.parametrize("cause, words", [("garbage_collection", "gc.freeze()"), ("jit_compile", "compile cache"),
                                          ("data_loading", "DataLoader workers"), ("checkpoint_io", "async_save")])
def test_a_named_stall_cause_gets_its_own_remedy(cause, words):
    for kind in ("stacks", "host_phases"):
        ev = [{"kind": "regression"}, {"kind": kind, "cause": cause}]
        assert words in remedy("host_stall", ev) and in_the_job("host_stall", ev)


def test_an_unnamed_stall_asks_for_more_fidelity_not_a_node():
    ev = [{"kind": "stacks", "cause": "unknown"}]
    assert "raise trace fidelity" in remedy("host_stall", ev) and not in_the_job("host_stall", ev)


@pytest.mark.parametrize("klass", ["pipeline_imbalance", "input_imbalance", "host_stall"])
def test_structural_causes_never_name_a_node_to_replace(klass):
    ev = [{"kind": "stacks", "cause": "garbage_collection"}]
    text = remedy(klass, ev).lower()
    assert text and "cordon" not in text and "drain" not in text and "repair" not in text


def test_a_verification_decides_the_hardware_remedy():
    assert "argus verify" in remedy("compute_straggler", [])
    assert "drain the node" in remedy("link_degradation", [{"kind": "verification", "outcome": "confirmed"}])
    assert "not in the node" in remedy("compute_straggler", [{"kind": "verification", "outcome": "refuted"}])
    assert set(STALL_REMEDIES) == {"garbage_collection", "jit_compile", "data_loading", "checkpoint_io"}


def test_cost_per_hour_is_the_share_of_gpu_time_the_slowdown_takes():
    """+25% step time: a fifth of every GPU's hour is lost (16 ranks: 3.2 GPU-h per hour); a
    stopped job loses every GPU's hour; no measured slowdown, no price."""
    assert cost_per_hour({"class": "compute_straggler", "impact": {"slowdown_pct": 25.0}}, 16) == pytest.approx(3.2)
    assert cost_per_hour({"class": "hang", "impact": {"slowdown_pct": 100.0}}, 16) == 16
    assert cost_per_hour({"class": "link_degradation", "impact": {"slowdown_pct": None}}, 16) is None
