"""The ``argus`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from argus import __version__
from argus.errors import ArgusError

__all__ = ["main", "build_parser"]


def _commands() -> list[tuple[str, Callable[[argparse._SubParsersAction], None]]]:
    # Imported lazily so `argus --help` stays fast.
    from argus.cli import (analyze, bench, dashboards, demo, diagnose, drill, export, healthcheck, info, ingest,
                           processor, report, run, serve, simulate, sync, verify)

    return [("demo", demo.register), ("run", run.register), ("simulate", simulate.register_simulate),
            ("scenarios", simulate.register_scenarios), ("info", info.register), ("diagnose", diagnose.register),
            ("report", report.register), ("serve", serve.register), ("analyze", analyze.register),
            ("processor", processor.register), ("sync", sync.register), ("dashboards", dashboards.register),
            ("bench", bench.register), ("ingest", ingest.register), ("export", export.register),
            ("healthcheck", healthcheck.register), ("verify", verify.register), ("drill", drill.register)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="argus", description="Always-on tracing and progressive diagnosis for distributed PyTorch training.")
    parser.add_argument("--version", action="version", version=f"argus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for _, register in _commands():
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ArgusError as exc:
        # Messages quote paths and names from traces: shown as text, line breaks kept.
        from argus.text import visible

        print("argus: error: " + "\n".join(visible(line) for line in str(exc).split("\n")), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("argus: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `argus scenarios | head -1`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
