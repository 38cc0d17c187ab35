"""A health check's figures and the nodes' standing reach a real Prometheus and VictoriaMetrics
(remote write on 127.0.0.1), where an alert can page on ``argus_node_in_service == 0``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from argus.dashboards import RULES
from argus.healthcheck.export import health_series, health_write_request
from argus.tsdb.promql import PromClient
from argus.tsdb.sink import post_once
from tests.tsdb.conftest import wait_for


def _value(server, expr: str, at: float) -> float | None:
    with contextlib.suppress(OSError):
        urllib.request.urlopen(f"{server.base}/internal/force_flush", timeout=10).read()
    result = PromClient(server.base).query(expr, at)["result"]
    return float(result[0]["value"][1]) if result else None


def _failing_doc(at: float) -> dict:
    return {"host": "rank0", "started_s": at, "rank_hosts": ["rank0", "slow-node"], "verdicts": [
        {"level": "net", "metric": "host_links_busbw_gbs", "subject": "host:slow-node", "value": 0.2, "unit": "GB/s",
         "size_bytes": 1 << 20, "status": "fail", "deficit": 0.8},
        {"level": "net", "metric": "host_links_busbw_gbs", "subject": "host:rank0", "value": 1.0, "unit": "GB/s",
         "size_bytes": 1 << 20, "status": "pass", "deficit": 0.0}]}


def test_series_of_a_check():
    series = {(lab["__name__"], lab.get("subject", lab.get("host"))): v for lab, v in health_series(_failing_doc(1.0))}
    assert series[("argus_node_in_service", "slow-node")] == 0.0 and series[("argus_node_in_service", "rank0")] == 1.0
    assert series[("argus_health_pass", "host:slow-node")] == 0.0
    assert series[("argus_health_deficit", "host:slow-node")] == 0.8


@pytest.mark.parametrize("server_name", ["victoria", "prometheus"])
def test_a_failed_node_is_out_of_service_in_the_tsdb(server_name, request):
    server = request.getfixturevalue(server_name)
    at = time.time() - 5
    status, text = post_once(server.write_url, health_write_request(_failing_doc(at)))
    assert 200 <= status < 300, text
    got = wait_for(lambda: _value(server, 'argus_node_in_service{host="slow-node"} == 0', at + 1) is not None, 30,
                   "the standing to be queryable")
    assert got
    assert _value(server, 'argus_node_in_service{host="rank0"}', at + 1) == 1.0
    assert _value(server, 'argus_health_deficit{subject="host:slow-node"}', at + 1) == pytest.approx(0.8)
    # the shipped alert rule: the failed node, and only it
    (rule,) = [r for r in RULES if r.name == "ArgusNodeOutOfService"]
    fired = PromClient(server.base).query(rule.expr, at + 1)["result"]
    assert [s["metric"]["host"] for s in fired] == ["slow-node"]


def test_the_cli_sends_a_real_check(victoria, tmp_path):
    """The first check has nothing to compare with (no baseline, no peers): its figures are sent,
    but no standing — never "in service" on nothing; the second, against that baseline, is."""
    env = {**os.environ, "ARGUS_HOST": "cli-node"}
    cmd = [sys.executable, "-m", "argus", "healthcheck", "--level", "gpu", "--seconds", "0.1", "--baseline-dir",
           str(tmp_path / "b"), "--store", str(tmp_path / "s"), "--remote-write", victoria.write_url]
    first = subprocess.run([*cmd, "--save-baseline"], capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    out = subprocess.run([*cmd, "--threshold", "0.9"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "remote write" not in out.stderr  # no failure said
    now = time.time()
    assert wait_for(lambda: _value(victoria, 'argus_node_in_service{host="cli-node"}', now) is not None, 30,
                    "the node's standing")
    assert _value(victoria, 'argus_node_in_service{host="cli-node"}', now) == 1.0
    assert _value(victoria, 'count(argus_health_value{host="cli-node",metric="gemm_fp32_gflops"})', now) == 1.0
    # an endpoint that refuses: said on stderr, the verdict (exit code) stands
    # (a baseline directory of its own: nothing to compare with, so the verdict is "new", exit 0,
    # whatever the machine's load does to the figures)
    bad = subprocess.run([sys.executable, "-m", "argus", "healthcheck", "--level", "gpu", "--seconds", "0.1",
                          "--baseline-dir", str(tmp_path / "none"), "--remote-write", "http://127.0.0.1:9/api/v1/write"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 0 and "remote write to http://127.0.0.1:9/api/v1/write failed" in bad.stderr
