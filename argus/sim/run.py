"""Run a scenario and write it to a store, with ``truth.json`` beside it.

The truth includes the fault's real impact: the same seed is simulated a second time
without the fault (same natural noise, see ``faults.py``) and the step times compared.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from argus.errors import StoreError
from argus.sim.config import SimConfig
from argus.sim.engine import Engine
from argus.sim.records import StepRecords
from argus.sim.scenarios import ScenarioContext, get_scenario, parse_params, scenario_rng
from argus.store import KernelSummaries, Store, WindowData, WindowWriter
from argus.store.files import write_bytes_atomic
from argus.topology import RunIdentity, Topology
from argus.uniques import sorted_unique

__all__ = ["SimulationResult", "prepare", "simulate_to_store", "job_step_times", "TRUTH_FILE"]

TRUTH_FILE = "truth.json"


@dataclass
class SimulationResult:
    truth: dict[str, Any]
    store_path: Path | None
    steps_done: int = 0
    phase_events: int = 0
    kernel_events: int = 0
    wall_s: float = 0.0
    bytes_written: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def prepare(config: SimConfig, scenario: str, params: list[str] | dict[str, Any] | None = None):
    """Build the topology, fault plan and truth records of ``scenario`` for ``config``."""
    sc = get_scenario(scenario)
    layout = config.resolve_layout()
    topology = Topology.uniform(layout, config.hosts_gpus, seed=str(config.seed))
    ctx = ScenarioContext(config, layout, topology, scenario_rng(config.seed, scenario), parse_params(sc, params))
    plan, faults = sc.build(ctx)
    return sc, ctx, plan, faults


def job_step_times(rec: StepRecords) -> float:
    """Job step time of one step in seconds: the median rank's step duration (inf if hung)."""
    dur = rec.step_end - rec.step_start
    if not np.isfinite(dur).all():
        return float("inf")
    return float(np.median(dur)) / 1e9


def simulate_to_store(config: SimConfig, scenario: str, out: str | Path,
                      params: list[str] | dict[str, Any] | None = None,
                      on_step: Callable[[StepRecords], None] | None = None,
                      write: bool = True, baseline: bool = True) -> SimulationResult:
    """Simulate ``scenario`` and write store + ``truth.json`` to ``out`` (unless ``write`` is
    False, for benchmarks that only generate). Refuses a directory that already holds one."""
    out = Path(out)
    sc, ctx, plan, faults = prepare(config, scenario, params)
    attempt = writer = None
    if write:
        if (out / TRUTH_FILE).exists():
            raise StoreError(f"{out}: already holds a simulation ({TRUTH_FILE}); choose a new directory")
        store = Store.create(out)
        run_id = config.run_id or f"sim-{scenario}-s{config.seed}"
        attempt = store.create_attempt(RunIdentity(run_id, "0"), ctx.topology, source="simulator",
                                       extra={"scenario": scenario, "seed": config.seed})
        writer = WindowWriter(attempt, "sim", raw_kernels=config.kernels)
    t0 = time.perf_counter()
    result = SimulationResult(truth={}, store_path=out if write else None)
    faulty: list[float] = []
    engine = Engine(config, plan, emit=True, topology=ctx.topology)
    window: list[dict[str, np.ndarray]] = []
    spill: _Spill | None = None
    try:
        for rec in engine.run():
            result.steps_done += 1
            result.phase_events += rec.n_phase_events
            result.kernel_events += rec.n_kernel_events
            faulty.append(job_step_times(rec))
            if writer is not None:
                w = rec.step  # the records of one step are one unit, as a processor's window is
                writer.write(WindowData(window=w, start_step=w, end_step=w, steps=rec.steps_table(),
                                        phases=rec.phases_table(), kernels=rec.kernels_table() if config.kernels else None,
                                        stacks=rec.stacks, hw=rec.hw))
                if config.summaries:
                    compact = _compact_kernels(rec)
                    if len(compact["rank"]) > SPILL_EVENTS:
                        spill = spill or _Spill(out)
                        compact = spill.keep(compact)
                    window.append(compact)
                    del compact
                    if (rec.step + 1) % config.window_steps == 0:
                        _write_summaries(writer, window, engine.names.names, config.window_steps)
                        window = []
                        if spill is not None:
                            spill.close()
                            spill = None
            if on_step is not None:
                on_step(rec)
        if writer is not None and window:
            _write_summaries(writer, window, engine.names.names, config.window_steps)
    finally:  # a failed or interrupted run leaves no spilled steps behind
        if spill is not None:
            spill.close()
    base: list[float] = faulty
    if baseline and not plan.empty:
        base = [job_step_times(r) for r in Engine(config, None, emit=False, topology=ctx.topology).run()]
    result.wall_s = time.perf_counter() - t0
    result.truth = _truth_document(config, sc.name, sc.summary, sc.fault_class, ctx, faults, faulty, base)
    if writer is not None and attempt is not None:
        result.bytes_written = writer.writer.bytes_written
        write_bytes_atomic(out / TRUTH_FILE, json.dumps(result.truth, indent=2).encode())
    return result


