"""A node that failed a health check stays out of service until a later check of it passes; the
re-admission is recorded with the check that granted it (the store's kept checks are the record)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from argus.healthcheck.records import save_health
from argus.healthcheck.standing import Standing, judged_nodes, node_standings


def _doc(host: str, at: float, verdicts: list[tuple[str, str, str]], **extra) -> dict:
    """A health document as ``argus healthcheck --json`` writes it: (metric, subject, status)."""
    return {"schema_version": 1, "host": host, "device": "cpu: test", "versions": {}, "started_s": at,
            "measurements": [], "verdicts": [{"level": "net", "metric": m, "subject": s, "status": st, "value": 1.0,
                                              "unit": "GB/s", "size_bytes": 0, "deficit": 0.3 if st == "fail" else 0.0}
                                             for m, s, st in verdicts], **extra}


def test_a_failed_node_stays_out_until_a_check_of_it_passes(tmp_path):
    save_health(tmp_path, _doc("a", 100.0, [("gemm_fp32_gflops", "device", "pass")]))
    save_health(tmp_path, _doc("a", 200.0, [("gemm_fp32_gflops", "device", "fail")]))
    save_health(tmp_path, _doc("a", 250.0, [("gemm_fp32_gflops", "device", "fail")]))  # still out, since 200
    save_health(tmp_path, _doc("a", 300.0, [("gemm_fp32_gflops", "device", "new")]))  # nothing compared: no verdict
    (a,) = node_standings(tmp_path)
    assert a.standing == Standing.OUT and a.out_since_s == 200.0 and a.failing == ["gemm_fp32_gflops device"]
    assert a.readmissions == [] and a.checks == 3
    save_health(tmp_path, _doc("a", 400.0, [("gemm_fp32_gflops", "device", "pass")]))
    (a,) = node_standings(tmp_path)
    assert a.standing == Standing.IN and a.readmissions == [(200.0, 400.0)] and a.failing == []
    assert a.to_json()["readmissions"] == [{"failed_s": 200.0, "readmitted_s": 400.0}]


def test_a_net_check_judges_each_host_it_names_and_the_hosts_of_its_ranks():
    doc = _doc("rank0-host", 10.0, [("host_links_busbw_gbs", "host:b", "fail"), ("host_links_busbw_gbs", "host:c", "pass"),
                                    ("gemm_fp32_gflops", "rank:2", "fail"), ("gemm_fp32_gflops", "rank:0", "pass"),
                                    ("all_reduce_busbw_gbs", "ranks:0-3", "fail"), ("link_busbw_gbs", "link:b~c", "fail")],
               rank_hosts=["rank0-host", "b", "d", "c"])
    assert judged_nodes(doc) == {"b": ["host_links_busbw_gbs host:b"], "c": [], "d": ["gemm_fp32_gflops rank:2"],
                                 "rank0-host": []}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "argus", "healthcheck", *args], capture_output=True, text=True,
                          timeout=120)


def test_standing_exits_one_while_a_node_is_out(tmp_path):
    from argus.store import Store

    root = Store.create(tmp_path / "s").root
    save_health(root, _doc("a", 100.0, [("gemm_fp32_gflops", "device", "fail")]))
    save_health(root, _doc("b", 100.0, [("gemm_fp32_gflops", "device", "pass")]))
    out = _cli("--store", str(root), "--standing", "--json")
    assert out.returncode == 1, out.stderr
    nodes = {n["host"]: n["standing"] for n in json.loads(out.stdout)["nodes"]}
    assert nodes == {"a": "out", "b": "in"}
    assert _cli("--store", str(root), "--standing", "--host", "b").returncode == 0
    assert _cli("--store", str(root), "--standing", "--host", "a").returncode == 1
    missing = _cli("--store", str(root), "--standing", "--host", "zz")
    assert missing.returncode == 2 and "zz" in missing.stderr
    assert _cli("--standing").returncode == 2  # no store to read


@pytest.mark.serial  # it measures the CPU's matrix products twice and compares them: never beside other tests
def test_a_real_check_kept_in_a_store_re_admits_a_node_that_had_failed(tmp_path):
    """The node failed a check before (kept in the store); this real check (the CPU's matrix
    products, judged against nothing: new) … judges nothing, so it stays out; one judged against
    a baseline that passes re-admits it, and says so."""
    from argus.store import Store

    root = Store.create(tmp_path / "s").root
    env_host = "node-under-test"
    save_health(root, _doc(env_host, 1.0, [("gemm_fp32_gflops", "device", "fail")]))
    base = ["--level", "gpu", "--seconds", "0.1", "--baseline-dir", str(tmp_path / "b"), "--store", str(root)]
    run = lambda *a: subprocess.run([sys.executable, "-m", "argus", "healthcheck", *base, *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=300,
                                    env={**__import__("os").environ, "ARGUS_HOST": env_host})
    first = run("--save-baseline", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["standing"][0]["standing"] == "out"  # nothing compared: still out
    second = run("--threshold", "0.9")  # against the baseline just saved, a generous threshold: passes
    assert second.returncode == 0, second.stdout + second.stderr
    assert "re-admitted" in second.stdout
    (node,) = node_standings(root)
    assert node.standing == Standing.IN and len(node.readmissions) == 1 and node.readmissions[0][0] == 1.0
