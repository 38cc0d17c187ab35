"""Crash-consistent windows: a window's files are visible together or not at all, leftovers of
a killed writer are cleaned by their own partition's writer, and damaged attempt metadata is a
clear StoreError, never a hang or a traceback."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from argus.errors import StoreError
from argus.store import STALE_LEFTOVER_S, Store, WindowData, WindowWriter
from argus.store.commit import COMMITS_DIR, clean_leftovers
from argus.topology import RunIdentity, Topology, parse_layout


def _steps(n_ranks: int, step: int) -> dict:
    r = np.arange(n_ranks)
    return {"rank": r, "step": np.full(n_ranks, step), "start_ns": r * 10, "end_ns": r * 10 + 5}


def _phases(n_ranks: int, step: int) -> dict:
    r = np.arange(n_ranks)
    return {"rank": r, "step": np.full(n_ranks, step), "microbatch": np.zeros(n_ranks), "name": ["fwd"] * n_ranks,
            "category": ["compute"] * n_ranks, "group_kind": [""] * n_ranks, "start_ns": r * 10,
            "dur_ns": np.full(n_ranks, 5), "wait_ns": np.full(n_ranks, -1)}


@pytest.fixture()
def attempt(tmp_path):
    store = Store.create(tmp_path / "s")
    topo = Topology.uniform(parse_layout("dp=8"), gpus_per_host=4)
    return store.create_attempt(RunIdentity("run-a"), topo, source="test")


def test_a_window_is_invisible_until_its_commit_record_exists(attempt):
    unit = attempt.writer("host-a").unit(window=3)
    unit.write("steps", _steps(8, 3))
    unit.write("phases", _phases(8, 3))
    assert attempt.read("steps").num_rows == 0 and attempt.read("phases").num_rows == 0
    assert attempt.read("phase_totals").num_rows == 0  # the phases' aggregates, committed with them
    assert attempt.uncommitted["steps"] == 1
    unit.commit()
    assert attempt.read("steps").num_rows == 8 and attempt.read("phases").num_rows == 8
    totals = attempt.read("phase_totals").num_rows
    assert totals > 0
    record = json.loads((attempt.path / COMMITS_DIR / "host-a" / f"{unit.stem}.json").read_text())
    assert record["tables"] == {"steps": 8, "phases": 8, "phase_totals": totals}


def test_window_writer_commits_every_table_of_the_window_together(attempt):
    WindowWriter(attempt, "host-a").write(WindowData(0, 0, 0, steps=attempt_table("steps", _steps(8, 0)),
                                                     phases=attempt_table("phases", _phases(8, 0))))
    stems = {p.stem for t in ("steps", "phases") for p in (attempt.path / t / "host-a").iterdir()}
    assert len(stems) == 1 and next(iter(stems)).split("-")[1].startswith("u")  # one unit, two files
    assert attempt.read("steps").num_rows == attempt.read("phases").num_rows == 8


def attempt_table(table, cols):
    from argus.store import conform

    return conform(table, cols)


def test_files_without_a_unit_id_are_visible_as_before(attempt):
    """Compatibility: every file written before commits existed is a single-file unit."""
    attempt.writer("old").write("steps", _steps(8, 0), window=0)
    assert not (attempt.path / COMMITS_DIR).exists()
    assert attempt.read("steps").num_rows == 8


def test_stale_leftovers_of_its_own_partition_are_cleaned_when_a_writer_starts(attempt):
    unit = attempt.writer("host-a").unit(window=1)
    orphan = unit.write("steps", _steps(8, 1))  # never committed: its writer was killed
    tmp = orphan.parent / ".tmp-deadbeef-000000002-u00000000.parquet"
    tmp.write_bytes(b"PAR1 half a file")
    young = attempt.writer("host-a").unit(window=2).write("steps", _steps(8, 2))  # a live writer's window
    other = attempt.path / "steps" / "host-b" / ".tmp-cafebabe-000000001-x.parquet"
    other.parent.mkdir()
    other.write_bytes(b"another host's write in flight")
    old = time.time() - STALE_LEFTOVER_S - 60
    for p in (orphan, tmp, other):
        os.utime(p, (old, old))
    attempt.writer("host-a")  # a restarted writer of that partition
    assert not orphan.exists() and not tmp.exists()
    assert young.exists()  # younger than the grace: may be another live process's window
    assert other.exists()  # other partitions belong to other writers
    assert clean_leftovers(attempt.path, "host-a", ["steps"], older_than_s=0.0) == 1 and not young.exists()


_KILLED_WRITER = """
import sys, numpy as np
from argus.store import Store, WindowData, WindowWriter, conform
a = Store.open(sys.argv[1]).attempt()
w = WindowWriter(a, "crashy", durable=False)
n = 200_000
for step in range(10_000):
    r = np.arange(n) % 8
    cols = {"rank": r, "step": np.full(n, step), "start_ns": np.arange(n), "end_ns": np.arange(n) + 1}
    ph = {**cols, "microbatch": np.zeros(n), "name": ["f"] * n, "category": ["compute"] * n, "group_kind": [""] * n,
          "dur_ns": np.ones(n), "wait_ns": np.full(n, -1)}
    del ph["end_ns"]
    w.write(WindowData(step, step, step, steps=conform("steps", cols), phases=conform("phases", ph)))
    print(step, flush=True)
