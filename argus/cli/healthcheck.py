"""``argus healthcheck``: measure this node, compare with its baseline and its peers, exit non-zero
on a deficit (a Slurm prolog/epilog or a Kubernetes init check)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from argus.cli.progress import stderr_console, stdout_console
from argus.errors import ArgusError
from argus.text import term

__all__ = ["register", "EXIT_PASS", "EXIT_FAIL", "EXIT_LOADED"]

EXIT_PASS, EXIT_FAIL = 0, 1  # 2: an error (argus's usual)
#: no figure failed, but some fell below the line while other processes loaded the node: not
#: judged (a Slurm prolog should neither drain the node nor count it as checked)
EXIT_LOADED = 3
#: ``--save-baseline`` measures the node this many times: a baseline is a distribution, its runs'
#: spread part of it (``HealthReport.with_runs``)
BASELINE_RUNS = 3


def _pauses(text: str | None) -> tuple[float, ...] | None:
    """``--again-after``; None: the library's default (``argus.healthcheck.AGAIN_PAUSES_S``)."""
    if text is None:
        return None
    try:
        out = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ArgusError(f"--again-after: a comma list of seconds, got {text!r}") from None
    if not out or any(not 0 <= x <= 3600 for x in out):
        raise ArgusError(f"--again-after: one to many pauses of 0–3600 s, got {text!r}")
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "healthcheck", help="measure this node against its baseline and its peers",
        description="Benchmark this node — every GPU's matrix products, memory and sensors under load, by "
                    "UUID (the CPU's on a CPU-only machine), each GPU's host↔device copies and PCIe link against "
                    "its maximum, the P2P matrix, collective bus bandwidth between local "
                    "ranks over message sizes, the bundled model's training throughput — and judge "
                    "each figure against this node's saved baseline and against its peers (default: "
                    "fail at a 10% deficit, with 95% confidence over each figure's rounds; a failing "
                    "figure is measured again before it fails). Exit code: 0 every check passed, 1 one failed, "
                    "2 an error, 3 none failed but the node was loaded by other processes (not judged).")
    p.add_argument("--level", default="gpu,node,net,e2e",
                   help="comma list of gpu, node, net, e2e (default: all)")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="short probes, messages to 4 MiB (default)")
    speed.add_argument("--full", action="store_true", help="long burns, messages to 1 GiB")
    p.add_argument("--nproc", type=int, default=None, help="ranks for the net level (default: GPUs, or 2)")
    p.add_argument("--seconds", type=float, default=None, help="seconds per probe (default: 0.5, --full 3)")
    p.add_argument("--sizes", default=None,
                   help="net message sizes in bytes, comma list (default: 8 B to 4 MiB, ×8 apart; --full: to 1 GiB)")
    p.add_argument("--baseline-dir", type=Path, default=None,
                   help="where baselines live, one file per host (default: $ARGUS_HEALTHCHECK_DIR or "
                        "~/.argus/healthcheck)")
    p.add_argument("--save-baseline", action="store_true", help="archive this run as the node's baseline")
    p.add_argument("--threshold", type=float, default=None, help="deficit that fails a check (default 0.10)")
    p.add_argument("--again-after", default=None, metavar="S,S,…",
                   help="a failing figure is measured again after each of these pauses (seconds) until it passes, "
                        "and fails only if it failed every time (default: 0,5,10 — a shared machine's figures drift for tens of "
                        "seconds)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--store", type=Path, default=None,
                   help="also keep the result in this Argus store (health/<host>/…), where `argus verify` finds it "
                        "and where a node that failed stays out of service until a later check of it passes")
    p.add_argument("--standing", action="store_true",
                   help="run no check: list the nodes the --store's checks judged, in or out of service, with "
                        "their re-admissions (exit 1 when one is out; with --host, that node only)")
    p.add_argument("--host", default=None, help="with --standing: only this node")
    p.add_argument("--remote-write", default=None, metavar="URL",
                   help="also send the figures, verdicts and node standings to this Prometheus remote-write "
                        "endpoint (argus_health_* series)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.healthcheck import (DEFAULT_THRESHOLD, CheckConfig, Level, Status, default_dir, judge, load_baseline,
                                   measure_again, run_checks, save_baseline)
    from argus.healthcheck.load import LoadMeter, mark_loaded
    from argus.healthcheck.run import launched

    if args.standing:
        return _standing(args)
    if args.host is not None:
        raise ArgusError("--host goes with --standing (a check measures the node it runs on)")
    try:
        levels = tuple(Level(x.strip()) for x in args.level.split(",") if x.strip())
    except ValueError:
        raise ArgusError(f"--level {args.level!r}: a comma list of gpu, node, net, e2e") from None
    if not levels:
        raise ArgusError("--level: nothing to run")
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    if not 0 < threshold < 1:
        raise ArgusError(f"--threshold {threshold}: a fraction between 0 and 1")
    if args.nproc is not None and args.nproc < 2:
        raise ArgusError("--nproc: at least 2 ranks")
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x.strip()] if args.sizes else []
    except ValueError:
        raise ArgusError(f"--sizes {args.sizes!r}: a comma list of byte counts") from None
    if any(x < 4 for x in sizes):
        raise ArgusError("--sizes: each at least 4 bytes")
    directory = args.baseline_dir or default_dir()
    err = stderr_console()
    if launched() is not None and levels != (Level.NET,):
        raise ArgusError("started by a launcher (RANK, WORLD_SIZE, MASTER_ADDR set): only --level net runs across "
                         "ranks; run the other levels once per node, without a launcher")
    pauses = _pauses(args.again_after)  # a bad value is said before anything is measured
    # launched across ranks, every rank runs the baseline's runs in one process group
    runs = BASELINE_RUNS if args.save_baseline and launched() is not None else 1

    def fails(rep) -> bool:  # type: ignore[no-untyped-def]  # launched: rank 0 decides for every rank
        try:
            base = load_baseline(directory, rep.host)
        except ValueError:
            return False
        return any(v.status == Status.FAIL for v in judge(rep, base, threshold))

    config = CheckConfig(levels=levels, full=args.full, nproc=args.nproc, seconds=args.seconds, sizes=sizes,
                         runs=runs, recheck=fails if launched() is not None and not args.save_baseline else None)
    say = None if args.json else (lambda msg: err.print(f"[dim]{term(msg)}[/dim]"))
    with LoadMeter() as meter:
        report = run_checks(config, progress=say)
        if report is None:  # one rank of many: rank 0 reports for the job
            return EXIT_PASS
        if args.save_baseline and launched() is None:
            more = [run_checks(config, progress=say) for _ in range(BASELINE_RUNS - 1)]
            report.with_runs([r for r in more if r is not None])
        try:
            baseline = load_baseline(directory, report.host)
        except ValueError as exc:
            raise ArgusError(str(exc)) from None
        verdicts = judge(report, baseline, threshold)
        failed = [v for v in verdicts if v.status == Status.FAIL]
        remeasured: list = []
        if failed:
            # a failing figure is measured again (its level: its peers too) before it fails, and
            # fails only if it fails every time: a shared machine's slow phase passes. Launched
            # across ranks, every rank measured once more already (rank 0 asked them)
            first = {v.measurement.key: v for v in failed}
            times = 1
            if launched() is not None:
                again = report.again
            else:  # measured again, spread over seconds, until it passes (AGAIN_PAUSES_S)
                again_config = replace(config, levels=tuple(dict.fromkeys(v.measurement.level for v in failed)))

                def still_fails(rep) -> bool:  # type: ignore[no-untyped-def]
                    return any(v.status == Status.FAIL and v.measurement.key in first
                               for v in judge(rep, baseline, threshold))

                again, times = measure_again(lambda: run_checks(again_config, progress=say), still_fails,
                                              pauses)
            if again is not None:
                second = {v.measurement.key: v for v in judge(again, baseline, threshold)}
                remeasured = report.remeasured(again, {k for k in first if k in second})
                report.seconds += again.seconds
                verdicts = [_again(first[k], second[k], times) if (k := v.measurement.key) in remeasured else v
                            for v in verdicts]
    # launched across ranks, a node's other ranks are this process's siblings, not its children:
    # their CPU would read as another's load — not measured there
    load = meter.result() if launched() is None else None
    verdicts = mark_loaded(verdicts, load)
    failed = [v for v in verdicts if v.status == Status.FAIL]
    loaded = [v for v in verdicts if v.status == Status.LOADED]
    saved = None
    if args.save_baseline:
        saved = save_baseline(report, directory)
    doc = {**report.to_json(), "threshold": threshold,
           "baseline": {"path": str(directory), "found": baseline is not None,
                        "started_s": baseline.started_s if baseline is not None else None},
           "verdicts": [v.to_json() for v in verdicts], "passed": not failed and not loaded,
           "remeasured": [list(k) for k in remeasured], "load": load.to_json() if load is not None else None,
           "saved_baseline": str(saved) if saved else None}
    kept = None
    standings: list = []
    if args.store is not None:
        from argus.healthcheck.records import save_health
        from argus.healthcheck.standing import judged_nodes, node_standings
        from argus.store import Store

        try:
            root = Store.create(args.store).root  # a fleet's checks may come before its first job
            kept = save_health(root, doc)
            mine = set(judged_nodes(doc)) | {report.host}
            standings = [n for n in node_standings(root) if n.host in mine]
            doc["standing"] = [n.to_json() for n in standings]
        except Exception as exc:  # noqa: BLE001 - the verdict stands; say why it was not kept
            err.print(f"[yellow]not kept in {term(args.store)}: {term(str(exc))}[/yellow]")
    if args.remote_write:
        _push(args.remote_write, doc, standings, err)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        out = stdout_console()
        out.print(f"[bold]healthcheck[/bold] {term(report.host)} — {term(report.device)} — "
                  f"{report.seconds:.1f} s — baseline: "
                  + (term(f"{directory} ({len(baseline.measurements)} figures)") if baseline else "none saved"))
        table = Table(title_justify="left")
        for col in ("level", "check", "subject", "size", "value", "baseline", "peers", "verdict"):
            table.add_column(col, justify="right" if col in ("size", "value", "baseline", "peers") else "left")
        for v in verdicts:
            m = v.measurement
            colour = {"pass": "green", "fail": "bold red", "new": "dim", "loaded": "yellow"}[str(v.status)]
            table.add_row(str(m.level), term(m.metric), term(m.subject), _size(m.size_bytes),
                          f"{m.value:.4g} {m.unit}", f"{v.baseline:.4g}" if v.baseline is not None else "—",
                          f"{v.peers:.4g}" if v.peers is not None else "—",
                          f"[{colour}]{v.status}[/{colour}]"
                          + (f" {term(v.why)}" if v.status in (Status.FAIL, Status.LOADED) else ""))
        out.print(table)
        for check, reason in report.skipped:
            out.print(f"[dim]{term(check)}: {term(reason)}[/dim]")
        if failed:
            out.print(f"[bold red]{len(failed)} check(s) failed[/bold red]")
        elif loaded:
            out.print(f"[yellow]the node was loaded: other processes used {load.others_share:.0%} of its CPUs during "
                      f"the check, and {len(loaded)} figure(s) fell below the line — not judged; check again when "
                      "it is idle[/yellow]" if load is not None else "")
        else:
            out.print("[green]every check passed[/green]"
                      + ("" if baseline or args.save_baseline else " (no baseline yet: --save-baseline archives one)"))
        if remeasured:
            out.print(f"[dim]measured again before judging: {len(remeasured)} figure(s)[/dim]")
        if saved:
            out.print(f"baseline saved: {term(saved)}")
        if kept:
            out.print(f"kept in the store: {term(kept)}")
        for n in standings:
            out.print(_standing_line(n, just_now=report.started_s))
    return EXIT_FAIL if failed else EXIT_LOADED if loaded else EXIT_PASS


