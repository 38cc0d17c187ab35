"""The shared-memory ring: its layout, drop-and-count, no loss across threads, wrap-around,
records that survive the writer's SIGKILL, and readers that refuse foreign files."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argus.errors import ProtocolError
from argus.wire import DTYPES, Msg, RingReader, RingWriter, group_key
from argus.wire.ring import HEADER_BYTES, MAGIC, OVERFLOW_NAME, VERSION


def _pair(tmp_path, **caps):
    capacities = {Msg[k]: v for k, v in caps.items()} or {Msg.STEPS: 16, Msg.PHASES: 16}
    w = RingWriter.create(tmp_path, capacities)
    return w, RingReader(w.path, expect_pid=os.getpid())


def test_header_layout_is_the_documented_one(tmp_path):
    w, _ = _pair(tmp_path, STEPS=8, PHASES=32)
    raw = w.path.read_bytes()
    magic, version, header, size, pid = struct.unpack_from("<8sIIQq", raw, 0)
    assert (magic, version, header, size, pid) == (MAGIC, VERSION, HEADER_BYTES, len(raw), os.getpid())
    n_tables, state = struct.unpack_from("<II", raw, 40)
    assert (n_tables, state) == (2, 0)
    msg, rec, cap, data, ctr, _ = struct.unpack_from("<HHIQQQ", raw, 80 + 32)  # the second table
    assert (msg, rec, cap) == (int(Msg.PHASES), DTYPES[Msg.PHASES].itemsize, 32)
    assert data % 4096 == 0 and data + rec * cap <= len(raw) and ctr % 64 == 0
    w.close()
    assert struct.unpack_from("<I", w.path.read_bytes(), 44)[0] == 1  # closed by its writer


def test_a_full_ring_drops_and_counts_then_has_room_again(tmp_path):
    w, r = _pair(tmp_path, STEPS=4)
    for i in range(7):
        w.append(Msg.STEPS, i, i, i + 1)
    got = r.drain(settled=False)[Msg.STEPS]
    assert got["step"].tolist() == [0, 1, 2, 3]
    assert r.new_drops() == {Msg.STEPS: 3} and r.new_drops() == {}
    w.append(Msg.STEPS, 9, 9, 10)
    assert r.drain(settled=False)[Msg.STEPS]["step"].tolist() == [9]


def test_a_live_ring_is_read_up_to_the_previous_pass(tmp_path):
    """Settled reads lag one pass (weakly ordered CPUs); the final read takes everything."""
    w, r = _pair(tmp_path)
    w.append(Msg.STEPS, 1, 1, 2)
    assert r.drain() == {}
    w.append(Msg.STEPS, 2, 2, 3)
    assert r.drain()[Msg.STEPS]["step"].tolist() == [1]
    assert r.drain(settled=False)[Msg.STEPS]["step"].tolist() == [2]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=30))
def test_batches_wrap_around_and_arrive_in_order(tmp_path_factory, sizes):
    w, r = _pair(tmp_path_factory.mktemp("ring"), PHASES=16)
    got, n = [], 0
    for size in sizes:  # each batch fits (< 16): the ring wraps many times, nothing is dropped
        batch = np.zeros(size, DTYPES[Msg.PHASES])
        batch["step"] = np.arange(n, n + size)
        n += size
        w.extend(Msg.PHASES, batch)
        got += r.drain(settled=False).get(Msg.PHASES, np.zeros(0, DTYPES[Msg.PHASES]))["step"].tolist()
    assert got == list(range(n)) and r.new_drops() == {}


def test_threads_writing_while_the_reader_drains_lose_nothing(tmp_path):
    w, r = _pair(tmp_path, STEPS=1 << 16)
    per, got, done = 20_000, [], threading.Event()

    def writer(base: int) -> None:
        for i in range(per):
            w.append(Msg.STEPS, base + i, 0, 0)

    def reader() -> None:
        while not done.is_set():
            got.extend(r.drain(settled=False).get(Msg.STEPS, np.zeros(0, DTYPES[Msg.STEPS]))["step"].tolist())

    rt = threading.Thread(target=reader)
    rt.start()
    threads = [threading.Thread(target=writer, args=(k * per,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.settle()
    done.set()
    rt.join()
    got.extend(r.drain(settled=False).get(Msg.STEPS, np.zeros(0, DTYPES[Msg.STEPS]))["step"].tolist())
    assert sorted(got) == list(range(3 * per)) and r.reported_drops[Msg.STEPS] == 0


def test_a_write_from_inside_a_write_is_done_by_the_outer_one(tmp_path):
    """A garbage-collector callback can run inside a ring write on the same thread: its write
    is left to the holder of the lock, never lost and never deadlocked."""
    w, r = _pair(tmp_path)
    inner_done = []

    def outer(*_):
        w.append(Msg.STEPS, 2, 0, 0)  # the lock is held: deferred
        inner_done.append(True)

    w.run(outer)
    assert inner_done and r.drain(settled=False)[Msg.STEPS]["step"].tolist() == [2]


def test_names_are_published_once_in_id_order(tmp_path):
    w, r = _pair(tmp_path)
    assert w.name_id(OVERFLOW_NAME) == 0 and w.name_id("forward") == 1 and w.name_id("forward") == 1
    w.name_id("backward")
    assert r.new_names() == [OVERFLOW_NAME, "forward", "backward"] and r.new_names() == []


def test_a_full_name_table_maps_new_names_to_the_overflow_id(tmp_path):
    w = RingWriter.create(tmp_path, {Msg.STEPS: 4}, names_bytes=256)
    ids = [w.name_id(f"name-{i:04d}") for i in range(40)]
    assert ids[0] == 1 and ids[-1] == 0


def test_records_survive_the_writers_sigkill(tmp_path):
    code = ("import os, signal, sys\nfrom argus.wire import Msg, RingWriter\n"
            "w = RingWriter.create(sys.argv[1], {Msg.STEPS: 1024})\nprint(w.path, flush=True)\n"
            "sys.stdin.readline()\n"
            "for i in range(500):\n    w.append(Msg.STEPS, i, i, i + 1)\n"
            "w.inflight.step_done(499, 7)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    reader = RingReader(path, expect_pid=proc.pid)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.wait(30) == -signal.SIGKILL
    assert not reader.closed_by_writer
    assert reader.drain(settled=False)[Msg.STEPS]["step"].tolist() == list(range(500))
    assert reader.inflight.read().steps_done == 499


def test_in_flight_state_reads_are_consistent_while_another_thread_writes(tmp_path):
    w, r = _pair(tmp_path)
    slot = w.inflight.slot(group_key([0, 1]), 4, 2, 0)
    stop = threading.Event()

    def churn() -> None:
        t = 1
        while not stop.is_set():
            w.inflight.issued(slot, 3, t)
            w.inflight.completed(slot, t, t + 1)
            t += 2

    th = threading.Thread(target=churn)
    th.start()
    try:
        for _ in range(2000):
            g = r.inflight.read().groups[0]
            assert g.completed in (g.issued, g.issued - 1)  # never a torn pair
    finally:
        stop.set()
        th.join()


def test_group_keys_do_not_depend_on_order():
    assert group_key([3, 1, 2]) == group_key((1, 2, 3)) != group_key([1, 2])


@pytest.mark.parametrize("damage", ["magic", "size", "pid", "symlink"])
def test_readers_refuse_foreign_or_damaged_files(tmp_path, damage):
    w, _ = _pair(tmp_path)
    path = w.path
    if damage == "magic":
        with open(path, "r+b") as fh:
            fh.write(b"NOTARING")
    elif damage == "size":
        with open(path, "ab") as fh:
            fh.write(b"\0" * 4096)
    elif damage == "symlink":
        link = tmp_path / "link.ring"
        link.symlink_to(path)
        path = link
    with pytest.raises((ProtocolError, OSError)):
        RingReader(path, expect_pid=os.getpid() + (1 if damage == "pid" else 0))