"""


def test_a_writer_killed_mid_window_leaves_only_whole_windows(tmp_path, attempt):
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path / "s")], stdout=subprocess.PIPE,
                            text=True)
    for _ in range(3):
        proc.stdout.readline()
    kills = 0
    deadline = time.monotonic() + 60
    while not kills and time.monotonic() < deadline:  # stop it; kill it if it is inside a window, else go on
        proc.send_signal(signal.SIGSTOP)
        units = [p for p in (attempt.path / "steps" / "crashy").iterdir() if not p.name.startswith(".")]
        if len(units) > len(list((attempt.path / COMMITS_DIR / "crashy").iterdir())):
            proc.send_signal(signal.SIGKILL)
            kills = 1
        else:
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.002)
    if not kills:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps = attempt.read("steps", columns=["step"]).column("step").to_numpy()
    phases = attempt.read("phases", columns=["step"]).column("step").to_numpy()
    assert len(steps) >= 3 * 200_000
    assert sorted(set(steps.tolist())) == sorted(set(phases.tolist()))  # no window half visible
    assert np.bincount(steps).tolist() == np.bincount(phases).tolist()
    assert not kills or attempt.uncommitted["steps"] == 1  # it was killed inside a window, which stays hidden


def _break_meta(attempt, content: bytes | None):
    meta = attempt.path / "attempt.json"
    meta.unlink()
    if content is not None:
        meta.write_bytes(content)


@pytest.mark.parametrize("content, message", [
    (None, "attempt.json: missing"),
    (b"", "unreadable attempt metadata"),
    (b'{"run_id": "run-a", "attempt_id": "0", "layo', "unreadable attempt metadata"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"run_id": 7, "attempt_id": "0", "layout": "dp=8"}', "lacks 'run_id'"),
    (b'{"run_id": "run-a", "attempt_id": "0", "layout": "zz=8"}', "invalid attempt layout"),
    (b'{"run_id": "run-b", "attempt_id": "0", "layout": "dp=8"}', "foreign attempt metadata"),
    (b"[" * 100_000, "unreadable attempt metadata"),
])
def test_damaged_attempt_metadata_is_a_store_error_naming_the_file(tmp_path, attempt, content, message):
    _break_meta(attempt, content)
    store = Store.open(tmp_path / "s")
    assert store.attempts() == [] and list(store.damaged) == [attempt.path]
    with pytest.raises(StoreError, match=message):
        store.attempt()
    with pytest.raises(StoreError, match=message):  # a processor reopening it gets a refusal, not a crash
        store.open_or_create_attempt(RunIdentity("run-a"), parse_layout("dp=8"), source="test")


def test_a_damaged_attempt_does_not_hide_the_others(tmp_path, attempt):
    store = Store.open(tmp_path / "s")
    store.create_attempt(RunIdentity("run-a", "1"), Topology.uniform(parse_layout("dp=8"), gpus_per_host=4), "test")
    _break_meta(attempt, b"{")
    assert store.attempt().identity.attempt_id == "1"


def test_fifos_in_the_store_are_never_opened(tmp_path, attempt):
    attempt.writer("h").write("steps", _steps(8, 0), window=0)
    os.mkfifo(attempt.path / "steps" / "h" / "000000001-deadbeef.parquet")
    assert attempt.read("steps").num_rows == 8
    assert any("not a regular file" in d.reason for d in attempt.damage)
    _break_meta(attempt, None)
    os.mkfifo(attempt.path / "attempt.json")
    with pytest.raises(StoreError, match="not a regular file"):
        Store.open(tmp_path / "s").attempt()
    (tmp_path / "s" / "argus-store.json").unlink()
    os.mkfifo(tmp_path / "s" / "argus-store.json")
    with pytest.raises(StoreError, match="not a regular file"):
        Store.open(tmp_path / "s")
