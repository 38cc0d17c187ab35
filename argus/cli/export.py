"""``argus export FORMAT``: write a store out for other tools (today: Kineto JSON for Perfetto,
TensorBoard and Holistic Trace Analysis)."""

from __future__ import annotations

import argparse

from argus.cli.progress import progress_bar, stderr_console
from argus.cli.sources import SOURCE_HELP
from argus.text import term, visible

__all__ = ["register", "parse_steps"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a store out in another tool's format",
                       description="Write a store out in a format other tools read.")
    fmt = p.add_subparsers(dest="format", metavar="FORMAT")
    fmt.required = True
    k = fmt.add_parser(
        "kineto", help="per-rank PyTorch Profiler (Kineto) Chrome-trace JSON",
        description="Write DIR/rank<N>.json per rank: ProfilerStep#N, phases as CPU and GPU user "
                    "annotations, raw kernels with their cudaLaunchKernel events. Opens in Perfetto, "
                    "TensorBoard and Holistic Trace Analysis (TraceAnalysis(trace_dir=DIR)).")
    k.add_argument("store", help=SOURCE_HELP)
    k.add_argument("--out", required=True, help="output directory (new or empty)")
    k.add_argument("--run", help="run id (default: latest)")
    k.add_argument("--attempt", help="attempt id (default: latest)")
    k.add_argument("--steps", type=parse_steps, metavar="A:B", help="only steps A..B (inclusive), or one step A")
    k.add_argument("--gzip", action="store_true", help="write rank<N>.json.gz")
    k.add_argument("--hta-compat", action="store_true",
                   help="name ncclDevKernel_* kernels ncclKernel_* so HTA <= 0.5 counts them as "
                        "communication (its straggler analysis needs them)")
    k.set_defaults(func=run_export_kineto)


def parse_steps(text: str) -> tuple[int, int]:
    """``"10:20"`` → (10, 20); ``"7"`` → (7, 7)."""
    first, sep, last = text.partition(":")
    try:
        lo = int(first)
        hi = int(last) if sep else lo
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step range like 10:20") from None
    if hi < lo:
        raise argparse.ArgumentTypeError(f"step range {text!r} ends before it starts")
    return lo, hi


def run_export_kineto(args: argparse.Namespace) -> int:
    from argus.cli.sources import open_source_attempt, store_root
    from argus.kineto import export_kineto
    from argus.store import Store

    attempt = open_source_attempt(args.store, args.run, args.attempt)
    store = Store.open(store_root(attempt))
    with progress_bar(f"exporting {attempt.identity.run_id}", attempt.layout.world_size) as advance:
        result = export_kineto(store, args.out, run_id=attempt.identity.run_id,
                               attempt_id=attempt.identity.attempt_id, steps=args.steps, compress=args.gzip,
                               hta_compat=args.hta_compat, on_rank=lambda rank: advance())
    err = stderr_console()
    for warning in result.warnings:
        err.print(f"[yellow]warning[/yellow] {term(warning)}")
    shown = ", ".join(map(str, result.ranks[:8])) + (" …" if len(result.ranks) > 8 else "")
    print(f"wrote {len(result.files)} trace file{'s' * (len(result.files) != 1)} (ranks {shown}) to "
          f"{visible(result.out)}: "
          f"{result.steps:,} steps, {result.phases:,} phases, {result.kernels:,} kernels, "
          f"{result.bytes_written / 1e6:.1f} MB in {result.wall_s:.1f} s")
    return 0
