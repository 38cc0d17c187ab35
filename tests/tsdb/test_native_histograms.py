"""Kernel sketches as Prometheus native histograms: the hand-written encoding decodes with
Prometheus' message definitions, and a real Prometheus (native histograms enabled) answers
``histogram_count`` / ``histogram_quantile`` as the stored sketch does."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

from argus.compress import LogSketch
from argus.compress.summarize import sketch_from_row
from argus.sim import SimConfig, simulate_to_store
from argus.sim.run import prepare
from argus.store import Store
from argus.tsdb.remote_write import encode_histogram_series, encode_labels
from tests.tsdb.conftest import Server, _server, wait_for
from tests.tsdb.feed import Feeder
from tests.tsdb.test_remote_write import WriteRequest
from tests.shortdir import short_dir


def _decode_buckets(h) -> tuple[list[int], list[int]]:
    buckets, counts, idx, c = [], [], None, 0
    deltas = iter(h.positive_deltas)
    for span in h.positive_spans:
        idx = span.offset if idx is None else idx + span.offset
        for _ in range(span.length):
            c += next(deltas)
            buckets.append(idx)
            counts.append(c)
            idx += 1
    return buckets, counts


def test_histogram_encoding_decodes_with_prometheus_definitions():
    values = np.r_[np.full(50, 0.0), np.random.default_rng(1).lognormal(0, 2, 2000)]  # negative buckets too
    sk = LogSketch.from_values(values)
    labels = encode_labels([("__name__", "argus_kernel_duration_nanoseconds"), ("kernel", "gemm")])
    body = encode_histogram_series(labels, 1_700_000_000_123, sk.schema, sk.count, sk.zero_count, sk.sum,
                                   sk.buckets, sk.counts)
    msg = WriteRequest.FromString(body)
    (series,) = msg.timeseries
    assert {(lab.name, lab.value) for lab in series.labels} == {("__name__", "argus_kernel_duration_nanoseconds"),
                                                                ("kernel", "gemm")}
    (h,) = series.histograms
    assert (h.count_int, h.zero_count_int, h.schema, h.timestamp) == (sk.count, 50, sk.schema, 1_700_000_000_123)
    assert h.sum == pytest.approx(sk.sum)
    buckets, counts = _decode_buckets(h)
    assert buckets == sk.buckets.tolist() and counts == sk.counts.tolist()
    assert min(buckets) < 0 < max(buckets)


@pytest.fixture(scope="module")
def prometheus_nh(tmp_path_factory):
    server = _server("prometheus", tmp_path_factory)
    base_args = server._args

    def args() -> list[str]:
        return [*base_args(), "--enable-feature=native-histograms"]

    server._args = args  # type: ignore[method-assign]
    server.start()
    yield server
    server.stop()


def _query(base: str, expr: str, at: float) -> list:
    q = urllib.parse.urlencode({"query": expr, "time": at})
    with urllib.request.urlopen(f"{base}/api/v1/query?{q}", timeout=30) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _range(base: str, query: str) -> list:
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{query}", timeout=30) as r:
        doc = json.loads(r.read())
    return [p for series in doc["data"]["result"] for p in series["values"]]


def test_prometheus_answers_like_the_stored_sketch(prometheus_nh: Server, tmp_path):
    run_id = f"nh-{time.time_ns()}"
    config = SimConfig(ranks=8, steps=10, run_id=run_id, seed=3)
    _, ctx, _, _ = prepare(config, "healthy")
    sock = short_dir("argus-nh-") / "p.sock"
    proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(tmp_path / "P"), "--socket",
                             str(sock), "--host", "proc-0", "--no-fsync", "--no-stacks", "--no-host-counters", "--no-evidence",
                             "--remote-write", prometheus_nh.write_url, "--remote-write-native-histograms"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: sock.exists() or proc.poll() is not None, 30, "the processor socket")
    feeder = Feeder(sock, run_id, ctx.layout, ctx.topology)
    simulate_to_store(config, "healthy", tmp_path / "S", on_step=feeder.step, baseline=False)
    feeder.close()
    proc.terminate()
    assert proc.wait(60) == 0, proc.stderr.read()
    status = json.loads((tmp_path / "P" / "processors" / "proc-0.json").read_text())["remote_write"][0]
    assert status["dropped"] == {} and status["windows_sent"] >= 2, status
    rows = Store.open(tmp_path / "P").attempt().read("kernel_sketches").to_pylist()
    row = max((r for r in rows if r["rank"] == 0), key=lambda r: r["count"])
    sketch = sketch_from_row(row)
    sel = (f'argus_kernel_duration_nanoseconds{{run="{run_id}", rank="0", kernel="{row["kernel"]}", '
           f'stream="{row["stream"]}"}}')
    # the last window's histogram, at the window's stamp (read from a float series stamped with
    # it); Prometheus 2.42 cannot take last_over_time() of native histograms
    windows = sorted({r["window"] for r in rows if r["rank"] == 0 and r["kernel"] == row["kernel"]
                      and r["stream"] == row["stream"]})
    last = next(r for r in rows if r["rank"] == 0 and r["kernel"] == row["kernel"] and r["stream"] == row["stream"]
                and r["window"] == windows[-1])
    now = time.time()
    stamp = urllib.parse.urlencode({"query": f'timestamp(argus_window_end_step{{run="{run_id}", rank="0"}} == '
                                             f'{last["end_step"]})', "start": now - 3600, "end": now + 3 * 3600,
                                    "step": 10})
    at = max(float(v) for _, v in wait_for(lambda: _range(prometheus_nh.base, stamp), 20, "the window's stamp"))
    count = _query(prometheus_nh.base, f"histogram_count({sel})", at)
    assert count and float(count[0]["value"][1]) == last["count"]
    for quant in (0.5, 0.9, 0.99):
        got = float(_query(prometheus_nh.base, f"histogram_quantile({quant}, {sel})", at)[0]["value"][1])
        want = sketch_from_row(last).quantile(quant)
        assert got == pytest.approx(want, rel=0.03), (quant, got, want)
    assert sketch.count > 0
