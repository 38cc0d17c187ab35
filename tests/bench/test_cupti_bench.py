"""``argus bench cupti`` and the GPU bench's options, through the CLI as a user calls them."""

from __future__ import annotations

import json

import pytest

from argus.cli.main import main


def test_bench_cupti_prints_both_parses_side_by_side(capsys):
    assert main(["bench", "cupti", "--records", "600", "--distinct", "5", "--repeats", "1"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["bench"] == "cupti" and row["records"] == 600  # the run checked both parses agree
    assert row["per_record_us"] > 0 and row["vectorised_us"] > 0
    assert row["speedup"] == pytest.approx(row["per_record_us"] / row["vectorised_us"], rel=0.02)


def test_bench_cupti_refuses_an_empty_run(capsys):
    assert main(["bench", "cupti", "--records", "0"]) == 2
    assert "must be ≥ 1" in capsys.readouterr().err


def test_gpu_overhead_takes_its_options(capsys):
    """``scripts/gpu_check.py`` calls ``argus bench gpu-overhead --steps N --repeats 2``: the
    options reach the bench (they once stopped at the CLI as unrecognised), which on a machine
    without CUDA says so and exits 2."""
    pytest.importorskip("torch")
    assert main(["bench", "gpu-overhead", "--steps", "3", "--repeats", "2"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