def _compact_kernels(rec: StepRecords) -> dict[str, np.ndarray]:
    """The columns compression needs, in small dtypes (a window of 10k ranks is ~50 M events),
    in rank order (stable: each rank's events keep their order), so that a block of ranks is a
    slice of every step."""
    a = rec.kernel_arrays()
    keep = np.isfinite(a["start"])
    rank = a["rank"][keep].astype(np.int32)
    order = np.argsort(rank, kind="stable")
    dur = np.where(np.isfinite(a["dur"]), a["dur"], -1.0)
    return {"step": rec.step, "rank": rank[order], "stream": a["stream"][keep][order].astype(np.int16),
            "name": a["name_id"][keep][order].astype(np.int32), "kind": a["kind_id"][keep][order].astype(np.int32),
            "dur": np.rint(dur[keep][order]).astype(np.int64)}


#: A step with more compacted kernel events than this waits for its window's close on disk, not in
#: memory: at 102,400 ranks a step is 94 M events (2 GB) and a window of five held the simulator at
#: 24 GB, past this machine's memory, when it was killed.
SPILL_EVENTS = 10_000_000


class _Spill:
    """A window's compacted kernel steps kept in a temporary directory and read back as memory
    maps (a block of ranks is a slice of each: only its pages are read)."""

    def __init__(self, near: Path) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix=".argus-sim-spill-", dir=near))

    def keep(self, step: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, Any] = {"step": step["step"]}
        for k, v in step.items():
            if k != "step":
                path = self.dir / f"{int(step['step'])}-{k}.npy"
                np.save(path, v)
                out[k] = np.load(path, mmap_mode="r")
        return out

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _write_summaries(writer: WindowWriter, steps: list[dict[str, np.ndarray]], names: list[str], window_steps: int,
                     ranks_per_block: int = 1024) -> None:
    """Compress one window of kernels, a block of ranks at a time, as the processors would,
    and write the window's summaries as one unit (its raw kernels went with their steps)."""
    import pyarrow as pa

    from argus.compress import summarize_kernel_arrays

    first = int(steps[0]["step"])
    index = first // window_steps
    hi_rank = max((int(s["rank"][-1]) + 1 for s in steps if len(s["rank"])), default=0)
    summaries: list[pa.Table] = []
    sketches: list[pa.Table] = []
    for lo in range(0, hi_rank, ranks_per_block):
        # one block of ranks from each step (a slice: the steps are in rank order), never a copy of the window
        # (bounds in the ranks' own dtype: other ones make numpy convert the whole step first)
        cuts = [np.searchsorted(s["rank"], np.array([lo, lo + ranks_per_block], s["rank"].dtype)) for s in steps]
        cols = {k: np.concatenate([np.asarray(s[k][a:b]) for s, (a, b) in zip(steps, cuts)])
                for k in ("rank", "stream", "name", "kind", "dur")}
        if len(cols["rank"]) == 0:
            continue
        block_summaries, block_sketches = summarize_kernel_arrays(
            cols["rank"], cols["stream"], cols["name"], cols["kind"], cols["dur"],
            names, names, index, first, first + len(steps) - 1)
        summaries.append(block_summaries)
        sketches.append(block_sketches)
    if summaries:
        writer.write(WindowData(window=index, start_step=first, end_step=first + len(steps) - 1),
                     KernelSummaries(pa.concat_tables(summaries), pa.concat_tables(sketches)))


def _truth_document(config: SimConfig, name: str, summary: str, klass: str, ctx: ScenarioContext,
                    faults: list[dict[str, Any]], faulty: list[float], base: list[float]) -> dict[str, Any]:
    layout = ctx.layout
    n = layout.world_size
    faulty_arr = np.array(faulty)
    base_arr = np.array(base[: len(faulty)])
    for f in faults:
        lo, hi = f["window"]["start_step"], f["window"]["end_step"]
        steps = [s for s in f["steps"] if s < len(faulty_arr)]
        fa, ba = faulty_arr[steps], base_arr[steps]
        if not np.isfinite(fa).all():
            f["impact"] = {"stalled": True, "slowdown_pct": None, "gpu_hours_lost": None}
        else:
            extra = float((fa - ba).sum())
            f["impact"] = {
                "stalled": False,
                "slowdown_pct": round(100.0 * extra / float(ba.sum()), 3) if ba.sum() > 0 else 0.0,
                "extra_s": round(extra, 6),
                "gpu_hours_lost": round(n * extra / 3600.0, 6),
            }
        f["window"] = {"start_step": lo, "end_step": hi}
    cfg = asdict(config)
    cfg.pop("workload")
    return {
        "scenario": name,
        "description": summary,
        "class": klass,
        "seed": config.seed,
        "ranks": n,
        "steps": config.steps,
        "layout": str(layout),
        "order": layout.order_str,
        "gpus_per_host": config.hosts_gpus,
        "hosts": len(sorted_unique(ctx.topology.hosts)),
        "params": {k: v for k, v in ctx.params.items()},
        "faults": faults,
        "natural": {
            "warmup_steps": list(range(min(config.warmup_steps, config.steps))),
            "checkpoint_steps": [s for s in range(config.steps) if config.is_checkpoint_step(s)],
            "moe_routing_imbalance": layout.ep > 1,
            "moe_alpha": config.moe_alpha,
            "seqlen_sigma": config.seqlen_sigma,
            "dataloader_spike_prob": config.dataloader_spike_prob,
            "clock_skew_ms": config.clock_skew_ms,
        },
        "step_time_s": [None if not np.isfinite(x) else round(x, 6) for x in faulty],
        "baseline_step_time_s": [None if not np.isfinite(x) else round(x, 6) for x in base[: len(faulty)]],
        "config": cfg,
    }
