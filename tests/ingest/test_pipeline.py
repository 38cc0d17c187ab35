"""A closed window is one record through the store, TSDB and evidence exporters, and the
store and compression packages no longer import each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from argus.ingest import ClosedWindow, RankPlace, StoreExporter, TsdbExporter, WrittenWindow, summarize, window_job, write_window
from argus.store import Store, WindowData, WindowWriter, conform
from argus.topology import RunIdentity, Topology, parse_layout

ROOT = Path(__file__).resolve().parents[2]


def _kernels(n: int = 40) -> pa.Table:
    rng = np.random.default_rng(0)
    return conform("kernels", {
        "rank": np.repeat([0, 1], n // 2).astype(np.int32), "step": np.zeros(n, np.int64),
        "kind": ["kernel"] * n, "device": np.zeros(n, np.int16), "stream": np.full(n, 7, np.int32),
        "name": ["gemm", "nccl:all_reduce"] * (n // 2), "start_ns": np.arange(n, dtype=np.int64) * 1000,
        "dur_ns": rng.integers(100, 1000, n).astype(np.int64)})


def _steps() -> pa.Table:
    return conform("steps", {"rank": [0, 1], "step": [0, 0], "start_ns": [0, 0], "end_ns": [10**9, 10**9]})


def _attempt(tmp_path: Path, world: int = 2):
    store = Store.create(tmp_path / "store")
    return store.open_or_create_attempt(RunIdentity("job", "0"), parse_layout(f"dp={world}", world_size=world),
                                        source="processor")


def _closed(attempt, data: WindowData) -> ClosedWindow:
    return ClosedWindow(run=attempt.identity, host="node-0", layout=attempt.layout, data=data,
                        ranks={0: RankPlace("node-0", 0, "GPU-0"), 1: RankPlace("node-0", 1, "GPU-1")})


def _imports(package: str) -> set[str]:
    """Every ``argus.*`` module a package's source imports, at any depth of the code."""
    found = set()
    for path in (ROOT / "argus" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("argus.")}


def test_the_store_does_not_import_the_compression_which_imports_the_store():
    assert not any(m.startswith("argus.compress") for m in _imports("store"))
    assert any(m.startswith("argus.store") for m in _imports("compress"))  # the one direction left
    code = "import sys, argus.store; assert not [m for m in sys.modules if m.startswith('argus.compress')]"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_store_exporter_writes_what_write_window_writes(tmp_path):
    data = WindowData(window=0, start_step=0, end_step=0, steps=_steps(), kernels=_kernels())
    a = _attempt(tmp_path / "a")
    written = write_window(WindowWriter(a, "node-0", durable=False), data)
    b = _attempt(tmp_path / "b")
    closed = _closed(b, data)
    closed.topology_rows = Topology.uniform(b.layout, 8).rows(np.array([0, 1]))
    StoreExporter(b, "node-0", durable=False).export(closed)
    assert closed.rows == written.rows == {"steps": 2, "kernel_summaries": closed.summaries.summaries.num_rows,
                                           "kernel_sketches": closed.summaries.sketches.num_rows}
    for table in ("steps", "kernel_summaries", "kernel_sketches"):
        assert a.read(table).equals(b.read(table))
    assert b.read("topology").num_rows == 2 and not a.files("topology")


def test_without_summaries_the_store_keeps_no_kernel_rows_unless_raw(tmp_path):
    attempt = _attempt(tmp_path)
    stats = WindowWriter(attempt, "node-0", durable=False).write(WindowData(0, 0, 0, kernels=_kernels()))
    assert stats.kernel_events == 40 and stats.rows == {}
    assert summarize(WindowData(0, 0, 0)) is None


def test_the_tsdb_job_is_derived_from_the_closed_window(tmp_path):
    attempt = _attempt(tmp_path)
    data = WindowData(window=3, start_step=15, end_step=19, steps=_steps(), kernels=_kernels())
    closed = _closed(attempt, data)
    closed.summaries = summarize(data)
    job = window_job(closed)
    assert job.key == ("job", "0") and job.host == "node-0" and job.layout == attempt.layout
    assert (job.window, job.start_step, job.end_step) == (3, 15, 19)
    assert job.ranks == {0: ("node-0", 0, "GPU-0"), 1: ("node-0", 1, "GPU-1")}
    assert job.steps is data.steps and job.summaries is closed.summaries.summaries
    assert job.sketches is closed.summaries.sketches


def test_the_tsdb_exporter_submits_to_every_sink_and_records_their_drops(tmp_path):
    attempt = _attempt(tmp_path)
    partition = attempt.writer("node-0", durable=False)

    class Sink:
        def __init__(self):
            self.jobs, self.closed = [], None

        def submit(self, job):
            self.jobs.append(job)

        def take_drops(self, key):
            return [(job.window, 5, 1, "queue_full") for job in self.jobs] if key == ("job", "0") else []

        def close(self, timeout_s):
            self.closed = timeout_s

    sinks = [Sink(), Sink()]
    exporter = TsdbExporter(sinks, "node-0", lambda: {("job", "0"): partition}, flush_s=2.5)
    exporter.export(_closed(attempt, WindowData(window=1, start_step=5, end_step=9)))
    exporter.close()
    assert [len(s.jobs) for s in sinks] == [1, 1] and [s.closed for s in sinks] == [2.5, 2.5]
    drops = attempt.read("drops").to_pylist()
    assert {(d["window"], d["table"], d["events"], d["reason"]) for d in drops} == {(1, "remote_write", 5, "queue_full")}


def test_a_written_window_answers_with_the_ack_document(tmp_path):
    attempt = _attempt(tmp_path)
    closed = _closed(attempt, WindowData(window=2, start_step=10, end_step=14))
    closed.rows = {"steps": 2}
    done = WrittenWindow.of(closed, written=True)
    assert done.ack() == {"window": 2, "start_step": 10, "end_step": 14, "rows": {"steps": 2}}
    assert done.ranks == {0, 1} and done.key == ("job", "0")
    failed = WrittenWindow.of(closed, written=False)
    assert failed.rows is None and not failed.ranks
