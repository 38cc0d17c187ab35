"""The host's own counters as evidence: link error counters that climb on the accused hosts,
and CPU or I/O pressure that stands out from the other hosts' (never pressure every host shares)."""

from __future__ import annotations

import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.analysis.evidence import check_evidence
from argus.sim import SimConfig, simulate_to_store
from argus.store import Store


def _job(tmp_path, scenario: str, **cfg):
    res = simulate_to_store(SimConfig(ranks=32, steps=20, seed=3, **cfg), scenario, tmp_path / "s")
    return Store.open(tmp_path / "s").attempt(), res.truth


def _add_host_rows(attempt, values: dict[int, dict[str, float]]) -> None:
    """``values``: rank (its host's first) → metric → value, sampled at every step's start."""
    starts = attempt.sql("SELECT rank, step, start_ns FROM steps").to_pylist()
    rows: dict[str, list] = {"rank": [], "gpu_uuid": [], "ts_ns": [], "metric": [], "value": []}
    for s in starts:
        for metric, v in values.get(s["rank"], {}).items():
            for col, x in zip(rows, (s["rank"], "", s["start_ns"] + 1, metric, v)):
                rows[col].append(x)
    attempt.writer("host-counters").write("hw", rows, 0)


def _link(attempt):
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    (inc,) = [i for i in d.incidents if i.klass == "link_degradation"]
    assert check_evidence(inc.evidence) == []
    return inc


@pytest.mark.parametrize("others", [5.0, 60.0])
def test_a_slow_link_on_the_one_host_whose_cpus_were_saturated_is_not_confirmed(tmp_path, others):
    """node-0002's and node-0003's PCIe links are slow (confirmed by the hardware alone). With
    node-0002's CPUs 60% contended and the other hosts' at 5%, contention is as likely: suspected,
    verify. With every host at 60% the pressure tells no host apart and changes nothing."""
    attempt, _ = _job(tmp_path, "link_degradation")
    hosts = {0: others, 8: others, 16: 60.0, 24: others}  # each host's first rank
    _add_host_rows(attempt, {r: {"psi_cpu_some": v, "cpu_softirq_pct": 1.0} for r, v in hosts.items()})
    inc = _link(attempt)
    pressure = [e for e in inc.evidence if e["kind"] == "cpu_pressure"]
    if others < 20:
        assert inc.state == "suspected" and inc.action == "verify"
        assert pressure and pressure[0]["hosts"] == ["node-0002"] and "contention" in inc.summary
    else:
        assert inc.state == "confirmed" and not pressure


def test_port_error_counters_that_climb_on_the_accused_hosts_are_its_evidence(tmp_path):
    attempt, _ = _job(tmp_path, "link_degradation")
    _add_host_rows(attempt, {16: {"ib_link_errors": 3.0}, 0: {"ib_link_errors": 0.0}})
    inc = _link(attempt)
    (errors,) = [e for e in inc.evidence if e["kind"] == "link_errors"]
    assert errors["hosts"] == ["node-0002"] and errors["errors"]["node-0002"] == 60
    assert "link error counters rose on node-0002" in inc.summary


def test_a_data_stall_on_a_host_whose_storage_stalled_says_so(tmp_path):
    attempt, truth = _job(tmp_path, "jit_stall")
    fault = truth["faults"][0]
    culprit = fault["culprit_ranks"][0]
    first = culprit - culprit % 8
    _add_host_rows(attempt, {r: {"psi_io_some": 45.0 if r == first else 2.0} for r in (0, 8, 16, 24)})
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    (inc,) = [i for i in d.incidents if i.klass == "host_stall"]
    assert inc.culprit_ranks == [culprit] and check_evidence(inc.evidence) == []
    assert any(e["kind"] == "io_pressure" for e in inc.evidence) and "storage stalled" in inc.summary
