"""The stack channel: real py-spy on real processes, a real processor, real clients.

The only stand-ins are at the py-spy process boundary: an executable that answers like
py-spy does when ptrace is refused, and (for the placement rules) samples handed straight
to the sampler's main-thread side.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from argus.wire import Msg, ProcessorClient
from argus.processor.assembler import RankInfo
from argus.wire.protocol import DTYPES
from argus.processor.samplers import RankHandle
from argus.processor.stacks import StackSampler, find_py_spy, parse_dump, run_dump
from argus.store import Store
from tests.shortdir import short_dir

PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed")

_BUSY = """
def argus_test_marker():
    while True:
        sum(range(1000))

print("ready", flush=True)
argus_test_marker()
"""

_DENIED = """#!/bin/sh
echo "Permission Denied: Try running again with elevated permissions by going 'sudo env \\"PATH=\\$PATH\\" !!'" >&2
exit 1
"""


def _wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture()
def busy_rank():
    """A Python process spinning in ``argus_test_marker`` (the rank py-spy samples)."""
    child = subprocess.Popen([sys.executable, "-c", _BUSY], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    yield child
    child.kill()
    child.wait()


@pytest.fixture()
def processor(tmp_path):
    """Start ``argus processor``: yields start(*flags, env=…, python=…) → process; store; socket; log."""
    sock_dir = short_dir("argus-t-")  # short path: unix sockets cap at 108 bytes
    sock, store, log = sock_dir / "p.sock", tmp_path / "store", tmp_path / "processor.log"
    procs = []

    def start(*extra: str, env: dict | None = None, python: str = sys.executable) -> subprocess.Popen:
        out = log.open("w")
        proc = subprocess.Popen([python, "-m", "argus", "processor", "--store", str(store), "--socket", str(sock),
                                 "--host", "node-0000", "--window-steps", "2", "--no-fsync", *extra],
                                stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        procs.append(proc)
        _wait_for(lambda: sock.exists() or proc.poll() is not None, what="the processor socket")
        assert proc.poll() is None, log.read_text()
        return proc

    yield start, store, sock, log
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    shutil.rmtree(sock_dir, ignore_errors=True)


def _client(sock, pid, rank=0):
    return ProcessorClient(sock, {"run_id": "job", "attempt_id": "0", "rank": rank, "world_size": 2,
                                  "host": "node-0000", "local_rank": rank, "layout": "dp=2", "pid": pid}
                           ).connect(retries=50, delay_s=0.02)  # the socket file appears just before listen()


class _Steps:
    """Step records of one rank, timed by the wall clock as they happen."""

    def __init__(self, client):
        self.client, self.step, self.last = client, 0, time.time_ns()

    def send(self, phase: str | None = None) -> None:
        now = time.time_ns()
        if phase is not None:
            ph = np.zeros(1, DTYPES[Msg.PHASES])
            ph[0] = (self.step, self.last, now - self.last, -1, self.client.names.id(phase), 2, 0, -1)
            self.client.send(Msg.PHASES, ph)
        rec = np.zeros(1, DTYPES[Msg.STEPS])
        rec[0] = (self.step, self.last, now)
        self.client.send(Msg.STEPS, rec)
        self.step, self.last = self.step + 1, now


def _status(store):
    path = store / "processors" / "node-0000.json"
    return json.loads(path.read_text()) if path.exists() else None


def _rank_status(store, rank=0):
    doc = _status(store)
    ranks = doc["samplers"]["stacks"]["ranks"] if doc else []
    return next((dict(r, updated=doc["updated"]) for r in ranks if r["rank"] == rank), None)


def _stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


# -- the real thing ---------------------------------------------------------------------------
@needs_py_spy
def test_a_busy_ranks_stacks_reach_the_store_with_its_function(processor, busy_rank):
    start, store, sock, log = processor
    proc = start("--stack-hz", "20")
    client = _client(sock, busy_rank.pid)
    steps = _Steps(client)
    # stream steps until the processor has stored some stacks (its names are then in the
    # rank's name table), then introduce a new phase name: client ids must still resolve
    deadline = time.monotonic() + 30
    while not ((_rank_status(store) or {}).get("records", 0) > 0):
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
        steps.send("forward-compute")
    switch = steps.step
    for _ in range(4):
        time.sleep(0.05)
        steps.send("dataloader")
    client.close()
    _stop(proc)

    attempt = Store.open(store).attempt()
    stacks = attempt.read("stacks").to_pylist()
    assert stacks and {r["rank"] for r in stacks} == {0}
    assert all(r["count"] > 0 and r["end_ns"] >= r["start_ns"] for r in stacks)
    assert all("argus_test_marker (<string>:" in r["frames"] for r in stacks), stacks[0]["frames"]
    assert all(r["frames"].startswith("<module> (<string>:") for r in stacks)  # root first
    assert {r["thread"] for r in stacks} == {"MainThread"}
    assert sum(r["count"] for r in stacks) >= 5
    assert {r["step"] for r in stacks} <= set(range(steps.step + 1))
    phases = attempt.read("phases").to_pylist()
    assert {p["name"] for p in phases if p["step"] < switch} == {"forward-compute"}
    assert {p["name"] for p in phases if p["step"] >= switch} == {"dataloader"}


@needs_py_spy
def test_a_rank_that_stops_reporting_steps_is_sampled_faster(processor, busy_rank):
    start, store, sock, log = processor
    proc = start("--stack-hz", "0.5", "--suspect-stack-hz", "20")
    client = _client(sock, busy_rank.pid)
    steps = _Steps(client)
    for _ in range(6):  # 50 ms steps, then silence: stalled after 3 × 50 ms
        time.sleep(0.05)
        steps.send()
    first = _wait_for(lambda: (r := _rank_status(store)) and r["suspect"] == "stalled" and r, timeout=20,
                      what="the rank to be suspected")
    assert first["hz"] == 20 and first["mode"] == "py-spy"
    later = _wait_for(lambda: (r := _rank_status(store)) and r["updated"] > first["updated"] + 1.5 and r,
                      timeout=20, what="a later status")
    rate = (later["samples"] - first["samples"]) / (later["updated"] - first["updated"])
    assert rate > 2, (first, later)  # far above the 0.5 Hz base rate (20 Hz asked; a loaded machine lags)
    client.close()
    _stop(proc)
    counts = [r["count"] for r in Store.open(store).attempt().read("stacks").to_pylist() if r["step"] >= steps.step]
    assert sum(counts) > 3  # the stalled step's stacks, aggregated


def test_a_rank_py_spy_may_not_trace_is_told_to_sample_itself(processor, tmp_path):
    start, store, sock, log = processor
    fake = tmp_path / "py-spy"
    fake.write_text(_DENIED)
    fake.chmod(0o755)
    proc = start("--stack-hz", "2", "--suspect-stack-hz", "20", env=dict(os.environ, ARGUS_PY_SPY=str(fake)))
    client = _client(sock, os.getpid())
    steps = _Steps(client)
    for _ in range(5):
        time.sleep(0.05)
        steps.send()

    def controls(n):
        client.poll_acks(wait_s=0.1)
        return len(client.controls) >= n

    _wait_for(lambda: controls(1), what="a CONTROL frame")
    assert client.controls[0] == {"stacks": {"inprocess_hz": 2.0}}
    _wait_for(lambda: controls(2), what="a second CONTROL frame once the rank stalls")
    assert client.controls[1] == {"stacks": {"inprocess_hz": 20.0}}
    client.close()
    _stop(proc)
    text = log.read_text()
    assert text.count("asking the rank to sample itself") == 1, text


def test_the_processor_serves_without_py_spy_and_says_so_once(processor, tmp_path):
    start, store, sock, log = processor
    bare = "/usr/bin:/bin"
    if shutil.which("py-spy", path=bare):
        pytest.skip("py-spy is installed system-wide")
    bindir = tmp_path / "bin"  # a Python with no py-spy beside it
    bindir.mkdir()
    (bindir / "python").symlink_to(os.path.realpath(sys.executable))
    env = {k: v for k, v in os.environ.items() if k != "ARGUS_PY_SPY"}
    proc = start(env=dict(env, PATH=bare), python=str(bindir / "python"))
    client = _client(sock, os.getpid())
    steps = _Steps(client)
    for _ in range(3):
        steps.send()
    client.flush(1)
    assert client.wait_for_ack(lambda a: a.get("seq") == 1, timeout_s=30) == {"seq": 1}
    client.close()
    _stop(proc)
    lines = [ln for ln in log.read_text().splitlines() if "stack sampling off" in ln]
    assert len(lines) == 1 and "py-spy not found" in lines[0], log.read_text()
    assert Store.open(store).attempt().read("steps").num_rows == 3
    assert _status(store)["samplers"]["stacks"]["enabled"] is False


# -- the py-spy boundary ----------------------------------------------------------------------
@needs_py_spy
def test_py_spy_answers_are_classified(busy_rank, tmp_path):
    kind, text = run_dump(PY_SPY, busy_rank.pid)
    assert kind == "ok", text
    (thread, frames), = parse_dump(text, busy_rank.pid)
    assert thread == "MainThread" and frames.startswith("<module> (<string>:7);argus_test_marker (<string>:")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert run_dump(PY_SPY, sleeper.pid)[0] == "error"  # not a Python process
    finally:
        sleeper.kill()
        sleeper.wait()
    assert run_dump(PY_SPY, sleeper.pid)[0] == "gone"
    assert run_dump(str(tmp_path / "no-such-py-spy"), busy_rank.pid)[0] == "missing"


@needs_py_spy
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop privileges")
def test_py_spy_refused_by_the_kernel_reads_as_denied(busy_rank):
    """Run the real py-spy as ``nobody`` against a root process: the real refusal message."""
    tmp = Path(tempfile.mkdtemp(prefix="argus-spy-"))
    try:
        tmp.chmod(0o755)
        shutil.copy(PY_SPY, tmp / "py-spy")
        wrapper = tmp / "py-spy-nobody"
        wrapper.write_text(f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {tmp}/py-spy "$@"\n')
        wrapper.chmod(0o755)
        kind, message = run_dump(str(wrapper), busy_rank.pid)
        assert kind == "denied", message
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_dump_text_keeps_the_main_thread_and_active_threads_root_first():
    text = """Process 27950: /usr/bin/python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 27950 (idle): "MainThread"
    wait (torch/distributed/distributed_c10d.py:3021)
    train_step (train.py:40)
    <module> (train.py:99)
