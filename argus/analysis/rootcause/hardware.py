"""The hosts' own signals as the link and stall rules read them: CPU and I/O pressure standing out
from the other hosts', link error counters, PCIe links trained down, NIC ports down in slow steps."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from argus.analysis.signals import PRESSURE_PCT
from argus.analysis.rootcause.context import _Ctx

__all__ = ["PRESSURE_MARGIN"]


#: A host's CPU pressure explains a slow link as well as the link does when it is at least
#: ``signals.PRESSURE_PCT`` and this many points above the other hosts' (like with like: on one
#: machine shared by every "host", or a cluster all busy alike, pressure tells no host apart)
PRESSURE_MARGIN = 10.0


def _host_pressure(ctx: _Ctx, table: dict[int, dict[int, float]], lo: int, hi: int) -> dict[str, float]:
    """Host → its worst pressure (%) sampled in steps ``lo..hi`` (hosts without samples: absent)."""
    out: dict[str, float] = {}
    for r, by_step in table.items():
        vals = [v for s_, v in by_step.items() if lo <= s_ <= hi]
        if vals and 0 <= r < len(ctx.topology.hosts):
            h = str(ctx.topology.hosts[r])
            out[h] = max(out.get(h, 0.0), max(vals))
    return out


def _pressure_standing_out(ctx: _Ctx, table: dict[int, dict[int, float]], hosts: list[str], lo: int,
                           hi: int) -> dict[str, tuple[float, float]]:
    """Hosts among ``hosts`` under pressure while the others were not: host → (its %, others' median %)."""
    per = _host_pressure(ctx, table, lo, hi)
    others = [v for h, v in per.items() if h not in hosts]
    if not others:
        return {}
    base = float(np.median(others))
    return {h: (per[h], base) for h in hosts if h in per and per[h] >= PRESSURE_PCT and per[h] - base >= PRESSURE_MARGIN}


def _link_error_hosts(ctx: _Ctx, lo: int | None = None, hi: int | None = None) -> dict[str, float]:
    """Host → link errors counted (InfiniBand port counters, NVLink) in steps ``lo..hi`` (all: None)."""
    out: dict[str, float] = {}
    for r, by_step in ctx.hw.link_errors.items():
        n = sum(v for s_, v in by_step.items() if (lo is None or s_ >= lo) and (hi is None or s_ <= hi))
        if n > 0 and 0 <= r < len(ctx.topology.hosts):
            h = str(ctx.topology.hosts[r])
            out[h] = out.get(h, 0.0) + n
    return out


def _pcie_steps_by_host(ctx: _Ctx) -> dict[str, set[int]]:
    """Host → the steps in which one of its ranks' PCIe links ran below its maximum."""
    out: dict[str, set[int]] = defaultdict(set)
    for r, steps in ctx.hw.pcie_steps.items():
        out[str(ctx.topology.hosts[r])].update(int(s) for s in steps if s >= 0)
    return dict(out)


def _nic_down_slow_steps(ctx: _Ctx, min_slowdown: float = 0.05) -> dict[int, set[str]]:
    """Steps in which a host reported a NIC port down *and* the job's step was at least
    ``min_slowdown`` above its healthy level → that host. A port down in a step of normal
    speed (a redundant port, a bonded link) is not a slow link."""
    base = ctx.l1.baseline_s
    out: dict[int, set[str]] = defaultdict(set)
    if not np.isfinite(base) or base <= 0:
        return out
    for rank, steps in ctx.hw.nic_down.items():
        for step in steps:
            t = ctx.step_time.get(int(step), np.nan)
            if np.isfinite(t) and t >= (1 + min_slowdown) * base and step not in ctx.l1.warmup_steps:
                out[int(step)].add(str(ctx.topology.hosts[rank]))
    return out
