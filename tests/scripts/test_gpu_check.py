"""``scripts/gpu_check.py``'s own logic, without a GPU: it cannot pass by omission."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_a_cuda_device_it_says_so_in_one_line_and_runs_nothing():
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line) == {"check": "environment", "ok": True, "checks_run": 0, "note": "no CUDA device"}


def test_a_check_that_returns_nothing_or_raises_fails_and_the_rest_still_run(gpu_check, capsys):
    ran = []

    def missing_return():  # the bug main once had: check_collective built its document, returned None
        ran.append("a")

    def fine():
        ran.append("b")
        return {"check": "b", "ok": True}

    def raises():
        raise RuntimeError("boom")

    docs, failed = gpu_check.run_checks([("a", missing_return), ("c", raises), ("b", fine),
                                         ("d", lambda: {"check": "d"})])
    assert ran == ["a", "b"] and failed == 3
    assert [d["ok"] for d in docs] == [False, False, True, False]
    assert "no document" in docs[0]["error"] and "boom" in docs[1]["error"]
    assert len(capsys.readouterr().out.splitlines()) == 4  # one JSON line per check


def test_the_bench_passes_only_with_its_figures_within_the_thresholds(gpu_check):
    good = [{"bench": "gpu-overhead", "mode": "none", "overhead_pct": 0.0},
            {"bench": "gpu-overhead", "mode": "argus", "overhead_pct": 0.4},
            {"bench": "gpu-overhead", "mode": "cupti-check", "matched_share": [1.0, 0.99, 1.0],
             "kernel_time_ratio": [1.0, 1.01, 0.99]}]
    assert gpu_check.judge_bench(good) == []
    assert gpu_check.judge_bench([]) == ["no overhead figure for Argus", "no CUPTI-vs-profiler kernel comparison"]
    slow = [dict(good[1], overhead_pct=3.1), good[2]]
    assert any("3.1%" in m for m in gpu_check.judge_bench(slow))
    blind = [good[1], dict(good[2], matched_share=[0.0, 0.0, 0.0])]  # CUPTI saw nothing: exit 0 is not a pass
    assert any("matched" in m for m in gpu_check.judge_bench(blind))


def test_the_healthcheck_passes_only_with_every_gpus_sensors_and_every_pair(gpu_check):
    def m(metric, subject, value=1.0):
        return {"metric": metric, "subject": subject, "value": value}

    full = {"measurements": [m("gemm_bf16_gflops", "device", 9e5)]
            + [m(k, f"gpu:GPU-{g}") for g in range(2) for k in ("burn_clock_share", "burn_power_w")]
            + [m("p2p_gbs", f"gpu:{i}->gpu:{j}", 300.0) for i in range(2) for j in range(2) if i != j]}
    assert gpu_check.judge_health(full, 2) == []
    no_nvml = {"measurements": full["measurements"][:1] + full["measurements"][-2:],
               "skipped": [{"check": "gpu: clocks, temperature, power and throttle reasons under load",
                            "reason": "skipped: NVML unavailable"}]}
    misses = gpu_check.judge_health(no_nvml, 2)
    assert any("0 of 2 GPUs" in x and "NVML unavailable" in x for x in misses)
    one_pair = {"measurements": full["measurements"][:-1]}
    assert gpu_check.judge_health(one_pair, 2) == ["P2P bandwidth for 1 of 2 GPU pairs"]
    assert gpu_check.judge_health({}, 1)  # an empty document never passes
