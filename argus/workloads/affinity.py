"""Pinning a training process to one CPU once it is ready to train.

A job whose ranks share one vCPU shares its speed (on a shared VM each vCPU's speed varies
independently, and two ranks on two vCPUs are two devices of different speed). Pinned from
the start (``taskset``), every rank's imports and set-up queue on that one vCPU while the
others idle: six ranks' ``import torch`` took 12 s there. Pinned from the first step, they
start on every core and compare on one.
"""

from __future__ import annotations

import os

__all__ = ["pin_threads", "usable_cpus"]


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order (empty where affinity is unknown); a job
    pinned to one shares the last."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def pin_threads(cpu: int) -> None:
    """Every thread of this process onto ``cpu`` (``sched_setaffinity`` moves one thread;
    threads started later inherit their creator's set)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:  # a thread that just ended, or a CPU outside our cgroup: leave it
            pass
