"""The namespace harness runs a real 4-host gloo job and throttles one host's link.

This file is also the job: ``python test_netns_harness.py --phase NAME:BYTES:ITERS ...`` runs
timed all_reduces as one rank (env from ``launch_job``) and prints one JSON line per rank.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if __name__ != "__main__":
    from argus.workloads.netns import NamespaceCluster, available, cleanup_stale, launch_job

    pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

HOSTS = 4
CHECK_PHASE = "check:4194304:10"  # 4 MiB float32 tensors, 10 all_reduces: correctness
TIMED_PHASE = "timed:262144:4"  # 256 KiB, 4 all_reduces: small enough to run throttled
THROTTLE = {"rate": "5mbit", "burst": "32kbit", "latency": "400ms"}
JOB_ENV = {"OMP_NUM_THREADS": "1"}  # 4 ranks share 2 cores


def run_phases(cluster, *phases: str) -> list[dict]:
    results = launch_job(cluster, __file__, [a for p in phases for a in ("--phase", p)],
                         env=JOB_ENV, timeout=45)
    reports = []
    for rank, res in enumerate(results):
        assert res.returncode == 0, f"rank {rank} rc={res.returncode}\n{res.stderr[-3000:]}"
        reports.append(json.loads(res.stdout.strip().splitlines()[-1]))
    return reports


def phase_s(reports: list[dict], name: str) -> float:
    """Median per-iteration all_reduce time of the slowest rank (the job's pace)."""
    return max(sorted(r["phases"][name]["iter_s"])[len(r["phases"][name]["iter_s"]) // 2]
               for r in reports)


@pytest.fixture(scope="module")
def cluster():
    cleanup_stale()  # leftovers of crashed runs (live runs' namespaces are kept)
    with NamespaceCluster(HOSTS) as c:
        yield c


@pytest.fixture(scope="module")
def unthrottled(cluster):
    return run_phases(cluster, CHECK_PHASE, TIMED_PHASE)


def test_four_host_gloo_job_agrees_across_namespaces(cluster, unthrottled):
    assert [r["rank"] for r in unthrottled] == list(range(HOSTS))
    assert [r["host"] for r in unthrottled] == [f"ns-host-{h}" for h in range(HOSTS)]
    assert [r["ifname"] for r in unthrottled] == [cluster.ifname(h) for h in range(HOSTS)]
    expected = sum(range(1, HOSTS + 1))  # rank r contributes r + 1 everywhere
    for r in unthrottled:
        check = r["phases"]["check"]
        assert check["iters"] == 10 and check["bytes"] == 4 * 1024 * 1024
        assert check["min"] == check["max"] == expected * 10  # 10 iterations, re-filled each
    assert len({r["phases"]["check"]["digest"] for r in unthrottled}) == 1


def test_throttled_host_slows_all_reduce_and_unthrottle_restores(cluster, unthrottled):
    base_s = phase_s(unthrottled, "timed")
    cluster.throttle(2, **THROTTLE)
    try:
        host_side, switch_side = cluster.qdisc(2)
        assert "tbf" in host_side and "tbf" in switch_side
        throttled_s = phase_s(run_phases(cluster, TIMED_PHASE), "timed")
    finally:
        cluster.unthrottle(2)
    restored_s = phase_s(run_phases(cluster, TIMED_PHASE), "timed")
    print(f"all_reduce 256 KiB x{HOSTS} ranks: unthrottled {base_s * 1e3:.1f} ms, "
          f"host 2 at {THROTTLE['rate']} {throttled_s * 1e3:.1f} ms, "
          f"restored {restored_s * 1e3:.1f} ms")
    assert throttled_s >= 3 * base_s
    assert restored_s * 3 <= throttled_s


def test_nothing_with_the_prefix_survives_the_cluster():
    def leftovers(prefix: str) -> str:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                               check=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                               check=True).stdout
        return "\n".join(line for line in (names + links).splitlines() if prefix in line)

    with pytest.raises(RuntimeError, match="boom"), NamespaceCluster(2) as c:
        c.throttle(1)
        assert len(leftovers(c.prefix).splitlines()) == 3  # switch + 2 hosts
        raise RuntimeError("boom")
    assert leftovers(c.prefix) == ""

    # A "crashed" run: built, never closed, a process left inside; cleanup_stale removes it.
    stale = f"argus-e2e-stale-{secrets.token_hex(3)}-"
    crashed = NamespaceCluster(2, prefix=stale)
    crashed.__enter__()
    sleeper = crashed.run(0, [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert sorted(cleanup_stale(stale)) == sorted(crashed.namespaces())
    finally:
        crashed.close()
    assert sleeper.wait(timeout=5) != 0
    assert leftovers(stale) == ""


# --- the job ---------------------------------------------------------------------------------
def _job(argv: list[str]) -> None:
    import argparse
    import hashlib
    import os
    import time

    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", action="append", required=True, help="NAME:BYTES:ITERS")
    phases = [p.split(":") for p in parser.parse_args(argv).phase]

    dist.init_process_group("gloo")  # env:// from launch_job
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {"rank": rank, "world": world, "host": os.environ["ARGUS_HOST"],
              "ifname": os.environ["GLOO_SOCKET_IFNAME"], "phases": {}}
    for name, nbytes, iters in phases:
        t = torch.empty(int(nbytes) // 4, dtype=torch.float32)
        acc = torch.zeros_like(t)
        dist.barrier()
        times = []
        for _ in range(int(iters)):
            t.fill_(rank + 1)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
            acc += t
        report["phases"][name] = {
            "bytes": int(nbytes), "iters": int(iters), "iter_s": times,
            "min": acc.min().item(), "max": acc.max().item(),
            "digest": hashlib.sha256(acc.numpy().tobytes()).hexdigest()[:16],
        }
    print(json.dumps(report), flush=True)
    dist.barrier()
    os._exit(0)  # gloo may abort at interpreter exit (ENVIRONMENT.md)


if __name__ == "__main__":
    _job(sys.argv[1:])
