import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from argus.errors import StoreError
from argus.store import MANIFEST, SCHEMA_VERSION, TABLES, Store, conform
from argus.store.schema import render_markdown
from argus.topology import RunIdentity, Topology, parse_layout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _steps(n_ranks: int, step: int) -> dict:
    r = np.arange(n_ranks)
    return {"rank": r, "step": np.full(n_ranks, step), "start_ns": r * 10, "end_ns": r * 10 + 5}


@pytest.fixture()
def attempt(tmp_path):
    store = Store.create(tmp_path / "s")
    topo = Topology.uniform(parse_layout("tp=2,pp=2", world_size=8), gpus_per_host=4)
    return store.create_attempt(RunIdentity("run-a"), topo, source="test")


def test_round_trip_with_step_filter_and_duckdb_views(attempt):
    w = attempt.writer("host-a")
    for step in range(5):
        w.write("steps", _steps(8, step), window=step)
    assert attempt.read("steps").num_rows == 40
    part = attempt.read("steps", steps=(1, 2), columns=["step"])
    assert sorted(set(part.column("step").to_pylist())) == [1, 2]
    assert attempt.sql("SELECT count(*) AS n FROM steps WHERE step >= 3").column("n")[0].as_py() == 16
    assert attempt.sql("SELECT count(*) AS n FROM phases").column("n")[0].as_py() == 0  # empty view
    assert attempt.topology().hosts.tolist() == ["node-0000"] * 4 + ["node-0001"] * 4
    assert attempt.stats()["steps"].rows == 40


def test_strings_read_as_dictionaries_hold_the_same_values(attempt):
    """``dictionaries``: the named string columns come back dictionary-encoded (L3 reads a
    window's kernel names so), with the values, nulls, filter and columns of a plain read."""
    w = attempt.writer("host-a")
    for step in range(3):
        n = 6
        w.write("hw", {"rank": np.arange(n) % 4, "gpu_uuid": [f"g{i % 2}" for i in range(n)],
                       "ts_ns": np.arange(n) + 100 * step, "metric": ["sm_clock", "temp", None, "temp", "sm_clock", "x"],
                       "value": np.arange(n, dtype=np.float64)}, window=step)
    flt = pc.field("ts_ns") >= 100
    plain = attempt.read("hw", columns=["rank", "metric"], filter=flt)
    coded = attempt.read("hw", columns=["rank", "metric"], filter=flt, dictionaries=("metric", "gpu_uuid"))
    assert pa.types.is_dictionary(coded.schema.field("metric").type)
    assert coded.column("metric").to_pylist() == plain.column("metric").to_pylist()
    assert None in plain.column("metric").to_pylist() and coded.num_rows == 12
    assert coded.column("rank").to_pylist() == plain.column("rank").to_pylist()


def test_a_step_range_reads_only_the_files_that_may_hold_it(attempt):
    """A window's views bind the files whose footer statistics reach its steps (a diagnosis
    queried every footer of the run once per window: half its CPU at 80 steps); a file spanning
    steps (kernel summaries: start_step..end_step) is kept for any step it spans, and what the
    query returns is what the whole table's view returns."""
    w = attempt.writer("host-a")
    for step in range(6):
        w.write("steps", _steps(8, step), window=step)
    w.write("steps", {**_steps(8, 0), "step": np.repeat([7, 9], 4)}, window=7)  # one file, steps 7 and 9
    assert len(attempt.files("steps")) == 7
    assert [f.name[:9] for f in attempt.files("steps", steps=(2, 3))] == ["000000002", "000000003"]
    assert [f.name[:9] for f in attempt.files("steps", steps=(8, 8))] == ["000000007"]  # 7..9 spans 8
    assert attempt.files("steps", steps=(10, 20)) == []
    query = "SELECT step, count(*) AS n FROM steps WHERE step BETWEEN 2 AND 8 GROUP BY step ORDER BY step"
    con = attempt.duckdb(tables=["steps"], steps=(2, 8))
    whole = [(r["step"], r["n"]) for r in attempt.sql(query).to_pylist()]
    assert con.sql(query).fetchall() == whole == [(2, 8), (3, 8), (4, 8), (5, 8), (7, 4)]
    assert attempt.duckdb(tables=["steps"], steps=(10, 20)).sql("SELECT count(*) FROM steps").fetchall() == [(0,)]
    summary = {"window": [0], "start_step": [0], "end_step": [4], "rank": [0], "stream": [7], "kernel": ["k"],
               "category": ["gemm"], "op": [""], "count": [1], "p50_ns": [1.0], "p99_ns": [1.0],
               "min_ns": [1.0], "max_ns": [1.0], "cluster": [0]}
    w.write("kernel_summaries", summary, window=0)
    assert len(attempt.files("kernel_summaries", steps=(3, 3))) == 1 and not attempt.files("kernel_summaries",
                                                                                           steps=(5, 9))