Thread 27992 (idle): "pin_memory"
    wait (threading.py:331)
    _bootstrap (threading.py:1002)
Thread 0x7F0012 (active+gil): "loader"
    _next_data (torch/utils/data/dataloader.py:1458)
    run (threading.py:982)
Thread 28001 (active)
    compute (native.py:1)
"""
    assert parse_dump(text, 27950) == [
        ("MainThread", "<module> (train.py:99);train_step (train.py:40);wait (torch/distributed/distributed_c10d.py:3021)"),
        ("loader", "run (threading.py:982);_next_data (torch/utils/data/dataloader.py:1458)"),
        ("thread 28001", "compute (native.py:1)"),
    ]


# -- placement, aggregation and suspicion (the sampler's main-thread side) ---------------------
class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _sampler(clock, ranks=1):
    s = StackSampler(hz=1.0, suspect_hz=10.0, clock=clock)  # never started: no threads, no py-spy
    handles = [RankHandle(token=r + 1, info=RankInfo(rank=r, names=["client-name"]), attempt_key=("job", "0"),
                          pid=1000 + r) for r in range(ranks)]
    for h in handles:
        s.rank_joined(h)
        s.owner[h.pid] = h.token
    return s, handles


def _report(s, handle, steps, starts, ends):
    rec = np.zeros(len(steps), DTYPES[Msg.STEPS])
    rec["step"], rec["start_ns"], rec["end_ns"] = steps, starts, ends
    handle.info.step_starts += list(starts)  # what the assembler tracks for the rank
    handle.info.step_ids += list(steps)
    handle.info.max_step = max(steps)
    s.steps_reported(handle, rec)


def _rows(outputs):
    rows = []
    for handle, msg, recs in outputs:
        assert msg == Msg.STACKS
        for r in recs:
            rows.append((int(r["step"]), handle.info.names[r["thread"]], handle.info.names[r["frames"]],
                         int(r["count"]), int(r["start_ns"]), int(r["end_ns"])))
    return rows


def test_consecutive_samples_of_a_step_become_one_record_placed_once_the_step_is_reported():
    s, (h,) = _sampler(Clock())
    sec = 1_000_000_000
    for ts, frames in [(1, "a;b"), (2, "a;b"), (3, "a;c"), (4, "a;c"), (6, "a;c"), (7, "a;b")]:
        s.receive(("sample", 1000, ts * sec, [("MainThread", frames)]), [h])
    assert s.tick(int(3.5 * sec)) == []  # no step covers them yet, and they are recent
    _report(s, h, [0, 1], [0, 5 * sec], [5 * sec - 1, int(6.5 * sec)])
    rows = _rows(s.tick(7 * sec))
    assert rows == [(0, "MainThread", "a;b", 2, sec, 2 * sec), (0, "MainThread", "a;c", 2, 3 * sec, 4 * sec),
                    (1, "MainThread", "a;c", 1, 6 * sec, 6 * sec)]
    assert h.info.names[0] == "client-name"  # appended after the client's names
    # past the last finished step: the next step, once the grace period has passed
    assert s.tick(8 * sec) == []
    rows = _rows(s.tick(10 * sec) + s.rank_left(h))
    assert rows == [(2, "MainThread", "a;b", 1, 7 * sec, 7 * sec)]


def test_suspicion_raises_the_rate_for_stalled_and_slow_ranks_and_lets_it_go():
    clock = Clock()
    s, (a, b) = _sampler(clock, ranks=2)
    sec = 1_000_000_000
    for h in (a, b):
        _report(s, h, [0, 1, 2], [0, sec, 2 * sec], [sec, 2 * sec, 3 * sec])  # 1 s steps
    s.tick(0)
    assert [r["suspect"] for r in s.status()["ranks"]] == [None, None]
    clock.t += 2.0
    _report(s, a, [3], [3 * sec], [4 * sec])
    _report(s, b, [3], [3 * sec], [int(6.5 * sec)])  # 3.5 s > 3 × the median
    clock.t += 0.5
    s.tick(0)
    assert [r["suspect"] for r in s.status()["ranks"]] == [None, "slow"]
    assert [s._rate(st) for st in s.states.values()] == [1.0, 10.0]
    clock.t += 1.5
    _report(s, b, [4], [int(6.5 * sec)], [int(7.5 * sec)])  # b is back to normal: held "slow" a while
    clock.t += 2.0  # a: silent for 4 s > 3 × 1 s
    s.tick(0)
    assert [r["suspect"] for r in s.status()["ranks"]] == ["stalled", "slow"]
    _report(s, a, [4], [4 * sec], [5 * sec])
    _report(s, b, [5], [int(7.5 * sec)], [int(8.5 * sec)])
    clock.t += 0.5
    s.tick(0)
    assert [r["suspect"] for r in s.status()["ranks"]] == ["stalled", "slow"]  # held for a while
    for _ in range(12):  # both keep reporting normal 1 s steps
        clock.t += 1.0
        for h in (a, b):
            step = h.info.max_step + 1
            _report(s, h, [step], [step * sec], [(step + 1) * sec])
        s.tick(0)
    assert [r["suspect"] for r in s.status()["ranks"]] == [None, None]


def test_a_long_stall_returns_to_the_base_rate_after_the_cap():
    clock = Clock()
    s, (h,) = _sampler(clock)
    _report(s, h, [0, 1, 2], [0, 10**9, 2 * 10**9], [10**9, 2 * 10**9, 3 * 10**9])
    clock.t += 5
    s.tick(0)
    assert s._rate(s.states[h.token]) == 10.0
    clock.t += 400
    s.tick(0)
    assert s._rate(s.states[h.token]) == 1.0 and s.status()["ranks"][0]["capped"]
