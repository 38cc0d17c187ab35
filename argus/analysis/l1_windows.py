"""L1: anomalous windows in the step-time series — spikes and level shifts.

Input is the job step time per step (the median rank's step duration: robust to clock
offsets and to one rank's view) and, for spikes, each rank's series. Two detectors:

* **spikes** (``jitter``): the step time against a rolling robust baseline (median of the
  preceding steps); a step above ``spike_ratio`` × baseline is a spike.
* **level shifts** (``regression``): exact optimal partitioning (PELT) of the log step
  time with a Gaussian mean-change cost and a BIC-style penalty ``β = penalty_scale ·
  σ² · ln n``, σ estimated robustly from first differences (MAD/√2) so that spikes do not
  inflate it. On a few thousand steps this costs milliseconds.

Recognised as normal and labelled, not reported as faults: **warm-up** (the first steps,
each slower than the settled level, decreasing) and **checkpoint** steps (spikes in which
every rank runs a checkpoint/save host phase, or that recur at a fixed period).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["L1Config", "AnomalousWindow", "L1Result", "detect_windows", "pelt"]


@dataclass(frozen=True, slots=True)
class L1Config:
    spike_ratio: float = 1.3  # step ≥ this × rolling baseline is a spike
    baseline_steps: int = 8  # rolling baseline length
    penalty_scale: float = 3.0  # PELT penalty multiplier on σ²·ln n
    min_segment: int = 2  # shortest level (steps)
    min_shift: float = 0.05  # a level shift smaller than 5% is not reported
    warmup_max: int = 10  # at most this many leading steps can be warm-up


@dataclass
class AnomalousWindow:
    kind: str  # "jitter" | "regression" | "warmup" | "checkpoint"
    start_step: int
    end_step: int
    magnitude: float  # step time / baseline
    detail: str = ""
    magnitude_end: int = field(default=0, repr=False)  # internal: series index where the level ends

    def to_json(self) -> dict:
        return {"kind": self.kind, "start_step": self.start_step, "end_step": self.end_step,
                "magnitude": round(float(self.magnitude), 4), "detail": self.detail}


@dataclass
class L1Result:
    steps: np.ndarray  # step numbers
    step_time_s: np.ndarray  # job step time per step (inf: never finished)
    baseline_s: float
    windows: list[AnomalousWindow] = field(default_factory=list)
    change_points: list[int] = field(default_factory=list)  # step numbers where a level starts
    warmup_steps: list[int] = field(default_factory=list)
    checkpoint_steps: list[int] = field(default_factory=list)
    periodic_steps: list[int] = field(default_factory=list)  # checkpoints inferred from periodicity alone
    hung_steps: list[int] = field(default_factory=list)

    @property
    def faults(self) -> list[AnomalousWindow]:
        return [w for w in self.windows if w.kind in ("jitter", "regression")]

    def is_normal_step(self, step: int) -> bool:
        return step not in self.warmup_steps and step not in self.checkpoint_steps


def pelt(x: np.ndarray, penalty: float, min_size: int = 2) -> list[int]:
    """Exact change points of ``x`` (indices where a new segment starts) for a mean-shift L2
    cost: PELT, i.e. optimal partitioning with pruning of candidates that cannot win."""
    n = len(x)
    if n < 2 * min_size:
        return []
    cs = np.concatenate([[0.0], np.cumsum(x)])
    cs2 = np.concatenate([[0.0], np.cumsum(x * x)])

    def cost(s: np.ndarray, t: int) -> np.ndarray:
        seg = cs[t] - cs[s]
        return (cs2[t] - cs2[s]) - seg * seg / (t - s)

    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    last = np.zeros(n + 1, np.int64)
    cands = np.array([0], np.int64)
    for t in range(1, n + 1):
        ready = cands[t - cands >= min_size]
        waiting = cands[t - cands < min_size]
        if ready.size:
            vals = best[ready] + cost(ready, t)
            j = int(np.argmin(vals))
            best[t], last[t] = vals[j] + penalty, ready[j]
            ready = ready[vals <= best[t]]  # pruning: these can still start an optimal segment
        cands = np.concatenate([ready, waiting, [t]])
    out, t = [], n
    while t > 0:
        t = int(last[t])
        if t > 0:
            out.append(t)
    return sorted(out)


def _rolling_baseline(x: np.ndarray, k: int, q: float = 0.25) -> np.ndarray:
    """Low quantile of the preceding ``k`` finite values: when most steps are slowed
    (a pause in every other step), the median would call the slow steps normal."""
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        prev = x[max(0, i - k):i]
        prev = prev[np.isfinite(prev)]
        if prev.size:
            out[i] = np.quantile(prev, q)
    return out


def detect_windows(steps: np.ndarray, step_time_s: np.ndarray, checkpoint_steps: set[int] | None = None,
                   config: L1Config = L1Config()) -> L1Result:
    """L1 over the job step-time series. ``checkpoint_steps``: steps in which every rank ran a
    checkpoint-like host phase (from the phases table), if known."""
    steps = np.asarray(steps, np.int64)
    t = np.asarray(step_time_s, np.float64)
    res = L1Result(steps=steps, step_time_s=t, baseline_s=float("nan"))
    finite = np.isfinite(t)
    res.hung_steps = steps[~finite].tolist()
    if finite.sum() == 0:
        return res

    # Warm-up: a non-increasing run at the start, each step above the steps that follow it.
    i = 0
    while i < min(config.warmup_max, len(t) - 1) and finite[i]:
        nxt = t[i + 1:i + 4]
        nxt = nxt[np.isfinite(nxt)]
        if nxt.size == 0 or t[i] <= 1.15 * float(np.median(nxt)) or (i and t[i] > 1.02 * t[i - 1]):
            break
        i += 1
    res.warmup_steps = steps[:i].tolist()

    # Checkpoints: known from phases, or spikes recurring at a fixed period.
    res.checkpoint_steps = sorted(int(s) for s in (checkpoint_steps or set()) if s in set(steps.tolist()))
    normal = finite & ~np.isin(steps, res.warmup_steps + res.checkpoint_steps)
    res.baseline_s = float(np.median(t[normal])) if normal.any() else float(np.median(t[finite]))

    # Spikes against a rolling baseline of normal steps.
    masked = np.where(normal, t, np.nan)
    base = _rolling_baseline(masked, config.baseline_steps)
    base = np.where(np.isfinite(base), base, res.baseline_s)
    ratio = t / base
    spike = finite & (ratio >= config.spike_ratio) & ~np.isin(steps, res.warmup_steps + res.checkpoint_steps)
    if not checkpoint_steps:
        res.checkpoint_steps = res.periodic_steps = _periodic(steps[spike])
        spike &= ~np.isin(steps, res.checkpoint_steps)
        normal &= ~np.isin(steps, res.checkpoint_steps)
    for cs in res.checkpoint_steps:
        idx = int(np.flatnonzero(steps == cs)[0])
        res.windows.append(AnomalousWindow("checkpoint", cs, cs, float(ratio[idx]), "every rank saved a checkpoint"))
    if res.warmup_steps:
        res.windows.append(AnomalousWindow("warmup", res.warmup_steps[0], res.warmup_steps[-1],
                                           float(t[0] / res.baseline_s), "leading steps slower while settling"))

    # Level shifts on the log step time of normal steps; short spike runs (≤ 2 steps) are
    # jitter and are replaced by the baseline so they cannot pose as levels.
    runs = _runs(steps[spike])
    short = np.isin(steps, [v for run in runs if len(run) <= 2 for v in run])
    series_idx = np.flatnonzero(normal)
    regressions: list[AnomalousWindow] = []
    if series_idx.size >= 2 * config.min_segment:
        y = np.log(np.where(short[series_idx], base[series_idx], t[series_idx]))
        d = np.diff(y)
        sigma = max(1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2), 0.01)
        cps = pelt(y, config.penalty_scale * sigma**2 * np.log(len(y)), config.min_segment)
        bounds = [0, *cps, len(y)]
        levels = [float(np.exp(np.median(y[a:b]))) for a, b in zip(bounds[:-1], bounds[1:])]
        best = min(levels)  # faults only slow a job down: the fastest level is the healthy one
        res.baseline_s = best
        for (a, b), level in zip(zip(bounds[:-1], bounds[1:]), levels):
            if a > 0:
                res.change_points.append(int(steps[series_idx[a]]))
            if level / best - 1 < config.min_shift:
                continue
            lo, hi = int(steps[series_idx[a]]), int(steps[series_idx[b - 1]])
            if regressions and a == regressions[-1].magnitude_end:  # adjacent slow levels: one window
                prev = regressions[-1]
                prev.end_step, prev.magnitude = hi, max(prev.magnitude, level / best)
                prev.magnitude_end = b
                continue
            w = AnomalousWindow("regression", lo, hi, level / best, f"level {level:.3f} s vs {best:.3f} s")
            w.magnitude_end = b
            regressions.append(w)
    res.windows += regressions
    for run in runs:
        covered = any(r.start_step <= run[0] and run[-1] <= r.end_step for r in regressions)
        if not covered:
            in_run = np.isin(steps, run)
            res.windows.append(AnomalousWindow("jitter", run[0], run[-1], float(ratio[in_run].max()),
                                               f"{len(run)} step(s) above {config.spike_ratio}× the rolling baseline"))
    if res.hung_steps:
        res.windows.append(AnomalousWindow("regression", res.hung_steps[0], res.hung_steps[-1], float("inf"),
                                           "steps that never finished: the job stopped"))
    res.windows.sort(key=lambda w: (w.start_step, w.kind))
    return res


def _runs(values: np.ndarray) -> list[list[int]]:
    out: list[list[int]] = []
    for v in sorted(int(x) for x in values):
        if out and v == out[-1][-1] + 1:
            out[-1].append(v)
        else:
            out.append([v])
    return out


def _periodic(spike_steps: np.ndarray, min_period: int = 4) -> list[int]:
    """Spikes at one exact period (≥ 3 of them, ``min_period`` steps or more apart) are
    scheduled work such as checkpoints. Exact, because a loose period matches any dense
    scatter of spikes; root cause still blames a rank whose own busy time explains them."""
    s = np.sort(np.asarray(spike_steps, np.int64))
    if s.size < 3:
        return []
    gaps = np.diff(s)
    period = int(np.median(gaps))
    if period >= min_period and (gaps == period).mean() >= 0.8:
        return s.tolist()
    return []
