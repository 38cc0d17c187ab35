"""Continuous analysis with real notification endpoints: a JSON webhook (a stdlib server in
the test) and a real Prometheus Alertmanager on 127.0.0.1 that routes to it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from argus.alerting import AlertmanagerSink, AnalysisService, WebhookSink, priority
from argus.sim import SimConfig, simulate_to_store
from argus.store import Store

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class _Hook:
    """A webhook receiver on 127.0.0.1 collecting POSTed JSON bodies by path."""

    def __init__(self):
        self.bodies: list[tuple[str, object]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                hook.bodies.append((self.path, json.loads(self.rfile.read(n) or b"null")))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def at(self, path: str) -> list:
        return [b for p, b in self.bodies if p == path]

    def close(self):
        self.server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hook():
    h = _Hook()
    yield h
    h.close()


@pytest.fixture
def alertmanager(tmp_path, hook):
    if ALERTMANAGER is None:
        pytest.skip("prometheus-alertmanager is not installed (.ci/run installs it)")
    port = _free_port()
    cfg = tmp_path / "am.yml"
    cfg.write_text(f"""
route: {{receiver: argus-hook, group_by: [incident], group_wait: 1s, group_interval: 1s, repeat_interval: 1h}}
receivers:
- name: argus-hook
  webhook_configs: [{{url: "{hook.url}/am", send_resolved: false}}]
""")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am-data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/-/ready", timeout=1)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(proc.stderr.read().decode()[-2000:])
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


def _am_alerts(url: str) -> list[dict]:
    return json.loads(urllib.request.urlopen(url + "/api/v2/alerts", timeout=5).read())


@pytest.fixture(scope="module")
def straggler_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("alerting") / "s"
    simulate_to_store(SimConfig(ranks=32, steps=15, seed=2), "compute_straggler", out)
    return out


def test_one_fault_is_one_alert_in_the_webhook_and_alertmanager(straggler_store, hook, alertmanager, tmp_path):
    store = tmp_path / "s"
    shutil.copytree(straggler_store, store)
    sinks = [WebhookSink(hook.url + "/argus"), AlertmanagerSink(alertmanager)]
    service = AnalysisService(store, sinks)
    c = service.cycle()
    assert c.analysed and not c.errors
    alerts = hook.at("/argus")
    assert len(alerts) == 1
    a = alerts[0]
    assert a["priority"] == "P1" and a["class"] == "compute_straggler"
    truth = json.loads((store / "truth.json").read_text())["faults"][0]
    assert a["culprit_ranks"] == truth["culprit_ranks"]
    # what to do, on whom, and at what price travel with the alert (issue 24)
    d = a["decision"]
    assert d["action"] == a["action"] and d["target"]["ranks"] == a["culprit_ranks"] and a["remedy"]
    assert d["loss_gpuh_per_h"] > 0 and d["action_cost_gpuh"] >= 0 and "restart_s" in d["basis"]["assumed"]
    am = _am_alerts(alertmanager)
    assert len(am) == 1 and am[0]["labels"]["priority"] == "P1" and am[0]["labels"]["incident"] == a["incident_id"]
    assert float(am[0]["annotations"]["loss_gpuh_per_h"]) == pytest.approx(d["loss_gpuh_per_h"])
    # Alertmanager routes it on to its receiver
    for _ in range(100):
        if hook.at("/am"):
            break
        time.sleep(0.1)
    routed = hook.at("/am")
    assert routed and routed[0]["alerts"][0]["labels"]["class"] == "compute_straggler"
    # nothing changed: no new alert anywhere; Alertmanager's alert is kept alive
    c2 = service.cycle()
    assert not c2.analysed and not c2.sent
    assert len(hook.at("/argus")) == 1 and len(_am_alerts(alertmanager)) == 1
    # a restarted service remembers what it sent, and stores each incident once
    c3 = AnalysisService(store, sinks).cycle()
    assert c3.analysed and c3.sent == [] and c3.new_incidents == []
    ids = Store.open(store).attempt().read("incidents", columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted(set(ids)) and a["incident_id"] in ids


def test_a_failed_webhook_is_retried_next_cycle(straggler_store, tmp_path):
    store = tmp_path / "s"
    shutil.copytree(straggler_store, store)
    dead = f"http://127.0.0.1:{_free_port()}/hook"  # nothing listens there
    service = AnalysisService(store, [WebhookSink(dead, timeout_s=1)])
    c = service.cycle()
    assert c.errors and not c.sent
    h = _Hook()
    try:
        service.sinks = [WebhookSink(h.url + "/hook")]
        c2 = service.cycle()
        assert c2.analysed and len(c2.sent) == 1 and len(h.at("/hook")) == 1
    finally:
        h.close()


def test_watch_follows_a_restarted_job_and_a_hang_is_p0(tmp_path, hook):
    store = tmp_path / "s"
    simulate_to_store(SimConfig(ranks=16, steps=12, seed=1), "healthy", store)
    seen = []
    stop = threading.Event()
    service = AnalysisService(store, [WebhookSink(hook.url + "/argus")])
    t = threading.Thread(target=service.run, args=(0.2, stop, seen.append), daemon=True)
    t.start()
    try:
        for _ in range(100):
            if any(c.analysed for c in seen):
                break
            time.sleep(0.1)
        assert not hook.at("/argus")  # a healthy job raises nothing
        # the job is restarted and hangs: a new run appears in the same store
        simulate_to_store(SimConfig(ranks=16, steps=12, seed=1), "hang", tmp_path / "h")
        run = next((tmp_path / "h" / "runs").iterdir())
        shutil.copytree(run, store / "runs" / run.name)
        for _ in range(300):
            if hook.at("/argus"):
                break
            time.sleep(0.1)
    finally:
        stop.set()
        t.join(30)
    alerts = hook.at("/argus")
    assert [a["priority"] for a in alerts] == ["P0"] and alerts[0]["class"] == "hang"


@pytest.mark.parametrize("incident,expected", [
    ({"class": "hang", "severity": "critical"}, "P0"),
    ({"class": "fail_stop", "severity": "critical", "impact": {"slowdown_pct": 100.0}}, "P0"),  # the job's log
    ({"class": "fail_stop", "severity": "info"}, "P0"),  # a stopped job pages whatever the grade says
    ({"class": "link_degradation", "severity": "warning", "impact": {"slowdown_pct": 3.0}}, "P1"),
    ({"class": "compute_straggler", "severity": "critical", "impact": {"slowdown_pct": 38.0}}, "P1"),
    ({"class": "host_stall", "severity": "warning", "impact": {"slowdown_pct": 4.0}}, "P2"),
    ({"class": "compute_straggler", "severity": "info", "impact": {"slowdown_pct": 0.5}}, None),
    ({"class": "input_imbalance", "severity": "warning"}, None),
    # wrong values, not slow ones: no slowdown to grade, and they spread to every checkpoint
    ({"class": "silent_data_corruption", "state": "confirmed", "severity": "critical",
      "impact": {"slowdown_pct": None}}, "P0"),
    ({"class": "silent_data_corruption", "state": "suspected", "severity": "warning"}, "P1"),
])
def test_priorities(incident, expected):
    assert priority(incident) == expected
