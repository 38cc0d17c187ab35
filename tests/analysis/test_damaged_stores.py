"""Diagnosis on what a crash (or a careless hand) leaves of a store: gaps, lost tables, huge
step numbers, no topology, corrupt pages, half-written windows, a read-only store. Each must
give a diagnosis — the injected straggler where its windows survive — and say what is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.sim import SimConfig, simulate_to_store
from argus.store import Store, WindowData, WindowWriter, conform


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("pristine") / "s"
    res = simulate_to_store(SimConfig(ranks=8, steps=20, seed=0), "compute_straggler", out, baseline=False)
    culprits = sorted(res.truth["faults"][0]["culprit_ranks"])
    return out, culprits


@pytest.fixture()
def store(pristine, tmp_path):
    src, culprits = pristine
    dst = tmp_path / "s"
    shutil.copytree(src, dst)
    attempt = Store.open(dst).attempt()
    return attempt, culprits


def _culprits(d) -> list[list[int]]:
    return [sorted(i.culprit_ranks) for i in d.incidents if i.klass == "compute_straggler"]


def _window_files(attempt, steps: range) -> list[Path]:
    return [f for t in ("steps", "phases", "stacks", "hw", "kernels") if (attempt.path / t).exists()
            for f in (attempt.path / t / "sim").iterdir() if int(f.name.split("-")[0]) in steps]


def test_a_gap_of_several_windows_still_finds_the_straggler(store):
    attempt, culprits = store
    for f in _window_files(attempt, range(5, 13)):  # what a processor killed for a while leaves
        f.unlink()
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert culprits in _culprits(d)
    assert [(w.lo, w.hi) for w in d.windows] == [(0, 4), (10, 14), (15, 19)]  # none over the gap alone


def test_a_store_without_phases_diagnoses_and_says_so(store):
    attempt, _ = store
    shutil.rmtree(attempt.path / "phases")
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert d.skipped_windows and any("no phases" in line for line in d.missing)
    assert d.document()["missing"] == d.missing


def test_a_step_number_near_2_63_costs_one_window_not_a_range(store):
    attempt, culprits = store
    big = 2**63 - 1
    w = attempt.writer("evil")
    r = np.arange(8)
    w.write("steps", {"rank": r, "step": np.full(8, big), "start_ns": r, "end_ns": r + 10}, window=0)
    w.write("phases", {"rank": r, "step": np.full(8, big), "microbatch": np.full(8, -1), "name": ["x"] * 8,
                       "category": ["compute"] * 8, "group_kind": [""] * 8, "start_ns": r, "dur_ns": np.full(8, 5),
                       "wait_ns": np.full(8, -1)}, window=0)
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert len(d.windows) <= 5 and d.windows[-1].hi == big
    assert culprits in _culprits(d)


def test_without_topology_no_host_action_is_recommended(store):
    attempt, culprits = store
    shutil.rmtree(attempt.path / "topology")
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    inc = [i for i in d.incidents if sorted(i.culprit_ranks) == culprits]
    assert inc and all(i.action != "cordon_node" for i in d.incidents)
    assert "host is unknown" in inc[0].summary


def test_a_read_only_store_keeps_its_diagnosis(store):
    attempt, culprits = store
    (attempt.path / "incidents").write_text("")  # cannot become a directory: writing incidents fails
    d = diagnose(attempt, DiagnoseConfig())
    assert culprits in _culprits(d)
    assert d.store_note.startswith("incidents not stored") and d.document()["incidents_stored"] is False


def test_a_file_with_corrupt_pages_is_set_aside_and_named(store):
    attempt, culprits = store
    victim = sorted((attempt.path / "phases" / "sim").iterdir())[2]
    data = bytearray(victim.read_bytes())
    for i in range(8, len(data) // 2, 7):  # the data pages; the footer stays intact
        data[i] ^= 0x5A
    victim.write_bytes(bytes(data))
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert any(victim.name in line for line in d.missing)
    assert culprits in _culprits(d)


def test_an_uncommitted_window_is_invisible_and_counted(store):
    attempt, _ = store
    unit = WindowWriter(attempt, "host-x").writer.unit(window=20)
    r = np.arange(8)
    unit.write("steps", conform("steps", {"rank": r, "step": np.full(8, 20), "start_ns": r, "end_ns": r + 1}))
    # killed here: phases and the commit record never written
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert int(d.l1.steps.max()) == 19
    assert any("never committed" in line for line in d.missing)


def test_the_window_writer_round_trip_diagnoses_like_the_simulator(store):
    """Windows written as committed units read back like the simulator's single files."""
    attempt, _ = store
    before = attempt.read("steps").num_rows
    r = np.arange(8)
    WindowWriter(attempt, "host-x").write(WindowData(20, 20, 20, steps=conform(
        "steps", {"rank": r, "step": np.full(8, 20), "start_ns": r, "end_ns": r + 10**9})))
    assert attempt.read("steps").num_rows == before + 8


def test_info_sets_a_file_with_corrupt_pages_aside_and_names_it(store):
    import subprocess
    import sys

    attempt, _ = store
    victim = sorted((attempt.path / "steps" / "sim").iterdir())[2]
    data = bytearray(victim.read_bytes())
    for i in range(8, len(data) // 2, 7):
        data[i] ^= 0x5A
    victim.write_bytes(bytes(data))
    out = subprocess.run([sys.executable, "-m", "argus", "info", str(attempt.path.parents[2])], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "median" in out.stdout
    assert "skipped" in out.stdout and victim.name in out.stdout


def test_rows_of_no_rank_of_the_layout_are_left_out(store):
    attempt, culprits = store
    bad = np.array([-1, attempt.layout.world_size, 10**6], dtype=np.int32)
    zeros = np.zeros(3, np.int64)
    attempt.writer("foreign").write("steps", {"rank": bad, "step": zeros, "start_ns": zeros, "end_ns": zeros + 5},
                                    window=0)
    attempt = Store.open(attempt.path.parents[2]).attempt()
    ranks = attempt.read("steps", columns=["rank"]).column("rank").to_numpy()
    assert ranks.min() >= 0 and ranks.max() < attempt.layout.world_size
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert culprits in _culprits(d)
