"""Writing a simulation to a store: a window's kernels kept on disk until it closes (what lets the
simulator write 100,000-rank jobs on a machine of 24 GB) give the summaries kept in memory give."""

from __future__ import annotations

import pyarrow.parquet as pq

import argus.sim.run as run
from argus.sim import SimConfig, simulate_to_store


def _tables(root, table):
    return [pq.read_table(f) for f in sorted((root / "runs").glob(f"*/0/{table}/sim/*.parquet"))]


def test_kernels_spilled_to_disk_summarise_as_those_held_in_memory(tmp_path, monkeypatch):
    config = SimConfig(ranks=64, steps=7, seed=2)
    simulate_to_store(config, "compute_straggler", tmp_path / "memory", baseline=False)
    monkeypatch.setattr(run, "SPILL_EVENTS", 0)  # every step spilled …
    whole = run._write_summaries
    # … and summarised 5 ranks at a time: each block a slice of every step
    monkeypatch.setattr(run, "_write_summaries", lambda *a, **k: whole(*a, **k, ranks_per_block=5))
    simulate_to_store(config, "compute_straggler", tmp_path / "disk", baseline=False)
    for table in ("kernel_summaries", "kernel_sketches"):
        held, spilled = _tables(tmp_path / "memory", table), _tables(tmp_path / "disk", table)
        assert len(held) == 2 and len(spilled) == 2  # windows 0–4 and 5–6
        assert all(a.equals(b) for a, b in zip(held, spilled))
        assert held[0].num_rows > 0
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["argus-store.json", "runs", "truth.json"]


def test_a_failed_simulation_leaves_no_spilled_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "SPILL_EVENTS", 0)

    def fail(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(run, "_write_summaries", fail)
    try:
        simulate_to_store(SimConfig(ranks=64, steps=6, seed=2), "compute_straggler", tmp_path / "s", baseline=False)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failure was not raised")
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".argus-sim-spill")]
