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
