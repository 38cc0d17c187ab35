"""``argus bench sdc`` through the CLI as a user calls it: every sensor measured, and the
healthy bench model's every GEMM passes its check (the bench raises otherwise)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from argus.cli.main import main


def test_the_bench_measures_each_sensor(capsys):
    assert main(["bench", "sdc", "--steps", "4", "--model", "tiny", "--every", "5"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["bench"] == "sdc" and row["sdc_every"] == 5 and row["linear_layers"] > 1
    for key in ("grads_digest_pct", "params_digest_pct", "gemm_check_one_layer_pct", "gemm_check_all_layers_pct"):
        assert row[key] > 0
    assert row["default_total_pct"] == pytest.approx(row["per_checked_step_pct"] / 5, abs=1e-3)
    assert main(["bench", "sdc", "--steps", "1"]) == 2
