"""``argus demo``: the main job on the embedded default.

Until the PyTorch producer lands, the demo simulates a faulty job (a compute straggler on
64 ranks), writes it to a fresh store, prints what the store holds and diagnoses it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from argus.cli.progress import progress_bar, stderr_console
from argus.cli.simulate import add_sim_options, config_from_args
from argus.sim import SCENARIOS, simulate_to_store

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job: a faulty job into a fresh store, then summarise it",
                       description="Simulate a faulty training job into a fresh store and print what it holds.")
    p.add_argument("--out", help="store directory (default: ./argus-demo/run-<time>)")
    p.add_argument("--scenario", default="compute_straggler", choices=list(SCENARIOS), metavar="NAME",
                   help="fault to inject (default compute_straggler)")
    add_sim_options(p)
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from argus.cli.info import print_store_summary

    out = Path(args.out) if args.out else Path("argus-demo") / time.strftime("run-%Y%m%d-%H%M%S")
    config = config_from_args(args)
    err = stderr_console()
    err.print(f"argus demo: simulating '{args.scenario}' on {config.ranks} ranks × {config.steps} steps → {out}")
    with progress_bar("simulating", config.steps) as advance:
        result = simulate_to_store(config, args.scenario, out, on_step=lambda rec: advance())
    err.print(f"wrote {result.bytes_written / 1e6:.1f} MB ({result.phase_events:,} phase events) "
              f"in {result.wall_s:.1f} s\n")
    print_store_summary(out)
    from argus.analysis import diagnose
    from argus.cli.diagnose import print_diagnosis
    from argus.store import Store

    print()
    print_diagnosis(diagnose(Store.open(out).attempt()))
    print(f"\nstore: {out}   (argus info {out} · argus diagnose {out} --json)")
    return 0
