"""``argus report S --out report.html``: diagnose an attempt and write a self-contained HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path

from argus.cli.progress import progress_bar, stderr_console
from argus.cli.sources import SOURCE_HELP
from argus.text import term

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report (plots, incidents, evidence)",
                       description="Diagnose a run attempt and write one HTML file with its step time, incidents, "
                                   "culprit-vs-peer heatmaps, W₁ matrices, kernel CDFs, pipeline and stack evidence. "
                                   "The file loads nothing from the network and opens offline.")
    p.add_argument("store", help=SOURCE_HELP)
    p.add_argument("--out", default="argus-report.html", help="output file (default: argus-report.html)")
    p.add_argument("--run", help="run id (default: latest)")
    p.add_argument("--attempt", help="attempt id (default: latest)")
    p.add_argument("--window-steps", type=int, help="steps per analysis window (default: the store's windows, ≥ 5)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.errors import ConfigError
    from argus.cli.sources import open_source_attempt
    from argus.report import build_report

    out = Path(args.out)
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; give a file name such as {out / 'report.html'}")
    attempt = open_source_attempt(args.store, args.run, args.attempt)
    n_windows = max(1, len(attempt.sql("SELECT DISTINCT step FROM steps")) // (args.window_steps or 5))
    with progress_bar("diagnosing windows", n_windows) as advance:
        diagnosis = diagnose(attempt, DiagnoseConfig(window_steps=args.window_steps, store_incidents=False),
                             on_window=lambda done, total: advance())
    result = build_report(attempt, out, diagnosis)
    stderr_console().print(
        f"report [bold]{term(out)}[/bold]: {result.bytes / 1e6:.2f} MB, {result.incidents} incident(s); "
        f"diagnosis {diagnosis.timings_s.get('total', 0.0):.1f} s, report {result.render_s:.1f} s")
    for line in diagnosis.missing:  # what the store lacked: damaged files, uncommitted windows, windows without phases
        stderr_console().print(f"[yellow]{term(line)}[/yellow]", markup=True, highlight=False)
    return 0
