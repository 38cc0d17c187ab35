"""``argus analyze S [--watch]``: diagnosis as a service — on a schedule over a live store,
new incidents stored, alerts sent to a webhook and/or Alertmanager (P0–P2, one per fault)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading

from argus.cli.progress import stderr_console
from argus.text import term

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("analyze", help="continuous analysis of a live store, with alerts",
                       description="Diagnose a store (L1–L5) once, or every --interval seconds with --watch; "
                                   "store new incidents and notify a JSON webhook and/or Prometheus Alertmanager. "
                                   "Priorities: P0 hang/GPU lost, P1 straggler costing >10%% or degraded link, "
                                   "P2 the rest. One alert per fault, remembered in the attempt's alerts.json.")
    p.add_argument("store", help="store directory")
    p.add_argument("--watch", action="store_true", help="keep analysing until interrupted (SIGINT/SIGTERM)")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between cycles with --watch (default 30)")
    p.add_argument("--webhook", action="append", default=[], metavar="URL", help="POST each alert as JSON here")
    p.add_argument("--alertmanager", action="append", default=[], metavar="URL",
                   help="Alertmanager base URL, e.g. http://127.0.0.1:9093 (alerts go to /api/v2/alerts)")
    p.add_argument("--run", help="run id (default: latest)")
    p.add_argument("--attempt", help="attempt id (default: latest, so a restarted job is followed)")
    p.add_argument("--json", action="store_true", help="one JSON line per cycle on stdout (what was analysed, "
                                                       "new incidents, alerts sent, errors)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.alerting import AlertmanagerSink, AnalysisService, Cycle, WebhookSink
    from argus.errors import ConfigError

    if args.interval <= 0:
        raise ConfigError(f"--interval must be positive, got {args.interval}")
    sinks = [WebhookSink(u) for u in args.webhook] + [AlertmanagerSink(u) for u in args.alertmanager]
    service = AnalysisService(args.store, sinks, args.run, args.attempt)
    console = stderr_console()
    logging.basicConfig(level=logging.WARNING, format="argus analyze: %(message)s")

    def report(c: Cycle) -> None:
        if args.json:
            print(json.dumps({"attempt": c.attempt, "analysed": c.analysed, "incidents": c.incidents,
                              "new_incidents": c.new_incidents,
                              "sent": [{"sink": s, "incident": i, "priority": p} for s, i, p in c.sent],
                              "errors": c.errors, "seconds": round(c.seconds, 3)}), flush=True)
            return
        if not c.analysed:
            return
        sent = ", ".join(f"{p} {i} → {s}" for s, i, p in c.sent) or "no new alert"
        console.print(f"{term(c.attempt)}: {c.incidents} incident(s), {len(c.new_incidents)} new; {term(sent)} "
                      f"[dim]({c.seconds:.1f} s)[/dim]")
        for e in c.errors:
            console.print(f"[yellow]notify failed[/yellow]: {term(e)}")

    if not args.watch:
        c = service.cycle()
        report(c)
        return 1 if c.errors else 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    console.print(f"watching {term(args.store)} every {args.interval:g} s (Ctrl-C to stop)")
    service.run(args.interval, stop, report)
    return 0
