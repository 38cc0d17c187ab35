"""The ``argus`` command: one entry point, one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

from argus import __version__
from argus.errors import ArgusError

__all__ = ["COMMANDS", "main", "build_parser"]


#: command → (module of argus.cli, its register function). Only the command being run is
#: imported: ``argus run --help`` takes 0.36 s, not the ~0.5 s that importing every command
#: (pyarrow, DuckDB, the analysis) took — paid by every ``argus run`` before its job could
#: start, and by each host's processor.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "register"), "run": ("run", "register"), "simulate": ("simulate", "register_simulate"),
    "scenarios": ("simulate", "register_scenarios"), "info": ("info", "register"),
    "diagnose": ("diagnose", "register"), "report": ("report", "register"), "serve": ("serve", "register"),
    "analyze": ("analyze", "register"), "processor": ("processor", "register"), "sync": ("sync", "register"),
    "dashboards": ("dashboards", "register"), "bench": ("bench", "register"), "ingest": ("ingest", "register"),
    "export": ("export", "register"), "healthcheck": ("healthcheck", "register"), "verify": ("verify", "register"),
    "drill": ("drill", "register"),
}


def _register(command: str) -> Callable[[argparse._SubParsersAction], None]:
    module, func = COMMANDS[command]
    return getattr(importlib.import_module(f"argus.cli.{module}"), func)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``argv`` naming a command first, only that command's (the
    usage, help and errors of one command need no other)."""
    parser = argparse.ArgumentParser(
        prog="argus", description="Always-on tracing and progressive diagnosis for distributed PyTorch training.")
    parser.add_argument("--version", action="version", version=f"argus {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    first = argv[0] if argv else None
    for command in [first] if first in COMMANDS else COMMANDS:
        _register(command)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
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
