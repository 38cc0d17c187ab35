"""``argus bench NAME``: benchmarks, each printing one JSON object per line."""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark (prints JSON lines)",
                       description="Benchmarks. Each prints one JSON object per line with its figures.")
    bsub = p.add_subparsers(dest="bench", metavar="NAME")
    bsub.required = True
    s = bsub.add_parser("simulate", help="simulator throughput (events/s) and peak memory")
    s.add_argument("--ranks", type=int, default=10240)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--layout", help="parallel layout (default: realistic for the size)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--modes", default="generate,store",
                   help="comma list: generate (events only), store (write steps/phases/stacks/hw), "
                        "store+kernels (also raw kernels)")
    s.set_defaults(func=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    from argus.bench.simulate import run_isolated

    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        result = run_isolated(ranks=args.ranks, steps=args.steps, layout=args.layout, seed=args.seed, mode=mode)
        print(json.dumps(result), flush=True)
    return 0
