"""L5: what a rank's host thread did during its stalls — CPU stack samples of the stalled
steps, folded to their leaf-most frames and weighed against the same rank's normal steps (a
frame that is always there is not the cause), then classified: JIT/compile, garbage
collection, data loading, checkpoint I/O, synchronisation, or unknown, with the frames as
evidence."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc

from argus.store import Attempt

__all__ = ["StackCause", "stack_cause", "classify_frames", "CAUSE_WORDS", "CAUSES"]

MIN_CAUSE_SAMPLES = 3  # a cause is named from at least this many extra samples of one stack

#: Frame keywords → host-stall cause (first match wins, in this order).
CAUSE_WORDS = (
    ("jit_compile", ("triton/compiler", "torch/_inductor", "torch/_dynamo/convert_frame", "torch/_dynamo/symbolic_convert",
                     "compile_fx", "torch/jit/", "torch/_sources", "nvrtc", "make_cubin")),
    ("garbage_collection", ("gc_collect", "gcmodule", "(gc)", "gc.collect")),
    ("checkpoint_io", ("checkpoint", "serialization", "torch/save", "save (")),
    ("data_loading", ("dataloader", "get_batch", "queue.py", "_next_data")),
    ("synchronisation", ("synchronize", "distributed_c10d", "barrier", "wait (")),
)


CAUSES = tuple(name for name, _ in CAUSE_WORDS) + ("unknown",)


@dataclass
class StackCause:
    cause: str  # one of CAUSES
    top_frames: list[tuple[str, int]]  # (leaf-most frames, samples) elevated in the affected steps
    samples: int
    by_cause: dict[str, int] = field(default_factory=dict)  # elevated samples per cause (≥ MIN_CAUSE_SAMPLES, the rest unknown)

    def to_json(self) -> dict:
        return {"cause": self.cause, "samples": self.samples, "by_cause": self.by_cause,
                "top_frames": [{"frames": f, "samples": n} for f, n in self.top_frames]}


def _short(frames: str, depth: int = 4) -> str:
    return ";".join(frames.split(";")[-depth:])


def classify_frames(frames: str) -> str:
    """The cause a folded stack shows (any frame, first rule that matches), else unknown."""
    for name, words in CAUSE_WORDS:
        if any(w in frames for w in words):
            return name
    return "unknown"


def stack_cause(attempt: Attempt, rank: int, steps: list[int]) -> StackCause | None:
    """What ``rank``'s host thread did in ``steps`` beyond what it does in its other steps.

    Every stack holding a larger share of the samples in the stalled steps than in the others is
    classified; the
    cause holding the most of those extra samples (at least ``MIN_CAUSE_SAMPLES`` and a third
    of them) is named. Stacks differ sample to sample (a compiler walks different code each
    time), so causes are summed over stacks, not read from the single most frequent one."""
    t = attempt.read("stacks", columns=["rank", "step", "frames", "count"], filter=pc.field("rank") == rank)
    if t.num_rows == 0:
        return None
    step = t.column("step").to_numpy()
    frames = np.asarray(t.column("frames").to_pylist(), dtype=object)
    count = t.column("count").to_numpy()
    hit = np.isin(step, steps)
    if not hit.any():
        return None
    # shares of the samples, not counts per step: sampled at a constant rate, a stalled step is
    # longer and holds more samples of everything; what it does *instead* holds a larger share
    total = int(count[hit].sum())
    rest = int(count[~hit].sum())
    scores: dict[str, float] = {}
    for f, c, h in zip(frames, count, hit):
        scores[f] = scores.get(f, 0.0) + (c / total if h else -c / rest if rest else 0.0)
    elevated = sorted(((f, sc * total) for f, sc in scores.items() if sc > 0), key=lambda x: -x[1])
    if not elevated:
        return StackCause("unknown", [], total)
    by_cause: dict[str, float] = {}
    for f, n in elevated:
        c = classify_frames(f)
        by_cause[c] = by_cause.get(c, 0.0) + n
    extra = sum(by_cause.values())
    for c in [c for c, n in by_cause.items() if c != "unknown" and n < MIN_CAUSE_SAMPLES]:
        # fewer extra samples than a cause is named from: a frame every step shows, caught a
        # little more often by chance (one `synchronisation` sample beside a save's four) — not told
        by_cause["unknown"] = by_cause.get("unknown", 0.0) + by_cause.pop(c)
    named = [(n, c) for c, n in by_cause.items() if c != "unknown"]
    best_n, best = max(named) if named else (0.0, "unknown")
    cause = best if best_n >= MIN_CAUSE_SAMPLES and best_n >= extra / 3 else "unknown"
    shown = sorted(elevated, key=lambda x: (classify_frames(x[0]) != cause, -x[1]))[:5]
    return StackCause(cause, [(_short(f), int(round(n))) for f, n in shown], total,
                      {c: int(round(n)) for c, n in sorted(by_cause.items(), key=lambda kv: -kv[1])})
