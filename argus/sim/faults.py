"""Fault effects the simulation engine applies, vectorised over ranks.

A fault never touches the engine's natural-variance random stream, so the same seed with
and without the fault gives the same noise: the difference between the two runs is the
fault's true impact, which ``truth.json`` reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ComputeSlowdown", "LinkDegradation", "GroupLinkDegradation", "HostStall", "Hang", "HwOverride", "FaultPlan", "base_phase"]


def base_phase(phase: str) -> tuple[str, str]:
    """``'self_attention-bwd'`` → ``('self_attention', 'bwd')``; forward phases are ``'fwd'``."""
    if phase.endswith("-bwd"):
        return phase[:-4], "bwd"
    return phase, "fwd"


@dataclass(frozen=True)
class ComputeSlowdown:
    """Compute kernels of ``ranks`` take ``factor``× longer (a slow GPU, a throttled clock).

    ``phases``: base phase names affected (None = every compute phase); ``passes``: which of
    forward/backward; ``ramp``: grow linearly from 1 to ``factor`` over the steps (thermal)."""

    ranks: tuple[int, ...]
    factor: float
    steps: frozenset[int]
    phases: frozenset[str] | None = None
    passes: frozenset[str] = frozenset({"fwd", "bwd"})
    ramp: bool = False

    def factor_at(self, step: int) -> float:
        if step not in self.steps:
            return 1.0
        if not self.ramp:
            return self.factor
        lo, hi = min(self.steps), max(self.steps)
        frac = (step - lo + 1) / (hi - lo + 1)
        return 1.0 + (self.factor - 1.0) * frac

    def applies(self, phase: str) -> bool:
        name, direction = base_phase(phase)
        return direction in self.passes and (self.phases is None or name in self.phases)


@dataclass(frozen=True)
class LinkDegradation:
    """Inter-host transfers of groups with a member on ``hosts`` (host indices) take ``factor``×."""

    hosts: tuple[int, ...]
    factor: float
    steps: frozenset[int]


@dataclass(frozen=True)
class GroupLinkDegradation:
    """Every transfer of the ``kind`` group holding ``ranks`` takes ``factor``× (one ring's path
    through a degraded switch port or rail): its members are slow, their hosts' other groups not."""

    kind: str
    ranks: tuple[int, ...]
    factor: float
    steps: frozenset[int]


@dataclass(frozen=True)
class HostStall:
    """The host thread of ``ranks`` stops launching work for ``stall_ms`` in one block.

    ``mode='sparse'`` spreads the stall between every kernel launch of the block (JIT
    compilation interleaved with launches: kernels sparse, GPU mostly idle);
    ``mode='pause'`` stops once before the block's first kernel (a GC pause)."""

    ranks: tuple[int, ...]
    steps: frozenset[int]
    block: str  # 'F' or 'B'
    microbatch: int
    stall_ms: float
    mode: str
    frames: str
    per_step_ms: tuple[tuple[int, float], ...] = ()  # optional per-step override

    def stall_ms_at(self, step: int) -> float:
        for s, ms in self.per_step_ms:
            if s == step:
                return ms
        return self.stall_ms


@dataclass(frozen=True)
class Hang:
    """``rank`` never returns from its data loader in ``step``: it never joins a collective."""

    rank: int
    step: int
    frames: str


@dataclass(frozen=True)
class HwOverride:
    """What the hardware channel reports for ``ranks``' GPUs at given steps (a degraded PCIe
    link, a thermal ramp, a NIC port alarm)."""

    ranks: tuple[int, ...]
    metric: str
    values: tuple[tuple[int, float], ...]  # (step, value)


@dataclass
class FaultPlan:
    """All effects of a scenario, queried by the engine once per step (and cached)."""

    world_size: int
    n_hosts: int
    slowdowns: list[ComputeSlowdown] = field(default_factory=list)
    links: list[LinkDegradation] = field(default_factory=list)
    group_links: list[GroupLinkDegradation] = field(default_factory=list)
    stalls: list[HostStall] = field(default_factory=list)
    hang: Hang | None = None
    hw: list[HwOverride] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._mult_cache: dict[tuple[int, str], np.ndarray | None] = {}

    @property
    def empty(self) -> bool:
        return not (self.slowdowns or self.links or self.group_links or self.stalls or self.hang)

    def compute_multiplier(self, step: int, phase: str) -> np.ndarray | None:
        """Per-rank duration multiplier for ``phase`` in ``step``; None when all are 1."""
        key = (step, phase)
        if key not in self._mult_cache:
            mult = None
            for eff in self.slowdowns:
                f = eff.factor_at(step)
                if f != 1.0 and eff.applies(phase):
                    if mult is None:
                        mult = np.ones(self.world_size)
                    mult[list(eff.ranks)] *= f
            if len(self._mult_cache) > 4096:
                self._mult_cache.clear()
            self._mult_cache[key] = mult
        return self._mult_cache[key]

    def link_factors(self, step: int) -> np.ndarray | None:
        """Per-host transfer-time factor for ``step``; None when every link is healthy."""
        out = None
        for eff in self.links:
            if step in eff.steps:
                if out is None:
                    out = np.ones(self.n_hosts)
                out[list(eff.hosts)] = np.maximum(out[list(eff.hosts)], eff.factor)
        return out

    def group_links_at(self, step: int) -> list[GroupLinkDegradation]:
        return [g for g in self.group_links if step in g.steps]

    def stalls_at(self, step: int) -> list[HostStall]:
        return [s for s in self.stalls if step in s.steps]

    def hw_at(self, step: int) -> list[tuple[tuple[int, ...], str, float]]:
        return [(o.ranks, o.metric, v) for o in self.hw for s, v in o.values if s == step]

    def hang_at(self, step: int) -> Hang | None:
        return self.hang if self.hang is not None and self.hang.step == step else None

