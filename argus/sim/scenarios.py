"""Built-in scenarios: healthy variance and parameterised faults, each with its ground truth.

Names are a contract (tests and outside tools use them). Every builder returns the
:class:`FaultPlan` the engine applies and the truth records ``truth.json`` lists. Culprits
are chosen from the scenario's own random stream (seed + name), so the same seed gives the
same culprits whatever the natural noise does. Parameters can be overridden with
``--param key=value``; ``ranks``/``hosts`` take comma-separated lists.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from argus.errors import ScenarioError
from argus.sim.config import SimConfig
from argus.sim.faults import (ComputeSlowdown, FaultPlan, GroupLinkDegradation, Hang, HostStall, HwOverride,
                              LinkDegradation)
from argus.sim.stacks import FRAMES
from argus.sim.workload import CommOp, ComputeOp, Workload
from argus.topology import Layout, Topology
from argus.vocab import GroupKind
from argus.uniques import sorted_unique

__all__ = ["Scenario", "ScenarioContext", "SCENARIOS", "get_scenario", "parse_params"]


@dataclass(frozen=True)
class ScenarioContext:
    config: SimConfig
    layout: Layout
    topology: Topology
    rng: np.random.Generator
    params: dict[str, Any]

    @property
    def steps(self) -> int:
        return self.config.steps

    @property
    def host_index(self) -> np.ndarray:
        return np.unique(self.topology.hosts, return_inverse=True)[1]

    @property
    def n_hosts(self) -> int:
        return len(sorted_unique(self.topology.hosts))

    def p(self, key: str) -> Any:
        return self.params[key]

    def ranks_param(self, default: Callable[[], list[int]]) -> list[int]:
        value = self.params.get("ranks")
        if value in (None, "", "auto"):
            return sorted(int(r) for r in default())
        ranks = sorted({int(r) for r in str(value).split(",") if r.strip()})
        bad = [r for r in ranks if not 0 <= r < self.layout.world_size]
        if bad or not ranks:
            raise ScenarioError(f"ranks={value!r}: ranks must be in 0..{self.layout.world_size - 1}")
        return ranks

    def hosts_param(self, default: Callable[[], list[int]]) -> list[int]:
        value = self.params.get("hosts")
        names = sorted(sorted_unique(self.topology.hosts).tolist())
        if value in (None, "", "auto"):
            return sorted(int(h) for h in default())
        out = []
        for h in str(value).split(","):
            h = h.strip()
            if h in names:
                out.append(names.index(h))
            elif h.isdigit() and int(h) < len(names):
                out.append(int(h))
            else:
                raise ScenarioError(f"hosts={value!r}: unknown host {h!r} (hosts are {names[0]}..{names[-1]} or indices)")
        return sorted(set(out))

    def window(self, default_start: int) -> tuple[int, int]:
        start = self.params.get("start_step")
        end = self.params.get("end_step")
        start = default_start if start in (None, "auto") else int(start)
        end = self.steps - 1 if end in (None, "auto") else int(end)
        if not 0 <= start <= end < self.steps:
            raise ScenarioError(f"fault window {start}..{end} is outside steps 0..{self.steps - 1}")
        return start, end

    def onset(self) -> int:
        """Default fault onset: a quarter in, after warm-up, so a baseline exists before it."""
        return min(max(self.config.warmup_steps + 1, self.steps // 4), self.steps - 1)

    def ranks_on_hosts(self, hosts: list[int]) -> list[int]:
        return np.flatnonzero(np.isin(self.host_index, hosts)).tolist()


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    fault_class: str
    build: Callable[[ScenarioContext], tuple[FaultPlan, list[dict[str, Any]]]]
    defaults: dict[str, Any] = field(default_factory=dict)


def _truth(ctx: ScenarioContext, klass: str, ranks: list[int], steps: list[int], phase: str | None,
           kernels: list[str], microbatch: int | None = None, hosts: list[int] | None = None,
           **params: Any) -> dict[str, Any]:
    topo = ctx.topology
    host_names = sorted(sorted_unique(topo.hosts).tolist())
    culprit_hosts = ([host_names[h] for h in hosts] if hosts is not None
                     else sorted({str(topo.hosts[r]) for r in ranks}))
    return {
        "class": klass,
        "culprit_ranks": sorted(int(r) for r in ranks),
        "culprit_hosts": culprit_hosts,
        "culprit_gpus": [str(topo.gpu_uuids[r]) for r in sorted(ranks)],
        "window": {"start_step": int(min(steps)), "end_step": int(max(steps))},
        "steps": sorted(int(s) for s in steps),
        "phase": phase,
        "microbatch": microbatch,
        "kernels": kernels,
        "params": {k: v for k, v in params.items()},
    }


def _kernels_of(*ops: ComputeOp) -> list[str]:
    return sorted({k.short for op in ops for k in op.kernels})


def _compute_ops(w: Workload, phase: str) -> list[ComputeOp]:
    return [op for op in w.compute_ops() if op.phase in (phase, phase + "-bwd")]


def _plan(ctx: ScenarioContext) -> FaultPlan:
    return FaultPlan(world_size=ctx.layout.world_size, n_hosts=ctx.n_hosts)


def _random_rank(ctx: ScenarioContext, stages: list[int] | None = None) -> int:
    stage = ctx.layout.stage_of(np.arange(ctx.layout.world_size))
    pool = np.arange(ctx.layout.world_size) if stages is None else np.flatnonzero(np.isin(stage, stages))
    return int(ctx.rng.choice(pool))


# -- builders ------------------------------------------------------------------------------
def _healthy(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    return _plan(ctx), []


def _compute_straggler(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    phase = str(ctx.p("phase"))
    ops = _compute_ops(ctx.config.workload, phase)
    if not ops:
        raise ScenarioError(f"phase={phase!r} is not a compute phase of the simulated model")
    ranks = ctx.ranks_param(lambda: ctx.layout.group_of(GroupKind.TP, _random_rank(ctx)).tolist())
    start, end = ctx.window(ctx.onset())
    steps = list(range(start, end + 1))
    plan = _plan(ctx)
    plan.slowdowns.append(ComputeSlowdown(tuple(ranks), float(ctx.p("factor")), frozenset(steps), frozenset({phase})))
    return plan, [_truth(ctx, "compute_straggler", ranks, steps, phase, _kernels_of(*ops), factor=float(ctx.p("factor")))]


def _masked_compute_straggler(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    phase = str(ctx.p("phase"))
    ops = _compute_ops(ctx.config.workload, phase)
    if not ops:
        raise ScenarioError(f"phase={phase!r} is not a compute phase of the simulated model")
    hosts = ctx.hosts_param(lambda: [int(ctx.rng.integers(ctx.n_hosts))])
    ranks = ctx.ranks_param(lambda: ctx.ranks_on_hosts(hosts))
    start, end = ctx.window(ctx.onset())
    steps = list(range(start, end + 1))
    plan = _plan(ctx)
    plan.slowdowns.append(ComputeSlowdown(tuple(ranks), float(ctx.p("factor")), frozenset(steps), frozenset({phase})))
    # The misleading alarm of the production case: a NIC port on that host blips down once.
    plan.hw.append(HwOverride(tuple(ranks), "nic_port_up", ((start, 0.0),)))
    return plan, [_truth(ctx, "compute_straggler", ranks, steps, phase, _kernels_of(*ops),
                         factor=float(ctx.p("factor")), misleading_alarm="nic_port_up=0 at onset")]


def _thermal_throttle(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    ranks = ctx.ranks_param(lambda: [_random_rank(ctx)])
    start, end = ctx.window(ctx.onset())
    steps = list(range(start, end + 1))
    factor = float(ctx.p("factor"))
    eff = ComputeSlowdown(tuple(ranks), factor, frozenset(steps), None, ramp=True)
    plan = _plan(ctx)
    plan.slowdowns.append(eff)
    f = [eff.factor_at(s) for s in steps]
    plan.hw += [
        HwOverride(tuple(ranks), "temperature_c", tuple((s, 70.0 + 22.0 * (x - 1) / max(factor - 1, 1e-9)) for s, x in zip(steps, f))),
        HwOverride(tuple(ranks), "sm_clock_mhz", tuple((s, 1980.0 / x) for s, x in zip(steps, f))),
        HwOverride(tuple(ranks), "throttle_reasons", tuple((s, 64.0 if x > 1.05 else 0.0) for s, x in zip(steps, f))),
    ]
    kernels = sorted({k.short for op in ctx.config.workload.compute_ops() for k in op.kernels})
    return plan, [_truth(ctx, "compute_straggler", ranks, steps, None, kernels, factor=factor, cause="thermal")]


def _pipeline_bubble(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    pp = ctx.layout.pp
    if pp < 2:
        raise ScenarioError("pipeline_bubble needs pipeline parallelism (pp >= 2); pass --layout with pp>=2")
    middle = list(range(1, pp - 1)) or [pp - 1]
    ranks = ctx.ranks_param(lambda: [_random_rank(ctx, middle)])
    start, end = ctx.window(ctx.onset())
    steps = list(range(start, end + 1))
    factor = float(ctx.p("factor"))
    plan = _plan(ctx)
    plan.slowdowns.append(ComputeSlowdown(tuple(ranks), factor, frozenset(steps), None, frozenset({"bwd"})))
    w = ctx.config.workload
    kernels = sorted({k.short for op in w.compute_ops() if op.phase.endswith("-bwd") for k in op.kernels})
    return plan, [_truth(ctx, "pipeline_imbalance", ranks, steps, "backward-compute", kernels, factor=factor,
                         stage=int(ctx.layout.stage_of(ranks[0])))]


def _pick_steps(ctx: ScenarioContext, count: int) -> list[int]:
    pool = [s for s in range(ctx.config.warmup_steps, ctx.steps) if not ctx.config.is_checkpoint_step(s)]
    if not pool:
        raise ScenarioError("no steps left after warm-up to place the fault; simulate more steps")
    return sorted(int(s) for s in ctx.rng.choice(pool, size=min(count, len(pool)), replace=False))


def _jit_stall(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    ranks = ctx.ranks_param(lambda: [_random_rank(ctx)])
    mb = ctx.params.get("microbatch")
    mb = min(7, ctx.config.microbatches - 1) if mb in (None, "auto") else int(mb)
    if not 0 <= mb < ctx.config.microbatches:
        raise ScenarioError(f"microbatch={mb} outside 0..{ctx.config.microbatches - 1}")
    steps = _pick_steps(ctx, int(ctx.p("occurrences")))
    plan = _plan(ctx)
    plan.stalls.append(HostStall(tuple(ranks), frozenset(steps), "B", mb, float(ctx.p("stall_ms")), "sparse", FRAMES["jit"]))
    w = ctx.config.workload
    kernels = sorted({k.short for op in w.compute_ops() if op.phase.endswith("-bwd") for k in op.kernels})
    return plan, [_truth(ctx, "host_stall", ranks, steps, "backward-compute", kernels, microbatch=mb,
                         stall_ms=float(ctx.p("stall_ms")), cause="jit_compile")]


def _gc_pause(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    ranks = ctx.ranks_param(lambda: [_random_rank(ctx)])
    pool = [s for s in range(ctx.config.warmup_steps, ctx.steps)]
    if not pool:
        raise ScenarioError(f"gc_pause needs a step after the {ctx.config.warmup_steps} warm-up steps; the job has "
                            f"{ctx.steps}")
    chosen = ctx.params.get("steps", "auto")
    if chosen in (None, "auto"):
        hit = [s for s in pool if ctx.rng.random() < float(ctx.p("probability"))] or pool[-1:]
    else:
        hit = sorted({int(s) for s in str(chosen).split(",") if s.strip()})
        if not hit or not all(0 <= s < ctx.steps for s in hit):
            raise ScenarioError(f"gc_pause steps={chosen!r}: steps of 0..{ctx.steps - 1}, comma-separated")
    plan = _plan(ctx)
    for s in hit:
        mb = int(ctx.rng.integers(ctx.config.microbatches))
        ms = float(ctx.p("pause_ms")) * float(ctx.rng.uniform(0.6, 1.4))
        plan.stalls.append(HostStall(tuple(ranks), frozenset({s}), "F", mb, ms, "pause", FRAMES["gc"]))
    return plan, [_truth(ctx, "host_stall", ranks, hit, "forward-compute", [], pause_ms=float(ctx.p("pause_ms")),
                         cause="garbage_collection")]


def _hang(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    ranks = ctx.ranks_param(lambda: [_random_rank(ctx)])
    step = ctx.params.get("step")
    step = max(ctx.config.warmup_steps, ctx.steps // 2) if step in (None, "auto") else int(step)
    if not 0 <= step < ctx.steps:
        raise ScenarioError(f"hang step {step} outside 0..{ctx.steps - 1}")
    plan = _plan(ctx)
    plan.hang = Hang(ranks[0], step, FRAMES["dataloader"])
    return plan, [_truth(ctx, "hang", ranks[:1], [step], "dataloader", [], cause="dataloader_deadlock")]


#: Groups a link fault looks for two hosts in, in order (the first group spanning two wins).
_LINK_FAULT_KINDS = (GroupKind.DP, GroupKind.EP, GroupKind.PP, GroupKind.WORLD)
#: Groups whose every transfer ``group_link_degradation`` can slow (the simulator runs their collectives).
_DEGRADABLE_KINDS = (GroupKind.DP, GroupKind.EP, GroupKind.TP, GroupKind.CP)


def _two_hosts_in_one_group(ctx: ScenarioContext) -> list[int]:
    if ctx.n_hosts < 2:
        raise ScenarioError("link faults need at least 2 hosts; use more ranks or a smaller --gpus-per-host")
    hi = ctx.host_index
    for kind in _LINK_FAULT_KINDS:
        members = ctx.layout.group_of(kind, _random_rank(ctx))
        hosts = sorted_unique(hi[members])
        if len(hosts) >= 2:
            return sorted(int(h) for h in ctx.rng.choice(hosts, size=2, replace=False))
    raise ScenarioError("no group spans two hosts")


def _comm_kernels(ctx: ScenarioContext) -> list[str]:
    w = ctx.config.workload
    return sorted({op.kernel.short for op in (w.dp_reduce_scatter, w.dp_allgather, w.pp_p2p, w.ep_alltoall)})


def _link_degradation(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    hosts = ctx.hosts_param(lambda: _two_hosts_in_one_group(ctx))
    start, end = ctx.window(0)
    steps = list(range(start, end + 1))
    plan = _plan(ctx)
    plan.links.append(LinkDegradation(tuple(hosts), float(ctx.p("factor")), frozenset(steps)))
    ranks = ctx.ranks_on_hosts(hosts)
    plan.hw += [HwOverride(tuple(ranks), "pcie_gen", tuple((s, 3.0) for s in steps)),
                HwOverride(tuple(ranks), "pcie_width", tuple((s, 4.0) for s in steps))]
    return plan, [_truth(ctx, "link_degradation", ranks, steps, None, _comm_kernels(ctx), hosts=hosts,
                         factor=float(ctx.p("factor")), cause="pcie_link_downtrained")]


def _group_link_degradation(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    kind = str(ctx.p("group"))
    if kind not in _DEGRADABLE_KINDS:
        raise ScenarioError(f"group={kind!r}: one of {', '.join(_DEGRADABLE_KINDS)}")
    if ctx.layout.group_size(kind) < 2:
        raise ScenarioError(f"the layout's {kind} groups have one member: no transfer to degrade")
    seed_rank = ctx.ranks_param(lambda: [_random_rank(ctx)])[0]
    members = sorted(int(r) for r in ctx.layout.group_of(kind, seed_rank))
    start, end = ctx.window(ctx.onset())
    steps = list(range(start, end + 1))
    plan = _plan(ctx)
    plan.group_links.append(GroupLinkDegradation(kind, tuple(members), float(ctx.p("factor")), frozenset(steps)))
    w = ctx.config.workload
    ops_of: dict[str, tuple[CommOp, ...]] = {
        GroupKind.DP: (w.dp_reduce_scatter, w.dp_allgather), GroupKind.EP: (w.ep_alltoall,),
        GroupKind.CP: (w.cp_ring,), GroupKind.TP: (w.tp_allreduce,)}
    ops = ops_of.get(kind, ())
    return plan, [_truth(ctx, "link_degradation", members, steps, None, sorted({op.kernel.short for op in ops}),
                         factor=float(ctx.p("factor")), group=kind, cause="group_path_degraded")]


def _link_flap(ctx: ScenarioContext) -> tuple[FaultPlan, list[dict[str, Any]]]:
    hosts = ctx.hosts_param(lambda: _two_hosts_in_one_group(ctx)[:1])
    period, on = int(ctx.p("period")), int(ctx.p("on_steps"))
    if period < 1 or not 1 <= on <= period:
        raise ScenarioError(f"link_flap needs 1 <= on_steps <= period, got on_steps={on}, period={period}")
    first = max(ctx.config.warmup_steps, ctx.steps // 5)
    steps = [s for s in range(first, ctx.steps) if (s - first) % period < on]
    if not steps:
        raise ScenarioError("no flapping steps inside the run; simulate more steps")
    plan = _plan(ctx)
    plan.links.append(LinkDegradation(tuple(hosts), float(ctx.p("factor")), frozenset(steps)))
    ranks = ctx.ranks_on_hosts(hosts)
    plan.hw.append(HwOverride(tuple(ranks), "nic_port_up", tuple((s, 0.0) for s in steps)))
    return plan, [_truth(ctx, "link_degradation", ranks, steps, None, _comm_kernels(ctx), hosts=hosts,
                         factor=float(ctx.p("factor")), cause="nic_link_flapping")]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "no fault: MoE routing imbalance, sequence-length variation, warm-up, checkpoint "
             "steps and dataloader jitter only", "healthy", _healthy),
    Scenario("compute_straggler", "one TP group's self_attention runs factor× slower from a quarter in "
             "(production case 1)", "compute_straggler", _compute_straggler,
             {"factor": 6.0, "phase": "self_attention", "ranks": "auto", "start_step": "auto", "end_step": "auto"}),
    Scenario("link_degradation", "two hosts' PCIe links trained down (Gen3 x4): their inter-host collectives "
             "are factor× slower from step 0, step time stable (case 2)", "link_degradation", _link_degradation,
             {"factor": 3.0, "hosts": "auto", "start_step": "auto", "end_step": "auto"}),
    Scenario("pipeline_bubble", "one rank in a middle stage runs backward factor× slower; bubbles amplify "
             "along the pipeline while step totals align (case 3)", "pipeline_imbalance", _pipeline_bubble,
             {"factor": 1.9, "ranks": "auto", "start_step": "auto", "end_step": "auto"}),
    Scenario("jit_stall", "one rank's backward of one microbatch stalls ~6 s in JIT compilation in a few "
             "steps: kernels sparse, host busy (case 4)", "host_stall", _jit_stall,
             {"stall_ms": 6000.0, "microbatch": "auto", "occurrences": 3, "ranks": "auto"}),
    Scenario("masked_compute_straggler", "the 8 GPUs of one host run mlp factor× slower; their collectives "
             "look shorter and a NIC alarm points at the network (case 5)", "compute_straggler",
             _masked_compute_straggler,
             {"factor": 5.7, "phase": "mlp", "hosts": "auto", "ranks": "auto", "start_step": "auto", "end_step": "auto"}),
    Scenario("hang", "one rank never returns from its data loader, so it never joins the next collective "
             "and every rank blocks", "hang", _hang, {"ranks": "auto", "step": "auto"}),
    Scenario("thermal_throttle", "one GPU heats up and its clocks fall: compute slows gradually to factor× "
             "by the end", "compute_straggler", _thermal_throttle,
             {"factor": 1.6, "ranks": "auto", "start_step": "auto", "end_step": "auto"}),
    Scenario("group_link_degradation", "every transfer of one group (data-parallel; group= tp, cp, ep) is factor× slower from a "
             "quarter in (a degraded rail or switch port on that ring's path); its hosts' other groups are "
             "healthy", "link_degradation", _group_link_degradation,
             {"factor": 3.0, "group": GroupKind.DP, "ranks": "auto", "start_step": "auto", "end_step": "auto"}),
    Scenario("link_flap", "one host's NIC link flaps: its inter-host collectives are factor× slower for "
             "on_steps of every period steps", "link_degradation", _link_flap,
             {"factor": 5.0, "hosts": "auto", "period": 5, "on_steps": 2}),
    Scenario("gc_pause", "Python garbage-collection pauses of ~pause_ms on one rank in a random share of "
             "steps", "host_stall", _gc_pause,
             {"pause_ms": 600.0, "probability": 0.4, "ranks": "auto", "steps": "auto"}),
)}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ScenarioError(f"unknown scenario {name!r}; `argus scenarios` lists: {', '.join(SCENARIOS)}") from None


def parse_params(scenario: Scenario, items: list[str] | dict[str, Any] | None) -> dict[str, Any]:
    """Merge ``key=value`` overrides into the scenario's defaults; unknown keys are errors."""
    params = dict(scenario.defaults)
    pairs = items.items() if isinstance(items, dict) else [
        (i.partition("=")[0].strip(), i.partition("=")[2].strip()) for i in (items or [])]
    for key, value in pairs:
        if key not in scenario.defaults:
            known = ", ".join(scenario.defaults) or "none"
            raise ScenarioError(f"scenario {scenario.name!r} has no parameter {key!r} (parameters: {known})")
        default = scenario.defaults[key]
        try:
            if isinstance(default, bool):
                params[key] = str(value).lower() in ("1", "true", "yes")
            elif isinstance(default, int) and not isinstance(value, int):
                params[key] = int(value)
            elif isinstance(default, float):
                params[key] = float(value)
            else:
                params[key] = value
        except ValueError:
            raise ScenarioError(f"parameter {key}={value!r} of {scenario.name!r} must be a "
                                f"{type(default).__name__}") from None
    return params


def scenario_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])
