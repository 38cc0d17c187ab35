"""In-process buffers: bounded, drop-and-count, nothing lost between append and drain."""

from __future__ import annotations

import threading

from argus.producer.recorder import Recorder


def test_beyond_capacity_events_are_dropped_and_counted():
    rec = Recorder(capacity=1000)
    for i in range(1500):
        rec.phase(0, i, i + 10, 0, "forward-compute", "compute")
    rec.kernel_batch([(0, 0, 1, 0, 0, -1, 3)] * 1200)
    assert len(rec.phases) == 1000 and rec.dropped["phases"] == 500
    assert len(rec.kernels) == 1000 and rec.dropped["kernels"] == 200
    out = rec.drain()
    assert len(out["phases"]) == 1000 and not rec.phases
    rec.phase(1, 0, 5, -1, "optimizer", "compute")  # room again after a drain
    assert len(rec.phases) == 1 and rec.dropped["phases"] == 500


def test_concurrent_append_and_drain_lose_nothing():
    rec = Recorder(capacity=10_000_000)
    n, got = 200_000, []
    done = threading.Event()

    def drainer():
        while not done.is_set():
            got.extend(rec.drain()["steps"])
        got.extend(rec.drain()["steps"])

    t = threading.Thread(target=drainer)
    t.start()
    for i in range(n):
        rec.step(i, i, i + 1)
    done.set()
    t.join()
    assert [s for s, _, _ in got] == list(range(n))


def test_names_get_stable_ids():
    rec = Recorder()
    assert rec.name_id("a") == 0 and rec.name_id("b") == 1 and rec.name_id("a") == 0
