"""Every PromQL of the Grafana dashboard and of the alert rules, run against a real
Prometheus holding a simulated straggler job streamed through a real processor's
remote-write sink; the rule file passes ``promtool check rules``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from argus.dashboards import PANELS, RULES, alert_rules_yaml, dashboard, substitute, write_all
from argus.sim import SimConfig, simulate_to_store
from argus.sim.run import prepare
from tests.tsdb.conftest import prometheus, wait_for  # noqa: F401 (the server fixture)
from tests.tsdb.feed import Feeder
from tests.shortdir import short_dir

JOB = "argus-dash"


def _query_range(base: str, expr: str, start: float, end: float) -> dict:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 30})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=30) as r:
        return json.loads(r.read())


def _load(prometheus, tmp_path_factory, scenario: str, ranks: int):  # noqa: F811
    root = tmp_path_factory.mktemp("dash")
    run_id = f"dash-{scenario}-{time.time_ns()}"
    config = SimConfig(ranks=ranks, steps=20, run_id=run_id, seed=2)
    _, ctx, _, _ = prepare(config, scenario)
    sock = short_dir("argus-dash-") / "p.sock"
    proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(root / "P"), "--socket",
                             str(sock), "--host", "proc-0", "--no-fsync", "--no-stacks", "--no-host-counters", "--no-evidence",
                             "--remote-write", prometheus.write_url, "--remote-write-job", JOB],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: sock.exists() or proc.poll() is not None, 30, "the processor socket")
    feeder = Feeder(sock, run_id, ctx.layout, ctx.topology)
    simulate_to_store(config, scenario, root / "S", on_step=feeder.step, baseline=False)
    feeder.close()
    proc.terminate()
    assert proc.wait(60) == 0, proc.stderr.read()
    now = time.time()
    span = (now - 3600, now + 3 * 3600)  # simulated steps are stamped from "now" onwards
    expected = config.ranks * config.steps
    wait_for(lambda: _sum(prometheus.base, f'count_over_time(argus_step{{job="{JOB}"}}[4h])', span[1]) >= expected,
             20, "every step in Prometheus")
    return prometheus.base, run_id, span


@pytest.fixture(scope="module")
def loaded(prometheus, tmp_path_factory):  # noqa: F811
    return _load(prometheus, tmp_path_factory, "compute_straggler", 16)


@pytest.fixture(scope="module")
def loaded_link(prometheus, tmp_path_factory):  # noqa: F811
    return _load(prometheus, tmp_path_factory, "link_degradation", 32)


def _fired(base: str, run_id: str, start: float, end: float) -> set[str]:
    fired = set()
    for rule in RULES:
        doc = _query_range(base, rule.expr, start, end)
        assert doc["status"] == "success", (rule.name, doc)
        if any(s["metric"].get("run") == run_id for s in doc["data"]["result"]):
            fired.add(rule.name)
    return fired


def _sum(base: str, expr: str, at: float) -> float:
    q = urllib.parse.urlencode({"query": f"sum({expr})", "time": at})
    with urllib.request.urlopen(f"{base}/api/v1/query?{q}", timeout=30) as r:
        res = json.loads(r.read())["data"]["result"]
    return float(res[0]["value"][1]) if res else 0.0


def test_every_panel_query_runs_and_the_main_ones_have_data(loaded):
    base, run_id, (start, end) = loaded
    empty = []
    for panel in PANELS:
        for _legend, expr in panel.exprs:
            doc = _query_range(base, substitute(expr, JOB, run_id, ".*"), start, end)
            assert doc["status"] == "success", (panel.title, expr, doc)
            if not doc["data"]["result"]:
                empty.append(panel.title)
    # the simulator sends no PCIe/temperature telemetry for a healthy host and drops nothing
    assert set(empty) <= {"Hardware: SM clock, temperature", "Records dropped by processors"}, empty


def test_straggler_ratio_panel_sees_the_straggler(loaded):
    base, run_id, (start, end) = loaded
    (ratio,) = [e for p in PANELS if p.title.startswith("Straggler ratio") for _, e in p.exprs]
    doc = _query_range(base, substitute(ratio, JOB, run_id), start, end)
    peak = max(float(v) for s in doc["data"]["result"] for _, v in s["values"])
    assert peak > 1.5  # one TP group's attention runs factor× slower


def test_alert_rules_parse_run_and_the_straggler_rule_fires(loaded, tmp_path):
    base, run_id, (start, end) = loaded
    promtool = shutil.which("promtool")
    if promtool is not None:
        rules = tmp_path / "argus-alerts.yml"
        rules.write_text(alert_rules_yaml())
        done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
        assert done.returncode == 0 and f"{len(RULES)} rules found" in done.stdout, done.stdout + done.stderr
    fired = _fired(base, run_id, start, end)
    assert "ArgusStraggler" in fired
    assert not fired & {"ArgusStepNeverFinished", "ArgusRankLost", "ArgusLinkDegraded"}


def test_the_link_rule_fires_on_a_degraded_link_and_not_the_straggler_rule(loaded_link):
    base, run_id, (start, end) = loaded_link
    fired = _fired(base, run_id, start, end)
    assert "ArgusLinkDegraded" in fired and "ArgusStraggler" not in fired, fired


def test_dashboard_json_is_provisioning_ready(tmp_path):
    d = dashboard()
    assert d["uid"] and d["panels"] and {v["name"] for v in d["templating"]["list"]} >= {"job", "run", "phase"}
    assert all(p["targets"] and p["gridPos"]["w"] <= 24 for p in d["panels"])
    assert 'ALERTS{alertname=~"Argus.*"' in d["annotations"]["list"][0]["expr"]
    files = write_all(tmp_path, "http://127.0.0.1:9090")
    assert {p.name for p in files} >= {"argus-training.json", "argus-alerts.yml"}
    json.loads((tmp_path / "grafana/dashboards/argus-training.json").read_text())
