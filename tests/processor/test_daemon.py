"""A real processor process, real sockets, real clients — including a killed and a bad one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pyarrow.compute as pc
import pytest

from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import HEADER, encode_array, encode_json
from argus.sim import Engine, SimConfig
from argus.sim.feed import engine_interner, step_batches
from argus.store import Store
from tests.shortdir import short_dir

LAYOUT = "tp=2,pp=2,dp=2"


def _wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture()
def processor(tmp_path):
    """Start ``argus processor``; yields (process, store dir, socket path)."""
    sock_dir = short_dir("argus-t-")  # short path: unix sockets cap at 108 bytes
    sock, store = sock_dir / "p.sock", tmp_path / "store"
    procs = []

    def start(*extra: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(store), "--socket",
                                 str(sock), "--host", "node-0000", "--window-steps", "2", "--no-fsync",
                                 "--evidence-interval", "0", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        _wait_for(lambda: sock.exists() or proc.poll() is not None, what="the processor socket")
        assert proc.poll() is None, proc.stdout.read()
        return proc

    yield start, store, sock
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _client(sock, rank, engine):
    c = ProcessorClient(sock, {"run_id": "job", "attempt_id": "0", "rank": rank, "world_size": 8,
                               "host": "node-0000", "local_rank": rank, "layout": LAYOUT, "pid": os.getpid()})
    c.names = engine_interner(engine.names)
    return c.connect()


def _send_step(clients, rec):
    for rank, batches in step_batches(rec).items():
        if rank in clients:
            for msg in (Msg.PHASES, Msg.KERNELS, Msg.STEPS):
                if msg in batches:
                    clients[rank].send(msg, batches[msg])


_KILLED_CLIENT = """
import sys, time, numpy as np
from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import DTYPES, encode_array
c = ProcessorClient(sys.argv[1], {"run_id": "job", "attempt_id": "0", "rank": 7, "world_size": 8,
                                  "host": "node-0000", "local_rank": 7, "layout": "tp=2,pp=2,dp=2"}).connect()