def _again(first, second, times: int = 1):  # type: ignore[no-untyped-def]
    """The verdict on a figure measured again ``times`` times: the last measurement's, saying what
    the first found."""
    from dataclasses import replace as _replace

    from argus.healthcheck import Status

    if second.status == Status.FAIL:
        count = "twice" if times == 1 else f"{times + 1} times"
        return _replace(second, why=f"{second.why} (measured {count}, failed each: first {first.why})")
    return _replace(second, why=f"{second.why}; failed once, passed measured again (first {first.why})")


def _when(t: float | None) -> str:
    import datetime as dt

    return "—" if t is None else dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _standing_line(n, just_now: float | None = None) -> str:
    if n.standing == "out":
        return (f"[bold red]{term(n.host)}: out of service[/bold red] since {_when(n.out_since_s)} "
                f"({term(', '.join(n.failing[:4]))}); a passing check re-admits it")
    if n.readmissions and n.readmissions[-1][1] == just_now:
        return (f"[green]{term(n.host)}: re-admitted[/green] — out since {_when(n.readmissions[-1][0])}, "
                "this check passes")
    return f"[green]{term(n.host)}: in service[/green] (last check {_when(n.last_check_s)})"


def _standing(args: argparse.Namespace) -> int:
    """``--standing``: the nodes the store's checks judged, and whether each is in service."""
    from argus.healthcheck.standing import Standing, node_standings
    from argus.store import Store

    if args.store is None:
        raise ArgusError("--standing reads the checks a store keeps: give --store STORE")
    nodes = node_standings(Store.open(args.store).root)
    if args.host is not None:
        nodes = [n for n in nodes if n.host == args.host]
        if not nodes:
            raise ArgusError(f"no health check in {args.store} judged {args.host!r}")
    if args.json:
        print(json.dumps({"store": str(args.store), "nodes": [n.to_json() for n in nodes]}, indent=1))
    else:
        out = stdout_console()
        if not nodes:
            out.print(f"no health check kept in {term(args.store)} (argus healthcheck --store keeps them)")
        table = Table(title_justify="left")
        for col in ("node", "standing", "since", "last check", "checks", "re-admitted", "failing"):
            table.add_column(col)
        for n in nodes:
            colour = "bold red" if n.standing == Standing.OUT else "green"
            table.add_row(term(n.host), f"[{colour}]{n.standing}[/{colour}]",
                          _when(n.out_since_s) if n.standing == Standing.OUT else "",
                          _when(n.last_check_s), str(n.checks),
                          ", ".join(_when(b) for _a, b in n.readmissions[-2:]), term(", ".join(n.failing[:3])))
        if nodes:
            out.print(table)
    return EXIT_FAIL if any(n.standing == Standing.OUT for n in nodes) else EXIT_PASS


def _push(url: str, doc: dict, standings: list, err) -> None:
    """Send the check to a Prometheus remote-write endpoint; a failure is said, never raised (the
    verdict stands on its own)."""
    from argus.healthcheck.export import health_write_request
    from argus.tsdb.sink import post_once

    try:
        status, text = post_once(url, health_write_request(doc, standings))
    except Exception as exc:  # noqa: BLE001
        status, text = 0, f"{type(exc).__name__}: {exc}"
    if not 200 <= status < 300:
        err.print(f"[yellow]remote write to {term(url)} failed ({status}): {term(text[:200])}[/yellow]")


def _size(n: int) -> str:
    if not n:
        return ""
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.3g} {unit}"
    return f"{n} B"
