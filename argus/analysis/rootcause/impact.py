"""What an incident cost the job: slowdown and GPU-hours over its steps against L1's healthy level,
spread over an intermittent fault's span, or measured against the job's clean steps."""

from __future__ import annotations

import bisect

import numpy as np

from argus.analysis.incident import run_share_pct
from argus.analysis.rootcause.context import _Ctx


def _impact(ctx: _Ctx, steps: list[int], extra_per_step_s: float | None = None) -> tuple[float, float, float]:
    """(slowdown %, GPU-hours lost, extra seconds) over ``steps``."""
    normal = [s for s in steps if ctx.normal(s)] or [s for s in steps if np.isfinite(ctx.step_time.get(s, np.nan))]
    base = ctx.l1.baseline_s
    if not normal or not np.isfinite(base) or base <= 0:
        return 0.0, 0.0, 0.0
    if extra_per_step_s is None:
        extra = float(sum(max(0.0, ctx.step_time[s] - base) for s in normal))
    else:
        extra = max(extra_per_step_s, 0.0) * len(normal)
    return 100.0 * extra / (base * len(normal)), ctx.world * extra / 3600.0, extra


def _spread_pct(ctx: _Ctx, steps: list[int], pct: float) -> float:
    """An intermittent fault's slowdown over the steps from its first to its last, as a user
    sees it (and as L4's what-if and the benches state it), from ``pct`` over ``steps`` alone
    (``_impact``'s definition: extra time over L1's level × the normal steps): 3 scattered
    steps 4% slower in 12 cost the job 1% there, not 4%."""
    n = sum(1 for s in steps if ctx.normal(s))
    if not n or not pct > 0 or not np.isfinite(ctx.l1.baseline_s):
        return pct
    span = {s: ctx.step_time[s] for s in range(steps[0], steps[-1] + 1) if s in ctx.step_time}
    return run_share_pct(span, pct / 100.0 * ctx.l1.baseline_s * n)


def _regression_covering(ctx: _Ctx, steps: list[int]) -> bool:
    return any(w.kind == "regression" and w.start_step <= max(steps) and w.end_step >= min(steps)
               for w in ctx.l1.windows if np.isfinite(w.magnitude))


def _regression_start(ctx: _Ctx) -> float:
    """The first step of L1's earliest measured regression (inf: none)."""
    return min((w.start_step for w in ctx.l1.windows if w.kind == "regression" and np.isfinite(w.magnitude)),
               default=np.inf)


def _measured_slowdown_pct(ctx: _Ctx, steps: list[int], min_clean: int = 2) -> float | None:
    """How much slower (at least) the link's steps ran than the job's clean steps (normal ones
    the link did not touch: before its onset, or between flaps), or None without enough clean
    steps (a link slow from the first step: only its transfers' excess can be measured)."""
    hit = set(steps)
    flagged = [s for s in steps if ctx.normal(s)]
    lo, hi = min(steps), max(steps)
    span = [s for s in ctx.step_time if lo <= s <= hi and ctx.normal(s)]
    intermittent = len(flagged) < 0.8 * max(len(span), 1)
    clean = [s for s in ctx.step_time if ctx.normal(s) and s not in hit and (s < lo or (intermittent and s <= hi))]
    if intermittent and flagged and ctx.l1.change_points:
        # Between flaps the job runs as it otherwise would: an intermittent finding is measured
        # against the clean steps of its own level (L1 change points), so a level shift of the
        # whole job (a host busy with other work slows every step) is not charged to the link.
        cuts = sorted(ctx.l1.change_points)
        level = lambda step: bisect.bisect_right(cuts, step)  # noqa: E731
        pools = {level(f): [s for s in ctx.step_time if ctx.normal(s) and s not in hit and level(s) == level(f)]
                 for f in flagged}
        if all(len(p) >= min_clean for p in pools.values()):
            base = {lv: float(np.median([ctx.step_time[s] for s in p])) for lv, p in pools.items()}
            d = np.array([ctx.step_time[s] - base[level(s)] for s in flagged])
            r = np.concatenate([np.array([ctx.step_time[s] for s in p]) - base[lv] for lv, p in pools.items()])
            sigma = 1.4826 * float(np.median(np.abs(np.r_[d - np.median(d), r])))
            se = 1.2533 * sigma * float(np.sqrt(1.0 / len(d) + 1.0 / len(r)))
            ref = float(np.median([base[level(s)] for s in flagged]))
            return max(0.0, 100.0 * (float(np.median(d)) - se) / ref) if ref > 0 else None
    if len(clean) < min_clean or not flagged:
        return None
    a = np.array([ctx.step_time[s] for s in flagged])
    b = np.array([ctx.step_time[s] for s in clean])
    during, before = float(np.median(a)), float(np.median(b))
    if before <= 0:
        return None
    # what the steps lost beyond the job's own step-to-step noise: the difference of medians
    # less one standard error (robust spreads pooled), so a short healthy baseline that
    # happened to run fast does not turn a slow link off the critical path into a claim
    sigma = 1.4826 * float(np.median(np.abs(np.r_[a - during, b - before])))
    se = 1.2533 * sigma * float(np.sqrt(1.0 / len(a) + 1.0 / len(b)))
    return max(0.0, 100.0 * (during - se - before) / before)