c.names.id("k")
frame = encode_array(Msg.KERNELS, np.zeros(1000, DTYPES[Msg.KERNELS]))
c._send_names()
c.send_raw(frame[: len(frame) // 2])  # half a batch, then we are killed
print("sent", flush=True)
time.sleep(60)
"""


def test_processor_survives_a_killed_client_and_a_malformed_frame(processor):
    start, store, sock = processor
    proc = start("--raw-kernels")
    engine = Engine(SimConfig(ranks=8, steps=8, layout=LAYOUT, gpus_per_host=8))
    steps = iter(engine.run())
    clients = {r: _client(sock, r, engine) for r in range(7)}
    for _ in range(2):
        _send_step(clients, next(steps))

    killed = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, str(sock)], stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "sent"
    killed.send_signal(signal.SIGKILL)
    killed.wait()

    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(str(sock))
    bad.sendall(encode_json(Msg.HELLO, {"run_id": "job", "rank": 6, "world_size": 8, "layout": LAYOUT}))
    bad.sendall(b"GARBAGE!" + b"\x00" * 64)  # not a frame
    assert bad.recv(10) == b""  # the processor hangs up on it
    bad.close()

    for rec in steps:  # the others keep streaming
        _send_step(clients, rec)
    for c in clients.values():
        c.flush(1)
    for c in clients.values():
        c.wait_for_ack(lambda a: a.get("seq") == 1, timeout_s=30)
    acked = {a["window"] for c in clients.values() for a in c.acks if "window" in a}
    for c in clients.values():
        c.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0

    attempt = Store.open(store).attempt()
    assert acked == {0, 1, 2, 3}
    for w in acked:  # every acknowledged window is on disk, for every rank that streamed it
        rows = attempt.read("phases", steps=(2 * w, 2 * w + 1))
        assert set(rows.column("rank").to_pylist()) == set(range(7))
        summ = attempt.read("kernel_summaries", filter=pc.field("window") == w)
        assert summ.num_rows > 0 and set(summ.column("rank").to_pylist()) == set(range(7))
    assert attempt.read("kernels").num_rows > 0  # --raw-kernels
    drops = attempt.read("drops").to_pylist()
    reasons = {(d["rank"], d["reason"]) for d in drops}
    assert (7, "disconnected") in reasons and (6, "malformed") in reasons
    assert all(d["host"] == "node-0000" for d in drops)
    status = json.loads((store / "processors" / "node-0000.json").read_text())
    assert status["garbage_frames"] == 1 and status["disconnects"] >= 1 and status["windows_written"] >= 4
    topo = attempt.topology()
    assert topo.hosts[:7].tolist() == ["node-0000"] * 7
    _check_evidence(attempt, acked)


def _check_evidence(attempt, windows):
    """Every written window left a Perfetto trace that decodes, with a track per rank."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    files = sorted((attempt.path / "evidence" / "node-0000").glob("*.pftrace"))
    assert {int(f.name.split("-")[0]) for f in files} >= set(windows)
    trace = pb.Trace()
    trace.ParseFromString(files[0].read_bytes())
    names = {p.track_descriptor.name for p in trace.packet if p.HasField("track_descriptor")}
    assert {f"rank {r} (node-0000)" for r in range(7)} <= names
    slices = [p for p in trace.packet if p.HasField("track_event")]
    assert len(slices) > 1000


def test_a_killed_processor_keeps_every_window_it_acknowledged(processor):
    start, store, sock = processor
    proc = start()
    engine = Engine(SimConfig(ranks=8, steps=5, layout=LAYOUT, gpus_per_host=8))
    clients = {r: _client(sock, r, engine) for r in range(8)}
    for rec in engine.run():
        _send_step(clients, rec)
    clients[0].wait_for_ack(lambda a: a.get("window") == 1, timeout_s=30)  # windows 0 and 1 closed (lag 1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    acked = {a["window"] for a in clients[0].acks if "window" in a}
    attempt = Store.open(store).attempt()
    on_disk = set(attempt.read("kernel_summaries").column("window").to_pylist())
    assert acked <= on_disk and {0, 1} <= acked


def test_a_second_processor_on_the_same_socket_is_refused(processor):
    start, store, sock = processor
    start()
    out = subprocess.run([sys.executable, "-m", "argus", "processor", "--store", str(store), "--socket", str(sock)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "already listening" in out.stderr


def test_a_frame_before_hello_is_rejected_and_others_are_unaffected(processor):
    start, store, sock = processor
    proc = start()
    engine = Engine(SimConfig(ranks=8, steps=3, layout=LAYOUT, gpus_per_host=8))
    good = _client(sock, 0, engine)
    rogue = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    rogue.connect(str(sock))
    import numpy as np
    from argus.wire.protocol import DTYPES

    rogue.sendall(encode_array(Msg.STEPS, np.zeros(3, DTYPES[Msg.STEPS])))
    assert rogue.recv(10) == b""
    for rec in engine.run():
        _send_step({0: good}, rec)
    good.flush(7)
    assert good.wait_for_ack(lambda a: a.get("seq") == 7, timeout_s=30) == {"seq": 7}
    assert HEADER.size == 12
    good.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_evidence_for_slow_windows_always_and_for_normal_ones_at_an_interval(tmp_path):
    import types

    import pyarrow as pa

    from argus.ingest import EvidenceExporter

    evidence = EvidenceExporter(types.SimpleNamespace(), types.SimpleNamespace(), "node-0", interval_s=3600,
                                max_bytes=1 << 20, max_age_s=3600.0)

    def window(step_s):
        starts = [0, 0]
        data = types.SimpleNamespace(steps=pa.table({"start_ns": starts, "end_ns": [int(step_s * 1e9)] * 2}))
        return types.SimpleNamespace(data=data)

    due = [evidence.due(window(s)) for s in (1.0, 1.0, 1.02, 0.98, 2.5, 1.0)]
    assert due == [True, False, False, False, True, False]
