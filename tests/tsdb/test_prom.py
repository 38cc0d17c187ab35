"""``prom://`` without a server: URLs, errors, and the whole path through an in-memory TSDB
(sink → protobuf → PromQL answers → materialised store → the same diagnosis)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow.compute as pc
import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.cli.main import main
from argus.errors import TsdbError
from argus.tsdb import PromClient, RemoteWriteConfig, RemoteWriteSink, WindowJob, materialize, parse_prom_url
from argus.tsdb.promql import is_prom_url
from argus.tsdb.remote_write import decompress
from tests.tsdb.conftest import free_port
from tests.tsdb.test_remote_write import WriteRequest


def test_prom_urls_parse_with_defaults_and_prefixes():
    u = parse_prom_url("prom://tsdb:8481/select/0/prometheus/?job=llm&run=r1&start=10&lookback=30d")
    assert (u.base, u.job, u.run, u.attempt, u.start_s, u.lookback_s) == (
        "http://tsdb:8481/select/0/prometheus", "llm", "r1", None, 10.0, 30 * 86400.0)
    assert parse_prom_url("prom+https://h?job=j").base == "https://h"
    assert is_prom_url("prom://h:1?job=j") and not is_prom_url("store-dir") and not is_prom_url("s3://b/p")


@pytest.mark.parametrize("url,message", [
    ("prom://h:9090", "job label is required"),
    ("prom://h:9090?job=j&rank=3", "unknown parameter"),
    ("prom://h:x?job=j", "bad port"),
    ("prom://?job=j", "no host"),
    ("prom://h?job=j&start=yesterday", "not Unix seconds"),
    ("prom://h?job=j&lookback=7 days", "bad duration"),
])
def test_bad_prom_urls_say_what_is_wrong(url, message):
    with pytest.raises(TsdbError, match=message):
        parse_prom_url(url)


def test_an_unreachable_server_is_a_clear_cli_error(capsys):
    assert main(["diagnose", f"prom://127.0.0.1:{free_port()}?job=argus", "--no-store"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Prometheus API" in err and "Traceback" not in err


class MemoryTsdb(PromClient):
    """Decodes remote-write bodies into memory and answers instant range-selector queries
    as Prometheus 2 does (both ends of the range included)."""

    def __init__(self):
        super().__init__("http://memory", chunk_s=600.0)
        self.series: dict[tuple, list[tuple[int, float]]] = {}

    def post(self, body: bytes) -> tuple[int, str]:
        msg = WriteRequest()
        msg.ParseFromString(decompress(body))
        for ts in msg.timeseries:
            key = tuple((lab.name, lab.value) for lab in ts.labels)
            self.series.setdefault(key, []).extend((s.timestamp, s.value) for s in ts.samples)
        return 204, ""

    def query(self, expr: str, at_s: float) -> dict:
        name, matchers, range_ms = re.fullmatch(r"(\w+)\{(.*)\}\[(\d+)ms\]", expr).groups()
        want = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', matchers))
        hi = round(at_s * 1000)
        out = []
        for key, samples in self.series.items():
            labels = dict(key)
            if labels["__name__"] == name and all(labels.get(k) == v for k, v in want.items()):
                values = [[t / 1000, repr(v)] for t, v in samples if hi - int(range_ms) <= t <= hi]
                if values:
                    out.append({"metric": labels, "values": values})
        return {"resultType": "matrix", "result": out}


def test_the_diagnosis_survives_the_round_trip_through_a_tsdb(simulated, tmp_path):
    """Windows of a simulated store sent by a real sink, read back through PromQL answers:
    the same incidents, and every per-step phase total within a nanosecond or two."""
    attempt, truth = simulated("compute_straggler", ranks=16, steps=15, kernels=False)
    tsdb = MemoryTsdb()
    sink = RemoteWriteSink(RemoteWriteConfig(url="http://memory/api/v1/write", job="llm"), post=tsdb.post).start()
    topo = attempt.topology()
    for w in range(3):
        lo, hi = 5 * w, 5 * w + 4

        def in_window(table: str, col: str = "step", lo: int = lo, hi: int = hi):
            return attempt.read(table, filter=(pc.field(col) >= lo) & (pc.field(col) <= hi))

        sink.submit(WindowJob(run_id="job-1", attempt_id="0", host="node-0000", layout=attempt.layout,
                              ranks={r: (str(topo.hosts[r]), int(topo.local_ranks[r]), str(topo.gpu_uuids[r]))
                                     for r in range(16)}, window=w, start_step=lo, end_step=hi,
                              steps=in_window("steps"), phases=in_window("phases"),
                              summaries=in_window("kernel_summaries", "start_step")))
    sink.close()
    assert sink.stats()["windows_sent"] == 3 and not sink.stats()["dropped"]

    back = materialize(parse_prom_url("prom://memory?job=llm"), tmp_path / "prom-store", client=tsdb)
    assert back.identity.run_id == "job-1" and str(back.layout) == str(attempt.layout)
    config = DiagnoseConfig(store_incidents=False)
    found = lambda a: sorted((i.klass, tuple(i.culprit_ranks)) for i in diagnose(a, config).incidents)  # noqa: E731
    assert found(back) == found(attempt) and found(back)[0][0] == truth["class"]
    q = "SELECT rank, step, name, count(*) AS n, sum(dur_ns)::BIGINT AS t FROM phases GROUP BY ALL ORDER BY ALL"
    a, b = attempt.sql(q).to_pylist(), back.sql(q).to_pylist()
    assert [(r["rank"], r["step"], r["name"], r["n"]) for r in a] == [(r["rank"], r["step"], r["name"], r["n"])
                                                                         for r in b]
    assert np.abs(np.array([r["t"] for r in a]) - np.array([r["t"] for r in b])).max() <= 2


def test_no_data_for_the_job_names_the_label_to_check():
    with pytest.raises(TsdbError, match="no Argus series for job=nobody"):
        materialize("prom://memory?job=nobody", "/nonexistent", client=MemoryTsdb())
