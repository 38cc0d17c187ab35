"""What is gathered stays bounded, and stored incidents are used only while current."""

import numpy as np
import pytest

from argus.report import Gatherer, fingerprint, incidents_of, stored_incidents
from argus.report import collect as gather_module
from argus.store import conform
from tests.report.helpers import copy_store, sim


def test_step_series_bins_keep_the_spike(simulated):
    attempt, _ = sim(simulated, "jit_stall")
    with Gatherer(attempt) as g:
        full = g.step_series()
        binned = g.step_series(max_points=7)
    assert full.n_points == 20 and full.steps_per_point == 1
    assert binned.n_points == 7 and binned.steps_per_point == 3
    assert np.nanmax(binned.job_s) == pytest.approx(np.nanmax(full.job_s))  # the 6 s stall survives binning
    assert np.all(binned.p10_s <= binned.p90_s)


def test_heatmap_shows_culprits_sampled_peers_and_quantiles(simulated, monkeypatch):
    attempt, truth = sim(simulated, "masked_compute_straggler")
    culprits = truth["faults"][0]["culprit_ranks"]
    monkeypatch.setattr(gather_module, "SAMPLED_PEERS", 4)
    monkeypatch.setattr(gather_module, "QUANTILE_PEERS", 8)
    with Gatherer(attempt) as g:
        h = g.phase_heatmap(culprits, 5, 19, "mlp")
    assert h is not None
    assert h.row_ranks[:len(culprits)] == sorted(culprits) and h.culprit_rows == list(range(len(culprits)))
    assert len(h.row_labels) == len(culprits) + 4 + 3 and h.peers_sampled == 8 and h.peers_total > 8
    assert h.columns[0] == "mlp" and len(h.columns) <= gather_module.MAX_PHASES
    mlp_ratio = h.ratio[:len(culprits), 0]
    assert np.all(mlp_ratio > 3)  # the culprits' mlp is several times the peers' median
    assert h.ratio[-2, 0] == pytest.approx(1.0)  # the p50 row is the normaliser


def _incident_row(id_: str) -> dict:
    return {"id": [id_], "class": ["compute_straggler"], "state": ["suspected"], "severity": ["warning"],
            "culprit_ranks": [[3]], "hosts": [["node-0000"]], "gpus": [["GPU-x"]], "start_step": [2],
            "end_step": [4], "phase": ["mlp"], "kernels": [[]], "slowdown_pct": [5.0], "gpu_hours_lost": [0.1],
            "action": ["observe"], "evidence": ['[{"level": "L2", "kind": "busy_outlier", "rank": 3}]'],
            "detected_ns": [1]}


def test_stored_incidents_count_only_while_newer_than_the_data(simulated, tmp_path):
    attempt = copy_store(sim(simulated, "healthy")[0], tmp_path / "S")
    attempt.writer("diagnose").write("incidents", conform("incidents", _incident_row("inc-stored")), window=0)
    found = incidents_of(attempt, None)
    assert [(j["id"], src) for j, src in found] == [("inc-stored", "store")]
    assert found[0][0]["evidence"][0]["kind"] == "busy_outlier"
    before = fingerprint(attempt.path)
    steps = attempt.read("steps", steps=(19, 19))
    attempt.writer("late").write("steps", steps, window=99)  # new data after the diagnosis
    after = fingerprint(attempt.path)
    assert after.data != before.data and after.incidents == before.incidents
    assert stored_incidents(attempt, after.data_mtime_ns) == []


def test_the_jobs_nodes_as_the_kept_health_checks_judge_them(simulated, tmp_path):
    """A node of the job that failed a kept check (and none since) is shown out of service in the
    report and the UI's summary; a host the job did not use is not shown; no check kept: nothing."""
    from argus.healthcheck.records import save_health
    from argus.report import gather
    from argus.report.page import render_report

    attempt = copy_store(sim(simulated, "healthy")[0], tmp_path / "S")
    assert gather(attempt).nodes == []
    host = str(attempt.topology().hosts[0])

    def doc(h: str, at: float, status: str) -> dict:
        return {"host": h, "started_s": at, "verdicts": [
            {"level": "gpu", "metric": "gemm_fp32_gflops", "subject": "device", "status": status, "value": 41.5,
             "unit": "GFLOP/s", "baseline": 80.0, "peers": None, "deficit": 0.48},
            {"level": "node", "metric": "copy_gbs", "subject": "device", "status": "pass", "value": 9.9,
             "unit": "GB/s", "baseline": 10.0, "peers": None, "deficit": 0.01}]}

    root = tmp_path / "S"
    save_health(root, doc(host, 100.0, "fail"))
    save_health(root, doc("not-in-this-job", 100.0, "fail"))
    data = gather(attempt)
    assert [(n["host"], n["standing"]) for n in data.nodes] == [(host, "out")]
    assert data.summary_json()["nodes"][0]["failing"] == ["gemm_fp32_gflops device"]
    html = render_report(data)
    assert "Node health" in html and "out of service" in html and "not-in-this-job" not in html
    # and what the last check measured, failures first: the figure, its baseline, the deficit
    assert [f["metric"] for f in data.nodes[0]["figures"]] == ["gemm_fp32_gflops", "copy_gbs"]
    assert "41.5" in html and "48.0%" in html and "node-figures" in html
    save_health(root, doc(host, 200.0, "pass"))
    (node,) = gather(attempt).nodes
    assert node["standing"] == "in" and node["readmissions"] == [{"failed_s": 100.0, "readmitted_s": 200.0}]
