"""``argus healthcheck --level net`` across four network-namespace hosts, one link throttled
(``tc tbf``): the throttled host is named from its links against its peers, round by round, and
its links against the baseline saved before the throttle; with the throttle removed every host
passes again."""

from __future__ import annotations

import json

import pytest

from argus.workloads.netns import NamespaceCluster, available, launch_job

pytestmark = pytest.mark.serial  # measures bandwidth: alone on the machine


def _check(cluster: NamespaceCluster, base, *extra: str) -> dict:
    res = launch_job(cluster, "-m", ["argus", "healthcheck", "--level", "net", "--json", "--seconds", "0.4",
                                     "--sizes", "8,65536,1048576", "--baseline-dir", str(base), *extra],
                     timeout=300)
    # rank 0 reports; a verdict, never an error (nor a crash's exit 1)
    assert res[0].returncode in (0, 1) and res[0].stdout.strip(), res[0].stderr[-3000:]
    return json.loads(res[0].stdout)


def _hosts(doc: dict) -> dict[str, dict]:
    return {v["subject"]: v for v in doc["verdicts"] if v["metric"] == "host_links_busbw_gbs"}


def test_a_throttled_host_is_named_from_its_links_and_passes_once_the_throttle_is_gone(tmp_path):
    why = available()
    if why:
        pytest.skip(why)
    base = tmp_path / "base"
    with NamespaceCluster(4) as cluster:
        names = [f"host:{cluster.host_name(h)}" for h in range(4)]
        before = _check(cluster, base, "--save-baseline")
        assert sorted(_hosts(before)) == sorted(names)
        assert all(v["status"] == "pass" for v in _hosts(before).values()), _hosts(before)
        assert before["saved_baseline"]

        cluster.throttle(2, rate="100mbit", burst="512kbit", latency="400ms")
        slow = _check(cluster, base)
        hosts = _hosts(slow)
        # the throttled host alone, against its peers round by round: a healthy host that shares
        # one slow link with it is its victim, not named (its links to it are)
        assert {s for s, v in hosts.items() if v["status"] == "fail"} == {names[2]} and not slow["passed"]
        assert "below its peers' median" in hosts[names[2]]["why"] and "round by round" in hosts[names[2]]["why"]
        assert hosts[names[2]]["deficit"] > 0.9
        # every rank measured again before it failed (rank 0 asked them): it failed twice
        assert "measured twice" in hosts[names[2]]["why"] and slow["remeasured"]
        links = {v["subject"]: v["status"] for v in slow["verdicts"] if v["metric"] == "link_busbw_gbs"}
        throttled = cluster.host_name(2)
        assert {s for s, st in links.items() if st == "fail"} == {s for s in links if throttled in s.split("~")[0]
                                                                  or throttled == s.split("~")[1]}
        assert all("below this node's baseline" in v["why"] for v in slow["verdicts"]
                   if v["metric"] == "link_busbw_gbs" and v["status"] == "fail")

        cluster.unthrottle(2)
        after = _check(cluster, base)
        assert all(v["status"] == "pass" for v in _hosts(after).values()), _hosts(after)
