"""The order the root-cause rules run in, and the incidents they make together."""

from __future__ import annotations

from argus.analysis.hangs import hang_incident
from argus.analysis.incident import Incident, Severity
from argus.analysis.l1_windows import L1Result
from argus.analysis.signals import HwSignals
from argus.store import Attempt
from argus.topology import Topology
from argus.analysis.rootcause.context import WindowAnalysis, RootCauseConfig, _Ctx
from argus.analysis.rootcause.slow_hosts import _slow_hosts, _slow_in_pairs
from argus.analysis.rootcause.compute import _compute
from argus.analysis.rootcause.stalls import _stalls
from argus.analysis.rootcause.hang import _hang
from argus.analysis.rootcause.links import _links

__all__ = ["build_incidents"]


def build_incidents(attempt: Attempt, topology: Topology, l1: L1Result, windows: list[WindowAnalysis],
                    hw: HwSignals, step_time: dict[int, float],
                    config: RootCauseConfig = RootCauseConfig()) -> list[Incident]:  # noqa: B008 - never mutated
    ctx = _Ctx(attempt, topology, l1, hw, step_time, config)
    incidents: list[Incident] = []
    live = hang_incident(attempt, topology)  # the processors' snapshots of a real job
    if live is not None:
        incidents.append(live)
    elif l1.hung_steps:
        hang = _hang(ctx)
        if hang is not None:
            incidents.append(hang)
    compute = _compute(ctx, windows)
    compute = _slow_hosts(ctx, windows, compute)
    compute = _slow_in_pairs(ctx, windows, compute)
    incidents += compute
    # a compute "culprit" worth nothing (info) does not hide the same rank's host stall
    incidents += _stalls(ctx, windows, {r for inc in compute if inc.severity != Severity.INFO
                                        for r in inc.culprit_ranks})
    incidents += _links(ctx, windows, compute)
    incidents.sort(key=lambda i: (-i.severity_rank, -(i.slowdown_pct or 0.0), i.start_step))
    return incidents
