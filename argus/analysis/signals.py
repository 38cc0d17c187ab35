"""Independent evidence outside the timing data: hardware telemetry and CPU stack samples.

Hardware: a PCIe link below its maximum generation or width, NIC ports reported down,
thermal throttling. Stacks: what a rank's host thread did in given steps, folded into top
frames and classified (JIT/compile, garbage collection, data loading, checkpoint I/O,
synchronisation) against the same rank's normal steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc

from argus.store import Attempt

__all__ = ["HwSignals", "load_hw_signals", "StackCause", "stack_cause", "CAUSE_WORDS"]

MIN_CAUSE_SAMPLES = 3  # a cause is named from at least this many extra samples of one stack

#: Frame keywords → host-stall cause (first match wins, in this order).
CAUSE_WORDS = (
    ("jit_compile", ("triton/compiler", "torch/_inductor", "torch/_dynamo/convert_frame", "torch/_dynamo/symbolic_convert",
                     "compile_fx", "torch/jit/", "nvrtc", "make_cubin")),
    ("garbage_collection", ("gc_collect", "gcmodule", "(gc)", "gc.collect")),
    ("checkpoint_io", ("checkpoint", "serialization", "torch/save", "save (")),
    ("data_loading", ("dataloader", "get_batch", "queue.py", "_next_data")),
    ("synchronisation", ("synchronize", "distributed_c10d", "barrier", "wait (")),
)


@dataclass
class HwSignals:
    pcie_degraded: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank → (gen, width) at worst
    nic_down: dict[int, list[int]] = field(default_factory=dict)  # rank → steps (sample index) with port down
    thermal: dict[int, float] = field(default_factory=dict)  # rank → max temperature when throttled

    @property
    def empty(self) -> bool:
        return not (self.pcie_degraded or self.nic_down or self.thermal)


def load_hw_signals(attempt: Attempt, step_of_ts=None) -> HwSignals:
    t = attempt.read("hw", columns=["rank", "ts_ns", "metric", "value"])
    out = HwSignals()
    if t.num_rows == 0:
        return out
    rank = t.column("rank").to_numpy()
    metric = np.asarray(t.column("metric").to_pylist(), dtype=object)
    value = t.column("value").to_numpy()
    ts = t.column("ts_ns").to_numpy()

    def per_rank(name: str, reducer) -> dict[int, float]:
        m = metric == name
        if not m.any():
            return {}
        r, v = rank[m].astype(np.int64), value[m]
        out_v = np.full(int(r.max()) + 1, np.inf if reducer is np.min else -np.inf)
        (np.minimum if reducer is np.min else np.maximum).at(out_v, r, v)
        present = np.unique(r)
        return dict(zip(present.tolist(), out_v[present].tolist()))

    gen, gen_max = per_rank("pcie_gen", np.min), per_rank("pcie_gen_max", np.max)
    width, width_max = per_rank("pcie_width", np.min), per_rank("pcie_width_max", np.max)
    for r in set(gen) | set(width):
        g, gm = gen.get(r, np.nan), gen_max.get(r, np.nan)
        w, wm = width.get(r, np.nan), width_max.get(r, np.nan)
        if (g < gm) or (w < wm):
            out.pcie_degraded[r] = (g, w)
    m = (metric == "nic_port_up") & (value < 0.5)
    for r in np.unique(rank[m]):
        tss = ts[m & (rank == r)]
        out.nic_down[int(r)] = [int(step_of_ts(int(r), int(x))) if step_of_ts else int(x) for x in tss]
    thr = per_rank("throttle_reasons", np.max)
    temp = per_rank("temperature_c", np.max)
    for r, v in thr.items():
        if v > 0 and temp.get(r, 0) >= 80:
            out.thermal[r] = temp[r]
    return out


@dataclass
class StackCause:
    cause: str  # one of CAUSE_WORDS' keys, or "unknown"
    top_frames: list[tuple[str, int]]  # (leaf-most frames, samples) elevated in the affected steps
    samples: int

    def to_json(self) -> dict:
        return {"cause": self.cause, "samples": self.samples,
                "top_frames": [{"frames": f, "samples": n} for f, n in self.top_frames]}


def _short(frames: str, depth: int = 4) -> str:
    return ";".join(frames.split(";")[-depth:])


def stack_cause(attempt: Attempt, rank: int, steps: list[int]) -> StackCause | None:
    """What ``rank``'s host thread did in ``steps`` beyond what it does in its other steps."""
    t = attempt.read("stacks", columns=["rank", "step", "frames", "count"], filter=pc.field("rank") == rank)
    if t.num_rows == 0:
        return None
    step = t.column("step").to_numpy()
    frames = np.asarray(t.column("frames").to_pylist(), dtype=object)
    count = t.column("count").to_numpy()
    hit = np.isin(step, steps)
    if not hit.any():
        return None
    normal_steps = max(len(np.unique(step[~hit])), 1)
    hit_steps = max(len(np.unique(step[hit])), 1)
    scores: dict[str, float] = {}
    for f, c, h in zip(frames, count, hit):
        scores[f] = scores.get(f, 0.0) + (c / hit_steps if h else -c / normal_steps)
    elevated = sorted(((f, s) for f, s in scores.items() if s > 0), key=lambda x: -x[1])[:5]
    if not elevated:
        return StackCause("unknown", [], int(count[hit].sum()))
    cause = "unknown"
    if elevated[0][1] * hit_steps < MIN_CAUSE_SAMPLES:  # too few samples to name a cause
        return StackCause(cause, [(_short(f), int(round(s * hit_steps))) for f, s in elevated], int(count[hit].sum()))
    for name, words in CAUSE_WORDS:
        if any(w in elevated[0][0] for w in words):
            cause = name
            break
    return StackCause(cause, [(_short(f), int(round(s * hit_steps))) for f, s in elevated], int(count[hit].sum()))
