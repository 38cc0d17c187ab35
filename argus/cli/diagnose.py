"""``argus diagnose S [--json]``: L1–L3 and root cause over a store; incidents ranked."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from argus.cli.progress import progress_bar, stderr_console, stdout_console

__all__ = ["register", "print_diagnosis"]

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="find what slows a job: incidents with culprits, impact and evidence",
                       description="Run progressive diagnosis (L1 anomalous windows, L2 stragglers, L3 degraded "
                                   "kernels, root cause) over a store and report incidents.")
    p.add_argument("store", help="store directory")
    p.add_argument("--json", action="store_true", help="print the incidents document (JSON) on stdout")
    p.add_argument("--run", help="run id (default: latest)")
    p.add_argument("--attempt", help="attempt id (default: latest)")
    p.add_argument("--window-steps", type=int, help="steps per analysis window (default: the store's windows, ≥ 5)")
    p.add_argument("--no-store", action="store_true", help="do not write the incidents into the store")
    p.add_argument("--evidence", action="store_true", help="with the human output, list each incident's evidence")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.store import Store

    attempt = Store.open(args.store).attempt(args.run, args.attempt)
    config = DiagnoseConfig(window_steps=args.window_steps, store_incidents=not args.no_store)
    n_windows = max(1, len(attempt.sql("SELECT DISTINCT step FROM steps")) // (args.window_steps or 5))
    with progress_bar("diagnosing windows", n_windows) as advance:
        diagnosis = diagnose(attempt, config, on_window=lambda done, total: advance())
    if args.json:
        print(json.dumps(diagnosis.document(), indent=2, default=str))
        return 0
    print_diagnosis(diagnosis, evidence=args.evidence)
    return 0


def print_diagnosis(diagnosis, evidence: bool = False) -> None:
    out = stdout_console()
    a = diagnosis.attempt
    l1 = diagnosis.l1
    steps = f"steps {int(l1.steps.min())}–{int(l1.steps.max())}" if len(l1.steps) else "no steps"
    out.print(f"[bold]{a.identity.run_id}[/bold] attempt {a.identity.attempt_id}: {a.layout.world_size} ranks "
              f"({a.layout}), {steps}, healthy step time {l1.baseline_s:.3f} s")
    faults = l1.faults
    if faults:
        out.print("L1: " + "; ".join(f"{w.kind} steps {w.start_step}–{w.end_step} ×{w.magnitude:.2f}" for w in faults[:6]))
    normal = [w for w in l1.windows if w.kind in ("warmup", "checkpoint")]
    if normal:
        out.print("[dim]recognised as normal: " + "; ".join(f"{w.kind} {w.start_step}–{w.end_step}" for w in normal)
                  + "[/dim]")
    if not diagnosis.incidents:
        out.print("[green]no incident[/green]: every rank's work, collectives and kernels match its peers'")
        return
    table = Table(title=f"{len(diagnosis.incidents)} incident(s), most severe first", title_justify="left")
    for col in ("sev", "class", "state", "culprits", "steps", "phase", "impact", "action"):
        table.add_column(col, overflow="fold")
    for inc in diagnosis.incidents:
        ranks = ", ".join(map(str, inc.culprit_ranks[:6])) + ("…" if len(inc.culprit_ranks) > 6 else "")
        hosts = ", ".join(inc.hosts[:3]) + ("…" if len(inc.hosts) > 3 else "")
        impact = (f"+{inc.slowdown_pct:.1f}% · {inc.gpu_hours_lost:.2f} GPU-h"
                  if inc.slowdown_pct is not None else "-")
        table.add_row(f"[{_STYLE[inc.severity]}]{inc.severity}[/]", inc.klass, inc.state,
                      f"ranks {ranks}\n{hosts}", f"{inc.start_step}–{inc.end_step}", inc.phase or "-", impact,
                      inc.action)
    out.print(table)
    for inc in diagnosis.incidents:
        out.print(f"[bold]{inc.id}[/bold] {inc.summary}")
        if evidence:
            for ev in inc.evidence:
                out.print("    " + json.dumps(ev, default=str)[:300])
    stored = any(a.files("incidents"))
    stderr_console().print(f"[dim]diagnosed in {diagnosis.timings_s['total']:.1f} s"
                           + (f"; incidents in {a.path / 'incidents'}" if stored else "") + "[/dim]")
