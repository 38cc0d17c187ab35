"""One job, one run: hosts launched the way deployment docs launch them — each its own
``argus run -- torchrun --nnodes N --node_rank K …``, seconds apart, no ``--run-id`` — land in
one run and attempt, agreed through the job's own rendezvous store."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from argus.store import Store
from tests.e2e.jobs import MODEL, STEPS, diagnosis, env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host(store, out, node: int, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "argus", "run", "--store", str(store), "--host", f"node{node}", "--no-stacks", "--",
           sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank",
           str(node), "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "argus.workloads.stacks",
           "--stack", "ddp", "--out", str(out), "--steps", str(STEPS), *MODEL]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())


def test_hosts_started_seconds_apart_write_one_run(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    port = _free_port()
    first = _host(store, out, 0, port)
    time.sleep(1.5)  # each host's argus run proposes a name from its own start second: they differ
    second = _host(store, out, 1, port)
    done = [p.communicate(timeout=300) for p in (first, second)]
    for p, (_, err) in zip((first, second), done):
        assert p.returncode == 0, err[-3000:]
    attempts = Store.open(store).attempts()
    assert len(attempts) == 1, attempts
    (attempt,) = attempts
    said = {err.strip().splitlines()[-1] for _, err in done}
    assert said == {f"argus run: traced run {attempt.identity.run_id} into {store}  (argus diagnose {store})"}
    steps = attempt.read("steps", columns=["rank", "step"]).to_pylist()
    assert {(s["rank"], s["step"]) for s in steps} == {(r, s) for r in range(2) for s in range(STEPS)}
    assert sorted(attempt.topology().hosts.tolist()) == ["node0", "node1"]
    diagnosis(store, "--no-store")  # exits 0 (asserted there)
