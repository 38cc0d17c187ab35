"""Watching the watcher, for real: a Prometheus evaluating Argus's absence rules and sending to a
real Alertmanager, fed by real processors. Killing a host's processor, breaking its remote-write
endpoint, and silencing every rank of a job each page within the rule's delay; restoring each
resolves the alert. (Thresholds of seconds instead of minutes, evaluated every second.)"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from argus.dashboards import alert_rules_yaml, watcher_rules
from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import DTYPES
from tests.tsdb.conftest import Server, free_port, wait_for
from tests.shortdir import short_dir

SILENT_S = 6  # both rules' thresholds here (90 s and 300 s in production)
HEARTBEAT_S = 1
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@dataclass
class RulingPrometheus(Server):
    """A Prometheus that evaluates the watcher rules every second and sends to ``alertmanager``."""

    alertmanager: str = ""

    def _args(self) -> list[str]:
        args = super()._args()
        rules = self.data.parent / "watcher-rules.yml"
        rules.write_text(alert_rules_yaml(watcher_rules(SILENT_S, SILENT_S), interval="1s"))
        config = self.data.parent / f"{self.data.name}.yml"
        config.write_text(f"global:\n  scrape_interval: 1h\n  evaluation_interval: 1s\nrule_files: [{rules}]\n"
                          f"alerting:\n  alertmanagers:\n  - static_configs:\n    - targets: ['{self.alertmanager}']\n")
        return args


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    prom_bin = shutil.which("prometheus")
    if prom_bin is None or ALERTMANAGER is None:
        pytest.skip("prometheus and prometheus-alertmanager are not installed (.ci/run installs them)")
    root = tmp_path_factory.mktemp("watcher")
    am_port = free_port()
    cfg = root / "am.yml"
    cfg.write_text("route: {receiver: none, group_by: [alertname, host, run], group_wait: 0s, "
                   "group_interval: 1s, repeat_interval: 1h}\nreceivers:\n- name: none\n")
    am = subprocess.Popen([ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={root / 'am-data'}",
                           f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    am_url = f"http://127.0.0.1:{am_port}"
    wait_for(lambda: _ok(am_url + "/-/ready"), 30, "alertmanager")
    prom = RulingPrometheus("prometheus", prom_bin, root / "data", alertmanager=f"127.0.0.1:{am_port}").start()
    yield prom, am_url, root
    prom.stop()
    am.terminate()
    am.wait(10)


def _ok(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


def _paged(am_url: str, alert: str, **labels: str) -> bool:
    """Whether Alertmanager holds ``alert`` with ``labels`` active (not resolved)."""
    got = json.loads(urllib.request.urlopen(am_url + "/api/v2/alerts?active=true&silenced=false", timeout=5).read())
    return any(a["labels"].get("alertname") == alert and a["status"]["state"] == "active"
               and all(a["labels"].get(k) == v for k, v in labels.items()) for a in got)


class _Gate:
    """A remote-write endpoint in front of Prometheus that can be broken (503) and restored."""

    def __init__(self, target: str):
        self.broken = False
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if gate.broken:
                    self.send_response(503)
                    self.end_headers()
                    return
                req = urllib.request.Request(target, data=body, method="POST",
                                             headers={k: v for k, v in self.headers.items()
                                                      if k.lower().startswith(("content-", "x-prometheus"))})
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        self.send_response(r.status)
                except urllib.error.HTTPError as exc:
                    self.send_response(exc.code)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"

    def close(self) -> None:
        self.server.shutdown()


def _processor(root: Path, host: str, write_url: str) -> tuple[subprocess.Popen, Path]:
    sock = short_dir("argus-w-") / "p.sock"
    proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(root / f"store-{host}"),
                             "--socket", str(sock), "--host", host, "--no-fsync", "--no-stacks", "--no-evidence",
                             "--remote-write", write_url, "--remote-write-job", "argus-watch",
                             "--remote-write-heartbeat", str(HEARTBEAT_S)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: sock.exists() or proc.poll() is not None, 30, "the processor socket")
    return proc, sock


def _timed(predicate, limit: float, what: str) -> float:
    t0 = time.monotonic()
    wait_for(predicate, limit, what, interval=0.25)
    return time.monotonic() - t0


#: The delay a page may take past the rule's threshold: a heartbeat interval, an evaluation, the
#: notification (and this machine's load)
SLACK_S = 12


def test_a_killed_processor_pages_and_its_restart_resolves(stack):
    prom, am_url, root = stack
    proc, _ = _processor(root, "node-kill", prom.write_url)
    try:
        time.sleep(3 * HEARTBEAT_S)
        assert not _paged(am_url, "ArgusProcessorSilent", host="node-kill")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        took = _timed(lambda: _paged(am_url, "ArgusProcessorSilent", host="node-kill"), SILENT_S + SLACK_S + 10,
                      "the page for the killed processor")
        assert took <= SILENT_S + SLACK_S
        proc, _ = _processor(root, "node-kill", prom.write_url)
        _timed(lambda: not _paged(am_url, "ArgusProcessorSilent", host="node-kill"), 30, "the page to resolve")
    finally:
        proc.kill()
        proc.wait()


def test_a_broken_remote_write_endpoint_pages_and_its_repair_resolves(stack):
    prom, am_url, root = stack
    gate = _Gate(prom.write_url)
    proc, _ = _processor(root, "node-gate", gate.url)
    try:
        time.sleep(3 * HEARTBEAT_S)
        assert not _paged(am_url, "ArgusProcessorSilent", host="node-gate")
        gate.broken = True
        took = _timed(lambda: _paged(am_url, "ArgusProcessorSilent", host="node-gate"), SILENT_S + SLACK_S + 10,
                      "the page for the broken endpoint")
        assert took <= SILENT_S + SLACK_S
        gate.broken = False
        _timed(lambda: not _paged(am_url, "ArgusProcessorSilent", host="node-gate"), 30, "the page to resolve")
    finally:
        proc.terminate()
        proc.wait(30)
        gate.close()


def _steps(client: ProcessorClient, first: int, n: int) -> None:
    rows = np.zeros(n, DTYPES[Msg.STEPS])
    now = time.time_ns()
    rows["step"] = np.arange(first, first + n)
    rows["start_ns"] = now - (n - np.arange(n)) * 10_000_000
    rows["end_ns"] = rows["start_ns"] + 9_000_000
    client.send(Msg.STEPS, rows)
    client.flush(first + n)


def test_a_job_whose_every_rank_went_silent_pages_and_resolves_when_it_steps_again(stack):
    prom, am_url, root = stack
    proc, sock = _processor(root, "node-job", prom.write_url)
    run = f"silent-{os.getpid()}"
    clients = [ProcessorClient(sock, {"run_id": run, "attempt_id": "0", "rank": r, "world_size": 2, "local_rank": r,
                                      "gpu_uuid": "", "layout": "dp=2", "pid": os.getpid()}).connect(retries=50)
               for r in range(2)]
    try:
        for c in clients:
            _steps(c, 0, 3)
        time.sleep(3 * HEARTBEAT_S)
        assert not _paged(am_url, "ArgusJobSilent", run=run)
        took = _timed(lambda: _paged(am_url, "ArgusJobSilent", run=run), SILENT_S + SLACK_S + 10,
                      "the page for the silent job")  # connected, and no step since
        assert took <= SILENT_S + SLACK_S
        for c in clients:
            _steps(c, 3, 2)
        _timed(lambda: not _paged(am_url, "ArgusJobSilent", run=run), 30, "the page to resolve")
    finally:
        for c in clients:
            c.close()
        proc.terminate()
        proc.wait(30)
