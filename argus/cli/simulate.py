"""``argus simulate`` and ``argus scenarios``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from argus.cli.defaults import config_default
from argus.cli.progress import progress_bar, stderr_console
from argus.sim import SCENARIOS, SimConfig, simulate_to_store

__all__ = ["register_simulate", "register_scenarios", "add_sim_options", "config_from_args"]


def _default(name: str) -> Any:
    return config_default(SimConfig, name)


def add_sim_options(p: argparse.ArgumentParser, ranks: int | None = None, steps: int | None = None) -> None:
    """The job-shape flags of ``SimConfig``, their defaults its own (``ranks``/``steps``: a caller's)."""
    ranks = _default("ranks") if ranks is None else ranks
    steps = _default("steps") if steps is None else steps
    p.add_argument("--ranks", type=int, default=ranks, help=f"world size (default {ranks})")
    p.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    p.add_argument("--seed", type=int, default=_default("seed"), help=f"random seed (default {_default('seed')})")
    p.add_argument("--layout", help="parallel layout, e.g. 'tp=2,pp=4,dp=8' (default: a realistic MoE layout)")
    p.add_argument("--order", help="rank order, fastest axis first (default tp-cp-ep-dp-pp)")
    p.add_argument("--gpus-per-host", type=int, default=_default("gpus_per_host"),
                   help=f"ranks per host (default {_default('gpus_per_host')})")
    p.add_argument("--layers", type=int, default=_default("layers"),
                   help=f"transformer layers per pipeline stage (default {_default('layers')})")
    p.add_argument("--microbatches", type=int, default=_default("microbatches"),
                   help=f"microbatches per step (default {_default('microbatches')})")
    p.add_argument("--virtual-stages", type=int, default=_default("virtual_stages"),
                   help="model chunks per pipeline stage: > 1 runs Megatron's interleaved 1F1B schedule "
                        f"(default {_default('virtual_stages')})")
    p.add_argument("--kernels", action="store_true", help="also store raw kernel events (small runs)")
    p.add_argument("--megatron-groups", action="store_true",
                   help="Megatron's own groups at the step's tail: the grad-norm all-reduce over MODEL_PARALLEL "
                        "(tp x pp) instead of the world, the tied embedding's over EMBEDDING (first and last stage)")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(ranks=args.ranks, steps=args.steps, seed=args.seed, layout=args.layout, order=args.order,
                     gpus_per_host=args.gpus_per_host, layers=args.layers, microbatches=args.microbatches,
                     kernels=args.kernels, megatron_groups=getattr(args, "megatron_groups", _default("megatron_groups")),
                     virtual_stages=getattr(args, "virtual_stages", _default("virtual_stages")))


def register_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate a training job (healthy or faulty) into a store",
                       description="Simulate a synchronous LLM training job and write it to a store, with "
                                   "the ground truth in OUT/truth.json.")
    p.add_argument("--scenario", required=True, choices=list(SCENARIOS), metavar="NAME",
                   help="scenario (see `argus scenarios`)")
    p.add_argument("--out", required=True, help="store directory to create (new or empty)")
    add_sim_options(p)
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario parameter (repeatable), e.g. --param factor=3")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the fault-free rerun that measures the fault's true impact")
    p.add_argument("--json", action="store_true", help="print the truth document on stdout")
    p.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    from argus.cli.info import print_store_summary

    config = config_from_args(args)
    with progress_bar(f"simulating {args.scenario}", config.steps) as advance:
        result = simulate_to_store(config, args.scenario, args.out, params=args.param,
                                   on_step=lambda rec: advance(), baseline=not args.no_baseline)
    if args.json:
        print(json.dumps(result.truth, indent=2))
        return 0
    err = stderr_console()
    err.print(f"simulated {result.steps_done} steps × {config.ranks} ranks: {result.phase_events:,} phase and "
              f"{result.kernel_events:,} kernel events in {result.wall_s:.1f} s")
    print_store_summary(args.out)
    return 0


def register_scenarios(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scenarios", help="list built-in simulator scenarios",
                       description="List the simulator's scenarios, one per line: name, then description.")
    p.add_argument("--params", action="store_true", help="also show each scenario's parameters")
    p.add_argument("--json", action="store_true", help="a JSON list: name, summary, parameters")
    p.set_defaults(func=run_scenarios)


def run_scenarios(args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        print(json.dumps([{"name": name, "summary": sc.summary, "params": dict(sc.defaults or {})}
                          for name, sc in SCENARIOS.items()], indent=1, default=str))
        return 0
    width = max(len(n) for n in SCENARIOS)
    for name, sc in SCENARIOS.items():
        line = f"{name:<{width}}  {sc.summary}"
        if args.params and sc.defaults:
            line += "  [" + ", ".join(f"{k}={v}" for k, v in sc.defaults.items()) + "]"
        print(line)
    return 0
