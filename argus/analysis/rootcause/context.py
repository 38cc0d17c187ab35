"""What every root-cause rule reads: one window's L2/L3 results, the rules' thresholds, and the
attempt-wide context (topology, L1, hardware signals, step times) they share."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus.analysis.l1_windows import L1Result
from argus.analysis.l2_stragglers import L2Result
from argus.analysis.l3_kernels import L3Result
from argus.analysis.signals import HwSignals
from argus.analysis.evidence import l1_window
from argus.store import Attempt
from argus.topology import Topology

__all__ = ["WindowAnalysis", "RootCauseConfig"]


@dataclass
class WindowAnalysis:
    lo: int
    hi: int
    l2: L2Result
    l3: L3Result | None
    #: rank → compute-kernel time in the window (Σ launches × median duration), also where L3
    #: did not run (a warm-up window): a rank's own baseline before a regression
    kernel_time_ns: dict[int, float] | None = None


@dataclass(frozen=True, slots=True)
class RootCauseConfig:
    stall_share: float = 0.2  # an intermittent excess this share of the step is a host stall
    one_off_share: float = 0.5  # … but a single unexplained one must reach this share to be reported
    min_kernels: int = 2  # L3 alone needs this many slower kernels on a rank …
    min_busy_ratio: float = 1.15  # … and its total kernel time this far above its peers'
    pass_ratio: float = 1.25  # one pass this much slower than peers …
    other_pass: float = 1.1  # … while the other is within this: pipeline imbalance
    module_ratio: float = 1.5  # a module this much slower than its peers' names the phase


@dataclass
class _Ctx:
    attempt: Attempt
    topology: Topology
    l1: L1Result
    hw: HwSignals
    step_time: dict[int, float]
    config: RootCauseConfig
    world: int = field(init=False)

    def __post_init__(self) -> None:
        self.world = self.topology.world_size

    def hosts_of(self, ranks) -> list[str]:
        return sorted({str(self.topology.hosts[r]) for r in ranks})

    def gpus_of(self, ranks) -> list[str]:
        return [str(self.topology.gpu_uuids[r]) for r in sorted(ranks)]

    def normal(self, step: int) -> bool:
        return self.l1.is_normal_step(step) and np.isfinite(self.step_time.get(step, np.nan))

    def pair(self, rank: int) -> bool:
        """Is the rank's peer set just itself and one other?"""
        return len(self.topology.layout.peer_set(rank)) <= 2

    def stall_candidate(self, step: int) -> bool:
        """Normal, or a spike called periodic only for its timing: one rank's excess there is
        a recurring stall, not a checkpoint (a checkpoint keeps every rank busy)."""
        return self.normal(step) or (step in self.l1.periodic_steps and np.isfinite(self.step_time.get(step, np.nan)))


def _l1_evidence(ctx: _Ctx, lo: int, hi: int) -> list[dict]:
    return [l1_window(w) for w in ctx.l1.windows
            if w.kind in ("jitter", "regression") and w.start_step <= hi and w.end_step >= lo][:4]


def _rank_list(ranks: list[int], head: int = 8) -> str:
    return ", ".join(map(str, ranks[:head])) + (f" … ({len(ranks)})" if len(ranks) > head else "")
