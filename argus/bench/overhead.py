"""``argus bench overhead``: what tracing costs a real CPU training job, side by side.

The same gloo DDP job (``argus.workloads.train_transformer``) runs in each mode, the modes
interleaved in every repeat so that drift of a shared machine hits them alike:

* ``none`` — untraced;
* ``argus-semantic`` — ``argus run`` with the kernel and stack channels off (steps, phases,
  collectives, DDP buckets);
* ``argus-ops`` — plus the CPU-op kernel channel (aten ops of one step in N);
* ``argus`` — every channel available on CPU (plus py-spy stacks at the always-on rate;
  hardware is off without NVML);
* ``profiler`` — ``torch.profiler`` (CPU activities) kept on for the whole run.

Step times and resident memory come from the job itself (``--stats``), so every mode is
measured the same way; the first 10% of steps (warm-up) are left out. Figures: mean step
time (a cost paid one step in N counts) and its ratio to ``none``, the cost of each channel
(difference of consecutive modes), peak RSS of the ranks, RSS growth over the second half of
the run (flat memory ≈ 0), CPU seconds of the whole process tree — and **Argus's own CPU**,
measured where it is spent, not inferred from step times (on a 2-core machine step-time
ratios mostly measure contention):

* ``processor_cpu_s`` — the processor process (its own rusage; ``processor_startup_cpu_s`` of
  it is start-up, paid once per host and job) and ``pyspy_cpu_s``, the py-spy dumps it runs
  (its children's rusage), from the processor's status file;
* ``producer_threads_cpu_s`` — the producer's background threads inside the ranks (each
  measures its own ``thread_time``; reported through the ring's in-flight block);
* ``train_cpu_s`` — the ranks' CPU less those threads; ``hooks_cpu_pct`` — how much more it
  is than untraced (the hooks on the training thread and the CPU-op observer: an estimate,
  as noisy as the machine);
* ``argus_cpu_pct`` — the measured Argus CPU as a share of the training CPU;
  ``argus_steady_cpu_pct`` without the processor's start-up.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from argus import env as argus_env

__all__ = ["MODES", "run_overhead"]

MODES = ("none", "argus-semantic", "argus-ops", "argus", "profiler")
#: Model sizes: ``base`` steps take ~130 ms on one core (closer to real steps, which take
#: 0.1–10 s); ``tiny`` ~20 ms, where per-step fixed costs (hooks, processor) weigh most.
MODELS = {"base": ["--d-model", "192", "--layers", "4", "--seq", "128", "--batch", "4"],
          "tiny": ["--d-model", "128", "--layers", "2", "--seq", "64", "--batch", "4"]}


def _command(mode: str, store: Path, stats: Path, ranks: int, steps: int, op_every: int,
             model: str) -> tuple[list[str], dict]:
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "argus.workloads.train_transformer", "--steps", str(steps), "--microbatches", "2",
           "--stats", str(stats), *MODELS[model]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", argus_env.OP_SAMPLE_EVERY: str(op_every)}
    if mode == "none":
        return job, env
    if mode == "profiler":
        return [*job, "--profile"], env
    run = [sys.executable, "-m", "argus", "run", "--store", str(store), "--run-id", f"bench-{mode}"]
    if mode == "argus-semantic":
        run += ["--kernels", "off", "--no-stacks"]
    elif mode == "argus-ops":
        run += ["--kernels", "cpu_ops", "--no-stacks"]
    return [*run, "--", *job], env


def _one(mode: str, ranks: int, steps: int, op_every: int, model: str) -> dict:
    from argus.processor.status import read_all_statuses

    with tempfile.TemporaryDirectory(prefix="argus-overhead-") as tmp:
        stats, store = Path(tmp) / "stats", Path(tmp) / "store"
        stats.mkdir()
        cmd, env = _command(mode, store, stats, ranks, steps, op_every, model)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"{mode} run failed ({done.returncode}): {done.stderr[-2000:]}")
        docs = [json.loads(p.read_text()) for p in sorted(stats.glob("rank*.json"))]
        if len(docs) != ranks:
            raise RuntimeError(f"{mode}: {len(docs)} of {ranks} ranks reported their statistics")
        procs = read_all_statuses(store)
    skip = max(steps // 10, 1)
    step_s = np.median(np.array([d["step_s"][skip:] for d in docs]), axis=0)  # the job's pace per step
    growth = []
    for d in docs:
        rss = [v for s, v in d["rss_mb"] if s > steps // 2]
        growth.append(rss[-1] - rss[0] if len(rss) >= 2 else float("nan"))
    threads = sum(float(v) for p in procs for v in (p.producer_cpu_s or {}).values())
    return {"mode": mode, "step_s": step_s.tolist(), "wall_s": wall,
            "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "peak_rss_mb": max(d["peak_rss_mb"] for d in docs), "rss_growth_mb": float(np.nanmax(growth)),
            "processor_cpu_s": sum(float(p.cpu_s or 0.0) for p in procs),
            "processor_startup_cpu_s": sum(float(p.startup_cpu_s or 0.0) for p in procs),
            "pyspy_cpu_s": sum(float(p.children_cpu_s or 0.0) for p in procs),
            "producer_threads_cpu_s": threads, "train_cpu_s": sum(d["cpu_s"] for d in docs) - threads}


def run_overhead(ranks: int = 2, steps: int = 150, repeats: int = 2, modes: tuple[str, ...] = MODES,
                 op_every: int = 50, model: str = "base") -> Iterator[dict]:
    """Yield one JSON-ready row per mode (after every repeat of every mode has run)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; models are {', '.join(MODELS)}")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}; modes are {', '.join(MODES)}")
    if "none" not in modes:
        modes = ("none", *modes)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(repeats):
        for mode in modes:
            runs[mode].append(_one(mode, ranks, steps, op_every, model))
    # The mean, not the median: a channel that costs one step in N (CPU-op capture) costs
    # real time that a median would hide.
    base = float(np.mean(np.concatenate([r["step_s"] for r in runs["none"]])))
    base_train = float(np.median([r["train_cpu_s"] for r in runs["none"]]))
    previous = base
    for mode in modes:
        all_steps = np.concatenate([r["step_s"] for r in runs[mode]])
        step = float(np.mean(all_steps))
        row = {"bench": "overhead", "mode": mode, "model": model, "ranks": ranks, "steps": steps, "repeats": repeats,
               "step_ms": round(step * 1e3, 3), "median_step_ms": round(float(np.median(all_steps)) * 1e3, 3),
               "ratio": round(step / base, 4),
               "overhead_pct": round(100 * (step / base - 1), 2),
               "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs[mode]), 1),
               "rss_growth_mb": round(max(r["rss_growth_mb"] for r in runs[mode]), 1),
               "cpu_s": round(float(np.median([r["cpu_s"] for r in runs[mode]])), 2),
               "wall_s": round(float(np.median([r["wall_s"] for r in runs[mode]])), 2)}
        if mode.startswith("argus"):
            row["channel_cost_pct"] = round(100 * (step - previous) / base, 2)  # vs the mode before it
            previous = step
            med = {k: float(np.median([r[k] for r in runs[mode]]))
                   for k in ("processor_cpu_s", "processor_startup_cpu_s", "pyspy_cpu_s", "producer_threads_cpu_s",
                             "train_cpu_s")}
            own = med["processor_cpu_s"] + med["pyspy_cpu_s"] + med["producer_threads_cpu_s"]
            steady = own - med["processor_startup_cpu_s"]
            row.update({k: round(v, 3) for k, v in med.items()})
            row["argus_cpu_s"] = round(own, 3)
            row["argus_cpu_ms_per_step"] = round(1e3 * own / steps, 3)
            row["argus_cpu_pct"] = round(100 * own / max(med["train_cpu_s"], 1e-9), 2)
            # without the processor's start-up (imports, once per host and job): what a long job pays
            row["argus_steady_cpu_pct"] = round(100 * steady / max(med["train_cpu_s"], 1e-9), 2)
            row["hooks_cpu_pct"] = round(100 * (med["train_cpu_s"] / max(base_train, 1e-9) - 1), 2)
        if mode == "argus-ops":
            row["op_sample_every"] = op_every
        yield row
