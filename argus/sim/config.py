"""Simulator configuration and the default parallel layout for a world size."""

from __future__ import annotations

from dataclasses import dataclass, field

from argus.errors import ConfigError
from argus.store.window import WINDOW_STEPS
from argus.sim.workload import Workload
from argus.topology import Layout, parse_layout

__all__ = ["SimConfig", "default_layout"]

# (min world, tp, pp, ep): realistic shapes for MoE LLM jobs; dp takes the rest.
_SHAPES = ((8192, 8, 8, 8), (1024, 8, 4, 8), (256, 4, 4, 4), (32, 2, 2, 4), (8, 2, 2, 2), (4, 2, 2, 1), (2, 1, 2, 1))


def default_layout(world_size: int) -> Layout:
    """A Megatron-like MoE layout for ``world_size`` ranks (10,240 → tp=8,pp=8,ep=8,dp=20)."""
    if world_size < 1:
        raise ConfigError(f"world size must be at least 1, got {world_size}")
    for min_world, tp, pp, ep in _SHAPES:
        if world_size < min_world:
            continue
        # Shrink ep, then tp, then pp until the product divides the world.
        for ep_ in (ep, ep // 2, ep // 4, 1):
            for tp_ in (tp, tp // 2, 1):
                for pp_ in (pp, pp // 2, 1):
                    if min(ep_, tp_, pp_) >= 1 and world_size % (tp_ * pp_ * ep_) == 0:
                        return parse_layout(f"tp={tp_},pp={pp_},ep={ep_}", world_size=world_size)
    return parse_layout("", world_size=world_size)


@dataclass(kw_only=True, slots=True)
class SimConfig:
    """Everything that shapes one simulated job. Defaults give a realistic MoE LLM job."""

    ranks: int = 64
    steps: int = 20
    layout: str | None = None  # e.g. "tp=2,pp=4,dp=8"; default: :func:`default_layout`
    order: str | None = None  # rank order, fastest axis first; default tp-cp-ep-dp-pp
    gpus_per_host: int = 8
    layers: int = 4  # transformer layers per pipeline stage
    microbatches: int = 8
    #: model chunks per pipeline stage (Megatron's virtual pipeline size): > 1 runs the
    #: interleaved 1F1B schedule — each stage holds ``virtual_stages`` chunks of
    #: ``layers / virtual_stages`` layers, and the last stage sends to the first between chunks
    virtual_stages: int = 1
    seed: int = 0
    kernels: bool = False  # write raw kernel events to the store (small runs)
    summaries: bool = True  # write compressed kernel summaries and sketches per window
    window_steps: int = WINDOW_STEPS  # steps per window of kernel summaries (as the processor's default)
    clock_skew_ms: float = 2.0  # per-host clock offsets, uniform in ±this
    warmup_steps: int = 2  # first steps are slower for everyone (allocator, autotuning)
    checkpoint_every: int = 10  # a checkpoint-save step every N steps (0: never)
    moe_alpha: float = 40.0  # Dirichlet concentration of MoE routing (lower: more imbalance)
    seqlen_sigma: float = 0.08  # lognormal spread of per-microbatch sequence length
    dataloader_spike_prob: float = 0.01  # chance per rank-step of a 20–80 ms loader hiccup
    jitter: float = 0.02  # lognormal sigma of each kernel launch's duration
    stack_rate_hz: float = 20.0  # always-on CPU stack sampling rate
    #: Megatron's own process groups at the step's tail, as Megatron-core runs them: the tied
    #: embedding's gradient all-reduce over EMBEDDING_GROUP (first and last stage, pp > 1) and
    #: the gradient-norm all-reduce over MODEL_PARALLEL_GROUP (tp × pp) instead of the world.
    #: Neither is a layout kind: the analysis must judge them apart (their own kinds).
    megatron_groups: bool = False
    run_id: str | None = None
    workload: Workload = field(default_factory=Workload)

    def __post_init__(self) -> None:
        for name in ("ranks", "steps", "layers", "microbatches", "gpus_per_host", "window_steps", "virtual_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"simulator {name} must be a positive integer, got {value!r}")
        for name in ("clock_skew_ms", "seqlen_sigma", "jitter", "stack_rate_hz", "dataloader_spike_prob"):
            if getattr(self, name) < 0:
                raise ConfigError(f"simulator {name} must be >= 0, got {getattr(self, name)}")
        if self.moe_alpha <= 0:
            raise ConfigError(f"simulator moe_alpha must be > 0, got {self.moe_alpha}")
        if self.warmup_steps < 0 or self.checkpoint_every < 0:
            raise ConfigError("simulator warmup_steps and checkpoint_every must be >= 0")
        layout = self.resolve_layout()  # fail early on a bad layout
        if self.virtual_stages > 1:
            if layout.pp < 2:
                raise ConfigError(f"virtual_stages={self.virtual_stages} needs a pipeline (pp >= 2), got {layout}")
            if self.layers % self.virtual_stages:
                raise ConfigError(f"layers={self.layers} must divide into virtual_stages={self.virtual_stages} chunks")
            if self.microbatches % layout.pp:
                raise ConfigError(f"the interleaved schedule runs microbatches in groups of pp={layout.pp}: "
                                  f"microbatches={self.microbatches} is not a multiple")

    def resolve_layout(self) -> Layout:
        if self.layout:
            return parse_layout(self.layout, world_size=self.ranks, order=self.order)
        layout = default_layout(self.ranks)
        if self.order:
            layout = parse_layout(str(layout), world_size=self.ranks, order=self.order)
        return layout

    @property
    def hosts_gpus(self) -> int:
        return min(self.gpus_per_host, self.ranks)

    def warmup_factor(self, step: int) -> float:
        """Everyone's compute is slower in the first steps (3×, then easing to 1)."""
        if step >= self.warmup_steps:
            return 1.0
        return 1.0 + 2.0 * (self.warmup_steps - step) / max(self.warmup_steps, 1)

    def is_checkpoint_step(self, step: int) -> bool:
        return self.checkpoint_every > 0 and step > 0 and step % self.checkpoint_every == 0
