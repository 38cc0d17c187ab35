"""``argus bench healthcheck``'s accounting: every failed run counted as a false fail, the failed
figures tallied (the quick checks it runs are the real command's; their own tests are
tests/healthcheck)."""

from __future__ import annotations

import json

import argus.bench.healthcheck as hb


def test_failed_runs_and_figures_are_counted(monkeypatch):
    def verdict(metric, status, size=0):
        return {"metric": metric, "subject": "ranks:0-1", "size_bytes": size, "status": status}

    docs = iter([(0, 10.0, {"verdicts": []}),
                 (1, 12.0, {"verdicts": [verdict("all_reduce_busbw_gbs", "fail", 64), verdict("gemm", "pass")]}),
                 (0, 11.0, {"verdicts": [verdict("all_reduce_busbw_gbs", "pass", 64)]}),
                 (1, 13.0, None)])
    monkeypatch.setattr(hb, "_check", lambda base, save, timeout: next(docs))
    lines: list[str] = []
    summary = hb.run(3, emit=lines.append)
    runs = [json.loads(x) for x in lines]
    assert runs[0]["baseline"] and [r["rc"] for r in runs[1:4]] == [1, 0, 1]
    assert runs[1]["failed"] == ["all_reduce_busbw_gbs ranks:0-1 64 B"] and runs[3]["failed"] == ["(no report)"]
    assert (summary["failed_runs"], summary["false_fail_rate"], summary["median_wall_s"]) == (2, 0.6667, 12.0)
    assert summary["failed_figures"] == {"all_reduce_busbw_gbs ranks:0-1 64 B": 1, "(no report)": 1}


def test_a_loaded_answer_is_no_false_fail(monkeypatch):
    docs = iter([(0, 10.0, {"verdicts": []}), (3, 12.0, {"verdicts": [], "load": {"others_cpu_share": 0.5}}),
                 (1, 12.0, {"verdicts": [{"metric": "copy_gbs", "subject": "device", "status": "fail"}]})])
    monkeypatch.setattr(hb, "_check", lambda base, save, timeout: next(docs))
    lines: list[str] = []
    summary = hb.run(2, emit=lines.append)
    assert (summary["failed_runs"], summary["loaded_runs"]) == (1, 1)
    assert json.loads(lines[1])["others_cpu_share"] == 0.5


def test_the_drift_bench_counts_a_slow_phase_shorter_than_the_pauses_as_no_false_fail():
    """``argus bench healthcheck --drift``'s judging on a series of our own making: a healthy node's
    memory copies steady at 40 GB/s, then 8 s at 28 GB/s (its neighbours). Measured again at once,
    a check inside the slow phase fails twice; measured again after the pauses, it passes."""
    from argus.bench.healthcheck import judge_series

    series = [(float(t), [v * f for f in (0.99, 0.995, 1.0, 1.005, 1.01)])
              for t in range(0, 122, 2) for v in [28.0 if 80 <= t < 88 else 40.0]]
    at_once, spread = judge_series(series)["policies"]
    assert at_once["checks"] == spread["checks"] > 100
    assert at_once["first_measurement_failed"] == spread["first_measurement_failed"] > 0
    assert at_once["false_fails"] > 0 and spread["false_fails"] == 0
