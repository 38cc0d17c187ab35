"""``argus drill KIND [-- CMD...]``: a fault drill — prove the chain from fault to page.

Launches CMD (default: the bundled gloo transformer on 4 processes) under ``argus run``, waits
until it trains, injects the fault into one rank (or this host's processor), then times each
stage: the job's reaction, the incident (right class? right culprit?), the action proposed,
the alert (with ``--alertmanager``/``--webhook``). Prints a pass/fail table; exit code 0 only
when the drill passed. Only processes of the job launched here are touched.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any

from argus.cli.defaults import config_default
from argus.cli.progress import stderr_console, stdout_console
from argus.text import term

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from argus.drill import Drill, DrillKind

    def default(name: str) -> Any:
        return config_default(Drill, name)

    p = sub.add_parser("drill", help="inject a real fault into a job and check Argus catches, names and pages it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=[k.value for k in DrillKind],
                   help="kill-rank (SIGKILL), stall-rank (SIGSTOP for --duration s), slow-rank (stopped 60%% of "
                        "every 100 ms from then on), hang (stopped for good), processor (SIGKILL this host's "
                        "processor), link (throttle host RANK's link mid-job: a pipeline job on network "
                        "namespaces, one rank a host; needs root)")
    p.add_argument("--rank", type=int, default=default("rank"), help=f"rank to drill (default {default('rank')})")
    p.add_argument("--store", help="store directory (default ./argus-drills)")
    p.add_argument("--ranks", type=int, default=4, help="bundled job: processes (default 4)")
    p.add_argument("--steps", type=int, default=40, help="bundled job: steps (default 40)")
    p.add_argument("--hosts", type=int, default=default("hosts"),
                   help=f"link: namespace hosts, one rank each (default {default('hosts')})")
    p.add_argument("--layout", help="link: the job's layout (default pp=2,dp=HOSTS/2)")
    p.add_argument("--rate", default=default("rate"),
                   help=f"link: the throttled host's rate (tc tbf, default {default('rate')})")
    p.add_argument("--after-steps", type=int, default=default("after_steps"),
                   help=f"inject once this many steps are done (default {default('after_steps')})")
    p.add_argument("--duration", type=float, default=default("duration_s"),
                   help=f"stall-rank: seconds the rank is frozen (default {default('duration_s'):g})")
    p.add_argument("--hang-min-s", type=float, default=default("hang_min_s"),
                   help=f"the processor's live hang threshold for the drill's run (default {default('hang_min_s'):g})")
    p.add_argument("--timeout", type=float, default=default("timeout_s"),
                   help=f"seconds a stage may take (default {default('timeout_s'):g})")
    p.add_argument("--alertmanager", metavar="URL", help="check the alert reaches this Alertmanager")
    p.add_argument("--webhook", metavar="URL", help="check the alert reaches this webhook")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("command", nargs="*", help="-- the job to drill (default: the bundled one); after '--'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.drill import EXPECT, Drill, DrillKind, bundled_job, bundled_link_job, run_drill
    from argus.errors import ConfigError

    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    kind = DrillKind(args.kind)
    link = kind == DrillKind.LINK
    size = args.hosts if link else args.ranks
    if kind != DrillKind.PROCESSOR and not 0 <= args.rank < (size if not cmd or link else 1 << 20):
        raise ConfigError(f"--rank {args.rank} is not a rank of a {size}-{'host' if link else 'process'} job")
    if link and (args.hosts < 2 or (args.layout is None and args.hosts % 2)):
        raise ConfigError(f"--hosts {args.hosts}: the link drill's pipeline needs an even number of hosts "
                          "(or a --layout of that many ranks)")
    default = bundled_link_job(args.hosts, args.steps) if link else bundled_job(args.ranks, args.steps)
    err = stderr_console()
    drill = Drill(kind, Path(args.store or "argus-drills"), cmd or default, rank=args.rank,
                  hosts=args.hosts, layout=args.layout or f"pp=2,dp={args.hosts // 2}", rate=args.rate,
                  host=f"{socket.gethostname()}-drill-{os.getpid()}", after_steps=args.after_steps,
                  duration_s=args.duration, hang_min_s=args.hang_min_s, timeout_s=args.timeout,
                  alertmanager=args.alertmanager, webhook=args.webhook,
                  on_event=lambda line: err.print(f"[dim]drill: {term(line)}[/dim]"))
    res = run_drill(drill)
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"drill {kind} ({EXPECT[kind].what}) — run {res.run_id} in {res.store}",
                      title_justify="left")
        for col in ("stage", "result", "after the fault", "detail"):
            table.add_column(col)
        style = {"pass": "green", "fail": "bold red", "skipped": "dim"}
        for s in res.stages:
            table.add_row(s.name, f"[{style[s.result]}]{s.result}[/]", "—" if s.delay_s is None else f"{s.delay_s:.1f} s",
                          term(s.detail))
        out = stdout_console()
        out.print(table)
        out.print("[green]drill passed[/green]" if res.passed else "[bold red]drill FAILED[/bold red]")
    return 0 if res.passed else 1