def test_queries_see_windows_written_after_the_first_and_each_thread_has_its_own_connection(attempt):
    """``sql`` keeps a DuckDB connection per thread (a connect costs ~15 ms a query): a window
    written after a query is in the next one, and threads never share a connection."""
    import threading

    w = attempt.writer("host-a")
    w.write("steps", _steps(8, 0), window=0)
    count = "SELECT count(*) AS n FROM steps"
    assert attempt.sql(count).column("n")[0].as_py() == 8
    w.write("steps", _steps(8, 1), window=1)
    assert attempt.sql(count).column("n")[0].as_py() == 16
    assert attempt._connection() is attempt._connection()
    seen = {}

    def query(i: int) -> None:
        seen[i] = (attempt.sql(count).column("n")[0].as_py(), id(attempt._connection()))

    threads = [threading.Thread(target=query, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [n for n, _ in seen.values()] == [16] * 4
    assert id(attempt._connection()) not in {c for _, c in seen.values()}
    assert "run-a" in repr(attempt) and str(attempt.path) in repr(attempt)


def test_several_writers_partition_by_host_and_read_merged(attempt):
    attempt.writer("host-a").write("steps", _steps(4, 0), window=0)
    attempt.writer("host-b").write("steps", {**_steps(4, 0), "rank": np.arange(4, 8)}, window=0)
    assert sorted(p.name for p in (attempt.path / "steps").iterdir()) == ["host-a", "host-b"]
    assert sorted(attempt.read("steps").column("rank").to_pylist()) == list(range(8))


def test_reopening_finds_the_latest_attempt(tmp_path, attempt):
    store = Store.open(tmp_path / "s")
    topo = Topology.uniform(parse_layout("dp=8"), gpus_per_host=8)
    store.create_attempt(RunIdentity("run-a", "1"), topo, source="test")
    assert [a.identity.attempt_id for a in store.attempts()] == ["0", "1"]
    assert store.attempt().identity.attempt_id == "1"
    assert store.attempt(attempt_id="0").layout == attempt.layout
    with pytest.raises(StoreError, match="no run attempt matching"):
        store.attempt(run_id="nope")


def test_refuses_to_write_into_a_foreign_non_empty_directory(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "precious.csv").write_text("keep me")
    with pytest.raises(StoreError, match="not empty and is not an Argus store"):
        Store.create(d)
    assert (d / "precious.csv").read_text() == "keep me"
    with pytest.raises(StoreError, match="not an Argus store"):
        Store.open(d)


def _damage(attempt) -> str:
    return " | ".join(d.reason for d in attempt.damage)


def test_foreign_text_file_is_skipped_named_and_kept(attempt):
    attempt.writer("h").write("steps", _steps(8, 0), window=0)
    stray = attempt.path / "steps" / "h" / "notes.txt"
    stray.write_text("hello")
    assert attempt.read("steps").num_rows == 8  # the good file still reads
    assert "notes.txt: foreign file" in _damage(attempt)
    with pytest.raises(StoreError, match="notes.txt: foreign file"):
        attempt.check()
    assert stray.exists()  # nothing is deleted


def test_foreign_parquet_and_misplaced_table_are_skipped_and_named(attempt):
    d = attempt.path / "steps" / "h"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), d / "other.parquet")
    assert attempt.read("steps").num_rows == 0
    assert "other.parquet: foreign Parquet file" in _damage(attempt)
    (d / "other.parquet").unlink()
    attempt.writer("h").write("hw", {"rank": [0], "gpu_uuid": ["g"], "ts_ns": [1], "metric": ["m"], "value": [1.0]},
                              window=0)
    hw_file = next((attempt.path / "hw" / "h").iterdir())
    os.replace(hw_file, d / hw_file.name)
    assert attempt.read("steps").num_rows == 0
    assert "file of table 'hw' found in table 'steps'" in _damage(attempt)


