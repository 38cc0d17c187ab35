"""Simulator throughput and peak memory, each mode measured in a fresh process.

A fresh process per mode makes the peak RSS that mode's own (``ru_maxrss`` only grows).
Events are phase records plus kernel records generated; ``store`` modes include writing.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from argus.errors import ConfigError

__all__ = ["run_isolated", "run_mode", "MODES"]

MODES = ("generate", "store", "store+kernels")


def run_mode(ranks: int, steps: int, layout: str | None, seed: int, mode: str) -> dict:
    from argus.sim import SimConfig, simulate_to_store

    if mode not in MODES:
        raise ConfigError(f"unknown bench mode {mode!r}; modes are {', '.join(MODES)}")
    tmp = Path(tempfile.mkdtemp(prefix="argus-bench-"))
    try:
        config = SimConfig(ranks=ranks, steps=steps, layout=layout, seed=seed, kernels=mode == "store+kernels")
        t0 = time.perf_counter()
        res = simulate_to_store(config, "compute_straggler", tmp / "store", write=mode != "generate", baseline=False)
        wall = time.perf_counter() - t0
        events = res.phase_events + res.kernel_events
        return {
            "bench": "simulate", "mode": mode, "ranks": ranks, "steps": res.steps_done,
            "layout": res.truth["layout"], "phase_events": res.phase_events, "kernel_events": res.kernel_events,
            "events": events, "wall_s": round(wall, 3), "events_per_s": round(events / wall),
            "store_mb": round(res.bytes_written / 1e6, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_isolated(ranks: int, steps: int, layout: str | None, seed: int, mode: str) -> dict:
    code = ("import json,sys; from argus.bench.simulate import run_mode; "
            f"print(json.dumps(run_mode({ranks}, {steps}, {layout!r}, {seed}, {mode!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise ConfigError(f"simulate benchmark ({mode}) failed:\n{out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
