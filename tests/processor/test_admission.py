"""Who the processor lets in: its socket's permissions, a connection cap, a refused run."""

from __future__ import annotations

import os
import socket
import stat
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from argus.errors import ConfigError
from argus.processor import Processor, ProcessorConfig
from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import DTYPES
from tests.shortdir import short_dir


def _wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError("condition not reached")


@pytest.fixture()
def serve(tmp_path):
    """Start a Processor on a thread; yields a starter returning (processor, socket path)."""
    started: list[tuple[Processor, threading.Thread]] = []
    dirs: list[Path] = []

    def start(sock: Path | None = None, **config) -> tuple[Processor, Path]:
        if sock is None:  # short: a socket path has 108 bytes, a pytest tmp_path may not fit
            dirs.append(short_dir("argus-a-"))
            sock = dirs[-1] / "p.sock"
        proc = Processor(ProcessorConfig(store=tmp_path / "store", socket_path=sock, host="node-0", durable=False,
                                         evidence=False, stacks=False, hw_interval_s=3600, window_steps=1, **config))
        thread = threading.Thread(target=proc.serve_forever, daemon=True)
        thread.start()
        started.append((proc, thread))
        _wait_for(lambda: sock.exists() or not thread.is_alive())
        return proc, sock

    yield start
    for proc, thread in started:
        proc.stop()
        thread.join(timeout=30)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _round_trip(sock: Path, n: int) -> None:
    c = ProcessorClient(sock, {"run_id": "good", "rank": 0, "world_size": 1, "pid": os.getpid()}).connect()
    rec = np.zeros(1, DTYPES[Msg.STEPS])
    rec["step"], rec["end_ns"] = n, 10
    c.send(Msg.STEPS, rec)
    c.flush(n)
    assert c.wait_for_ack(lambda a: a.get("seq") == n, timeout_s=20) == {"seq": n}
    c.close()


def test_the_socket_is_private_to_its_user(serve):
    _, sock = serve()
    assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sock.parent).st_mode) & 0o077 == 0


def test_a_socket_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # no sticky bit: anyone could swap the socket
    proc = Processor(ProcessorConfig(store=tmp_path / "store", socket_path=shared / "p.sock", host="node-0",
                                     stacks=False))
    with pytest.raises(ConfigError, match="writable by every user"):
        proc._listen()


def test_connections_past_the_cap_are_closed_and_counted_and_the_rest_served(serve):
    proc, sock = serve(max_connections=3)
    idle = []
    for _ in range(3):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock))
        idle.append(s)
    _wait_for(lambda: len(proc._conns) == 3)
    extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    extra.settimeout(10)
    extra.connect(str(sock))
    assert extra.recv(10) == b""  # closed by the processor
    assert proc.status.dropped_clients == {"too_many_connections": 1}
    idle.pop().close()
    _wait_for(lambda: len(proc._conns) == 2)
    _round_trip(sock, 1)
    for s in idle:
        s.close()


def test_a_run_whose_attempt_json_is_corrupt_is_refused_and_others_served(serve, tmp_path):
    from argus.store import Store

    Store.create(tmp_path / "store")
    bad = tmp_path / "store" / "runs" / "broken" / "0"
    bad.mkdir(parents=True)
    (bad / "attempt.json").write_text("{not json")
    proc, sock = serve()
    for _ in range(2):  # the second is refused from the cached refusal, without a traceback
        c = ProcessorClient(sock, {"run_id": "broken", "rank": 0, "world_size": 1}).connect()
        assert c.poll_acks(wait_s=5) == [] and c.peer_closed
        c.close(bye=False)
    _round_trip(sock, 1)
    assert proc.status.dropped_clients == {"attempt_refused": 2}
    assert "broken/0" in proc.status.refused_attempts
    assert (bad / "attempt.json").read_text() == "{not json"


def test_a_connection_that_never_says_hello_is_closed_after_the_timeout(serve):
    proc, sock = serve(hello_timeout_s=0.3)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.settimeout(20)
    silent.connect(str(sock))
    silent.sendall(b"ARG")  # not even a whole header
    assert silent.recv(10) == b""
    assert proc.status.dropped_clients == {"hello_timeout": 1}
    _round_trip(sock, 1)  # a rank that says HELLO at once is served


def test_unfinished_frames_past_the_budget_drop_their_connection_and_release_the_bytes(serve):
    from argus.wire.protocol import HEADER, MAGIC, VERSION

    budget = 7 << 19  # 3.5 MiB: three held frames of 1 MiB fit, a fourth does not
    proc, sock = serve(max_pending_frame_bytes=budget)
    held = []
    for _ in range(4):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(str(sock))
        try:
            s.sendall(HEADER.pack(MAGIC, VERSION, int(Msg.KERNELS), 64 << 20) + b"\0" * (1 << 20))
        except BrokenPipeError:  # the one past the budget, closed while it sends
            pass
        held.append(s)
    _wait_for(lambda: proc.status.dropped_clients.get("frame_budget", 0) == 1)
    _wait_for(lambda: proc._pending_bytes == 3 * ((1 << 20) + HEADER.size))  # the other three, whole
    assert proc.status.dropped_clients == {"frame_budget": 1}
    for s in held:
        s.close()
    _wait_for(lambda: not proc._conns)
    assert proc._pending_bytes == 0
    _round_trip(sock, 1)


def test_an_idle_attempt_is_released_and_reopened_when_a_rank_comes_back(serve):
    proc, sock = serve(attempt_idle_s=0.3)
    for run in ("r1", "r2", "r3"):
        c = ProcessorClient(sock, {"run_id": run, "rank": 0, "world_size": 1, "pid": os.getpid()}).connect()
        rec = np.zeros(1, DTYPES[Msg.STEPS])
        rec["step"], rec["end_ns"] = 0, 10
        c.send(Msg.STEPS, rec)
        c.flush(1)
        assert c.wait_for_ack(lambda a: a.get("seq") == 1, timeout_s=20) == {"seq": 1}
        c.close()
    _wait_for(lambda: proc.status.attempts_forgotten == 3)
    assert not proc._attempts  # nothing held for runs that are over
    _round_trip(sock, 5)
    _wait_for(lambda: proc.status.attempts_forgotten == 4)
    _round_trip(sock, 6)  # a run that comes back after its release is reopened from the store
    assert proc.status.windows_written == 5
    store = proc.store
    assert sorted(a.identity.run_id for a in store.attempts()) == ["good", "r1", "r2", "r3"]