def test_truncated_file_is_skipped_named_and_other_files_still_read(attempt):
    w = attempt.writer("h")
    path = w.write("steps", _steps(8, 0), window=0)
    w.write("steps", _steps(8, 1), window=1)
    w.write("hw", {"rank": [0], "gpu_uuid": ["g"], "ts_ns": [1], "metric": ["m"], "value": [1.0]}, window=0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert attempt.read("steps").column("step").to_pylist() == [1] * 8
    assert f"{path.name}: unreadable Parquet file" in _damage(attempt)
    assert attempt.read("hw").num_rows == 1
    assert attempt.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py() == 8  # duckdb views skip it too


def test_newer_schema_version_is_refused(tmp_path, attempt):
    manifest = tmp_path / "s" / MANIFEST
    doc = json.loads(manifest.read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    manifest.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="upgrade|reads up to"):
        Store.open(tmp_path / "s")


def test_conform_names_missing_and_unknown_columns():
    with pytest.raises(StoreError, match=r"missing columns \['end_ns'\], unknown columns \['stop'\]"):
        conform("steps", {"rank": [0], "step": [0], "start_ns": [0], "stop": [1]})
    with pytest.raises(StoreError, match="unknown table"):
        conform("nope", {})


def test_files_are_never_overwritten_and_temp_leftovers_are_ignored(attempt):
    w = attempt.writer("h")
    path = w.write("steps", _steps(8, 0), window=0)
    (path.parent / ".tmp-deadbeef-000000000-crashed.parquet").write_bytes(b"PAR1 half a file")
    assert attempt.read("steps").num_rows == 8
    from argus.store.files import write_parquet_atomic

    with pytest.raises(StoreError, match="already exists"):
        write_parquet_atomic(path, conform("steps", _steps(8, 1)), "steps", "h")


_WRITER = """
import sys, numpy as np
from argus.store import Store
a = Store.open(sys.argv[1]).attempt()
w = a.writer("crashy", durable=False)
n = 400_000
for step in range(10_000):
    r = np.arange(n) % 8
    w.write("steps", {"rank": r, "step": np.full(n, step), "start_ns": np.arange(n), "end_ns": np.arange(n)}, window=step)
    print(step, flush=True)
"""


def test_a_writer_killed_mid_write_leaves_only_whole_files(tmp_path, attempt):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "s")], stdout=subprocess.PIPE, text=True)
    for _ in range(3):  # let it commit a few windows, then kill it in the middle of the next
        proc.stdout.readline()
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    table = attempt.read("steps")  # every visible file is whole and readable
    assert table.num_rows % 400_000 == 0 and table.num_rows >= 3 * 400_000


def test_store_reference_doc_is_generated_from_the_schemas():
    doc = open(os.path.join(ROOT, "docs", "store.md")).read()
    assert render_markdown() in doc
    for spec in TABLES.values():
        for name in spec.column_names:
            assert f"`{name}`" in doc


def test_many_processes_create_one_store_at_once(tmp_path):
    """Several hosts' processors start together on one shared store directory."""
    root = tmp_path / "shared"
    code = ("import sys; from argus.store import Store; Store.create(sys.argv[1]); print('ok')")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-300:] for o in outs]
    assert Store.open(root).manifest["schema_version"] == SCHEMA_VERSION


def _open_or_create_at(root: str, start: float, out) -> None:
    from argus.store import Store
    from argus.topology import RunIdentity, parse_layout

    while time.time() < start:
        pass
    try:
        att = Store.create(root).open_or_create_attempt(RunIdentity("run-x"), parse_layout("dp=6"), source="test")
        out.put(("ok", att.meta["run_id"]))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put(("error", repr(exc)))


def test_hosts_creating_one_attempt_at_once_all_open_it(tmp_path):
    """Six processors (one per host) sharing a store create the same attempt in the same
    instant: each one opens it, none sees a directory without its attempt.json."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    for trial in range(4):
        root = str(tmp_path / f"s{trial}")
        Store.create(root)
        out = ctx.Queue()
        start = time.time() + 2.0
        procs = [ctx.Process(target=_open_or_create_at, args=(root, start, out)) for _ in range(6)]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        assert results == [("ok", "run-x")] * 6, results
        run_dir = tmp_path / f"s{trial}" / "runs" / "run-x"
        assert [p.name for p in run_dir.iterdir()] == ["0"]  # no staged leftovers
