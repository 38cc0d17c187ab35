"""The sink never blocks its caller, retries what can succeed, and counts every drop."""

from __future__ import annotations

import http.server
import threading
import time

import pyarrow as pa
import pytest

from argus.errors import ConfigError
from argus.topology import parse_layout
from argus.tsdb import RemoteWriteConfig, RemoteWriteSink, WindowJob
from argus.tsdb.remote_write import decompress
from tests.tsdb.conftest import free_port, wait_for

NOW_NS = 1_800_000_000_000_000_000


def _job(window: int, run: str = "r") -> WindowJob:
    steps = [window * 2, window * 2 + 1]
    rows = {"rank": [0, 1, 0, 1], "step": [steps[0], steps[0], steps[1], steps[1]],
            "start_ns": [s * 10**9 for s in (steps[0], steps[0], steps[1], steps[1])]}
    rows["end_ns"] = [s + 9 * 10**8 for s in rows["start_ns"]]
    return WindowJob(run_id=run, attempt_id="0", host="h", layout=parse_layout("dp=2", world_size=2),
                     ranks={0: ("h", 0, "GPU-0"), 1: ("h", 1, "GPU-1")}, window=window, start_step=steps[0],
                     end_step=steps[1], steps=pa.table(rows))


def _sink(post, **cfg) -> RemoteWriteSink:
    config = RemoteWriteConfig(url="http://127.0.0.1:1/api/v1/write", backoff_s=0.01, max_backoff_s=0.02, **cfg)
    return RemoteWriteSink(config, post=post, wall_ns=lambda: NOW_NS).start()


def test_transient_errors_are_retried_with_backoff():
    answers = iter([(503, "busy"), (0, ""), (429, "slow down"), (204, "")])

    def post(body):
        status, text = next(answers)
        if status == 0:
            raise ConnectionRefusedError("refused")
        return status, text

    sink = _sink(post)
    sink.submit(_job(0))
    sink.close()
    stats = sink.stats()
    assert stats["retries"] == 3 and stats["windows_sent"] == 1 and stats["dropped"] == {}
    assert stats["samples_sent"] > 0 and stats["bytes_sent"] < stats["bytes_uncompressed"]
    assert sink.take_drops(("r", "0")) == []


def test_a_refused_body_is_dropped_at_once_and_counted():
    calls = []

    def post(body):
        calls.append(body)
        return 400, "out of bounds"

    sink = _sink(post)
    sink.submit(_job(3))
    sink.close()
    assert len(calls) == 1 and sink.stats()["retries"] == 0
    (window, samples, batches, reason), = sink.take_drops(("r", "0"))
    assert (window, batches, reason) == (3, 1, "tsdb_rejected") and samples > 0
    assert "HTTP 400: out of bounds" in sink.stats()["last_error"]


def test_a_full_queue_drops_the_oldest_window_without_blocking():
    release, busy = threading.Event(), threading.Event()
    sent_windows = []

    def post(body):
        busy.set()
        release.wait(10)
        sent_windows.append(body)
        return 204, ""

    sink = _sink(post, queue_windows=2)
    sink.submit(_job(0))
    assert busy.wait(5)  # the sender is stuck on window 0
    t0 = time.perf_counter()
    accepted = [sink.submit(_job(w)) for w in range(1, 5)]
    assert time.perf_counter() - t0 < 0.05  # never blocks the processor
    assert accepted == [True, True, False, False]
    release.set()
    sink.close()
    drops = sink.take_drops(("r", "0"))
    assert [(w, r) for w, _, _, r in drops] == [(1, "tsdb_queue_full"), (2, "tsdb_queue_full")]
    assert sink.stats()["windows_sent"] == 3 and sink.stats()["dropped_windows"] == 2


def test_a_dead_tsdb_costs_bounded_attempts_and_close_keeps_its_deadline():
    def post(body):
        raise ConnectionRefusedError("refused")

    sink = _sink(post, max_attempts=3)
    sink.submit(_job(0))
    wait_for(lambda: sink.stats()["failed_requests"] == 1, 5, "the request to be given up")
    assert sink.stats()["retries"] == 2
    for w in range(1, 40):
        sink.submit(_job(w))
    t0 = time.monotonic()
    sink.close(timeout_s=0.3)
    assert time.monotonic() - t0 < 3
    reasons = {r for _, _, _, r in sink.take_drops(("r", "0"))}
    assert reasons <= {"tsdb_unreachable", "tsdb_queue_full"} and "tsdb_unreachable" in reasons


def test_samples_older_than_their_series_last_one_are_skipped_and_counted():
    """A TSDB refuses a whole request for one out-of-order sample: those are left out."""
    bodies = []
    sink = _sink(lambda body: (bodies.append(body), (204, ""))[1])
    for window, ts in ((0, 5 * 10**9), (1, 4 * 10**9)):  # the second sample is older than the first
        job = _job(window)
        job.hw = pa.table({"rank": [0], "gpu_uuid": ["GPU-0"], "ts_ns": [ts], "metric": ["power_w"],
                           "value": [300.0]})
        sink.submit(job)
    sink.close()
    (window, stale, _, reason), = sink.take_drops(("r", "0"))
    assert (window, stale, reason) == (1, 1, "tsdb_out_of_order") and sink.stats()["windows_sent"] == 2


class _Handler(http.server.BaseHTTPRequestHandler):
    statuses: list[int] = []
    bodies: list[bytes] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.headers["Content-Encoding"] == "snappy"
        type(self).bodies.append(decompress(body))
        status = type(self).statuses.pop(0) if type(self).statuses else 204
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_real_http_posts_snappy_and_retries_5xx():
    _Handler.statuses, _Handler.bodies = [500], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        config = RemoteWriteConfig(url=f"http://127.0.0.1:{server.server_port}/api/v1/write", backoff_s=0.01)
        with RemoteWriteSink(config) as sink:
            for w in range(3):
                sink.submit(_job(w))
        assert sink.stats()["windows_sent"] == 3 and sink.stats()["retries"] == 1
        assert len(_Handler.bodies) == 4 and b"argus_step_duration_seconds" in _Handler.bodies[-1]
    finally:
        server.shutdown()


@pytest.mark.parametrize("url", ["localhost:8428", "ftp://h/api/v1/write", "http:///api/v1/write",
                                 "http://h:port/api/v1/write"])
def test_bad_urls_are_config_errors(url):
    with pytest.raises(ConfigError, match="remote-write URL"):
        RemoteWriteConfig(url=url)
