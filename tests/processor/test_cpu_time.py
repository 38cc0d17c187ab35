"""CPU ops timed in CPU time: a wall interval the thread spent off the CPU costs ~nothing."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from argus.processor.cpu_time import CpuTimeSampler


def test_an_interval_spent_sleeping_gets_no_cpu_time_and_a_busy_one_gets_its_wall_time():
    sampler = CpuTimeSampler(interval_s=0.002)
    assert sampler.add(1, os.getpid(), threading.get_native_id(), offset_ns=0)
    try:
        time.sleep(0.05)
        t0 = time.monotonic_ns()
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:  # busy on the CPU
            pass
        t1 = time.monotonic_ns()
        time.sleep(0.2)  # off the CPU
        t2 = time.monotonic_ns()
        time.sleep(0.05)
        cpu = sampler.cpu_durations(1, np.array([t0, t1], np.int64), np.array([t1 - t0, t2 - t1], np.int64))
    finally:
        sampler.stop()
    busy, idle = cpu
    assert busy >= 0.5 * (t1 - t0)  # most of it (the machine is shared: not all)
    assert idle <= 0.1 * (t2 - t1)
    outside = CpuTimeSampler().cpu_durations(1, np.array([0]), np.array([5]))
    assert outside is None  # no timeline: the caller keeps the wall time


def test_a_rank_is_sampled_only_while_it_says_a_capture_runs_or_is_due():
    """At 200 Hz all along the sampler was half of the processor's CPU; a rank's ops are captured
    one step in N, and it says when (its in-flight block's ``op_capture``)."""
    from argus.processor.cpu_time import HOLD_S, IDLE_INTERVAL_S
    from argus.wire.inflight import CAPTURE_IDLE, CAPTURE_SOON

    state = {"v": CAPTURE_IDLE}
    sampler = CpuTimeSampler(interval_s=0.005)
    sampler._thread = threading.current_thread()  # drive it by hand: no thread of its own
    assert sampler.add(1, os.getpid(), threading.get_native_id(), 0, lambda: state["v"])
    assert sampler.add(2, os.getpid(), threading.get_native_id(), 0)  # says nothing: sampled all along
    line, always = sampler._lines[1], sampler._lines[2]
    try:
        assert sampler.sample_once(now=10.0) == 0.005 and (line.n, always.n) == (0, 1)
        sampler.remove(2)
        assert sampler.sample_once(now=10.1) == IDLE_INTERVAL_S and line.n == 0  # idle: not read
        state["v"] = CAPTURE_SOON
        for k in range(3):
            assert sampler.sample_once(now=11.0 + 0.005 * k) == 0.005
        assert line.n == 3
        state["v"] = CAPTURE_IDLE  # the capture ended: its last ops are still covered
        assert sampler.sample_once(now=11.01 + HOLD_S / 2) == 0.005 and line.n == 4
        assert sampler.sample_once(now=11.01 + 2 * HOLD_S) == IDLE_INTERVAL_S and line.n == 4
    finally:
        sampler.stop()


def test_the_producer_says_a_capture_is_due_ahead_of_it_and_idle_after():
    """One step in 5 captured, steps of 0.1 s: due within 0.3 s from step 3 (two steps ahead),
    during the capture of step 5, idle again from step 6."""
    pytest = __import__("pytest")
    pytest.importorskip("torch")
    from argus.producer.kernels import CpuOpSource
    from argus.wire.inflight import CAPTURE_IDLE, CAPTURE_SOON

    said: list[tuple[int, int]] = []

    class Inflight:
        def op_capture(self, v):
            said.append((step, v))

    class Rec:
        ring = type("R", (), {"inflight": Inflight()})()

    src = CpuOpSource(Rec(), every=5)
    clock = iter(np.arange(0, 10, 0.1))
    src._clock = lambda: float(next(clock))
    src._begin = lambda s: setattr(src, "capturing", True)  # no observer here: only the announcements
    src.end_sample = lambda: setattr(src, "capturing", False)
    for step in range(1, 12):
        src.on_step(step)
    assert said == [(1, CAPTURE_IDLE), (3, CAPTURE_SOON), (6, CAPTURE_IDLE), (8, CAPTURE_SOON), (11, CAPTURE_IDLE)]
