"""Severity, state and action are bounded by the measured impact, by construction."""

import pytest

from argus.analysis.incident import CRITICAL_PCT, WARNING_PCT, Incident, grade


def _incident(klass="pipeline_imbalance", pct=0.0, severity="critical", state="confirmed", action="cordon_node"):
    return Incident(klass, [3], ["h0"], ["g3"], 5, 9, "backward-compute", [], state, severity, pct, 0.0, action)


@pytest.mark.parametrize("pct", [0.0, None, float("nan"), WARNING_PCT / 2])
def test_critical_with_no_impact_is_impossible(pct):
    inc = _incident(pct=pct)
    assert (inc.severity, inc.state, inc.action) == ("info", "suspected", "observe")
    inc.severity = "critical"  # a later level cannot raise it either
    inc.state = "confirmed"
    assert (inc.severity, inc.state) == ("info", "suspected")
    assert inc.to_json()["severity"] == "info"


def test_severity_follows_the_impact_both_ways():
    inc = _incident(pct=5.0)
    assert (inc.severity, inc.state, inc.action) == ("warning", "confirmed", "cordon_node")  # capped at its grade
    inc.slowdown_pct = CRITICAL_PCT + 1  # the what-if found more: the grade allows more, the level decides
    inc.severity = grade(inc.slowdown_pct)
    assert inc.severity == "critical"
    inc.slowdown_pct = 0.5  # … and found that removing the culprits changes nothing
    assert (inc.severity, inc.state, inc.action) == ("info", "suspected", "observe")


def test_a_hang_keeps_its_severity():
    inc = _incident(klass="hang", pct=None, action="checkpoint_and_restart")
    assert (inc.severity, inc.state, inc.action) == ("critical", "confirmed", "checkpoint_and_restart")


def test_a_store_with_one_rank_of_eight_says_nothing_could_be_compared(tmp_path, capsys):
    from argus.analysis import diagnose
    from argus.cli.main import main
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    simulate_to_store(SimConfig(ranks=8, steps=10, seed=3), "healthy", tmp_path / "s")
    attempt = Store.open(tmp_path / "s").attempt()
    full = diagnose(attempt)
    assert full.coverage.complete and full.coverage.comparable == 8 and full.coverage.sentence() == ""
    for table in ("steps", "phases", "kernel_summaries"):  # keep rank 5 only
        for f in attempt.files(table):
            import pyarrow.compute as pc
            import pyarrow.parquet as pq

            t = pq.read_table(f)
            pq.write_table(t.filter(pc.equal(t.column("rank"), 5)), f)
    d = diagnose(Store.open(tmp_path / "s").attempt())
    assert (d.coverage.present, d.coverage.comparable) == (1, 0) and 0 in d.coverage.missing
    assert d.document()["coverage"]["present"] == 1
    assert main(["diagnose", str(tmp_path / "s"), "--no-store"]) == 0
    out = capsys.readouterr().out
    assert "1 of 8 ranks recorded" in out and "nothing was compared" in out and "every rank's work" not in out
