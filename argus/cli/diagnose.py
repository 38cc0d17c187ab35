"""``argus diagnose S [--json]``: L1–L3 and root cause over a store; incidents ranked."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

from rich.table import Table

from argus.cli.progress import progress_bar, stderr_console, stdout_console
from argus.cli.sources import SOURCE_HELP
from argus.text import term

if TYPE_CHECKING:  # the CLI imports the analysis only when it runs one
    from argus.analysis.diagnosis import Diagnosis

__all__ = ["register", "print_diagnosis", "select", "EXIT_CLEAR", "EXIT_NO_DATA", "EXIT_ERROR", "EXIT_FOUND"]

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "dim"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="find what slows a job: incidents with culprits, impact and evidence",
                       description="Run progressive diagnosis (L1 anomalous windows, L2 stragglers, L3 degraded "
                                   "kernels, root cause) over a store and report incidents.")
    p.add_argument("store", help=SOURCE_HELP)
    p.add_argument("--json", action="store_true", help="print the incidents document (JSON) on stdout")
    p.add_argument("--run", help="run id (default: latest)")
    p.add_argument("--attempt", help="attempt id (default: latest)")
    p.add_argument("--window-steps", type=int, help="steps per analysis window (default: the store's windows, ≥ 5)")
    p.add_argument("--no-store", action="store_true", help="do not write the incidents into the store")
    p.add_argument("--evidence", action="store_true", help="with the human output, list each incident's evidence")
    p.add_argument("--fail-on", choices=["warning", "critical"],
                   help="exit 3 when an incident this severe or worse is found (within --steps); exit 0 when none, "
                        "1 when the store holds no data, 2 on an error — for a prolog, a CI gate or a cron job")
    p.add_argument("--severity", choices=SEVERITY_ORDER, help="show only incidents at least this severe")
    p.add_argument("--steps", type=_step_range, metavar="A-B",
                   help="only incidents whose steps overlap A–B (e.g. 100-200; 100- for step 100 on)")
    p.add_argument("--since", type=_duration, metavar="DURATION",
                   help="only incidents in the job's last DURATION of steps (e.g. 30m, 2h, 90s)")
    p.set_defaults(func=run)


def _duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1d`` (or plain seconds) → seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use e.g. 90s, 30m, 2h") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive")
    return value


def _since_steps(attempt, seconds: float) -> tuple[int, int] | None:
    """The steps that ended in the job's last ``seconds`` (by the ranks' own clocks)."""
    rows = attempt.sql("SELECT step, max(end_ns) AS e FROM steps WHERE end_ns >= 0 GROUP BY step").to_pylist()
    if not rows:
        return None
    last = max(r["e"] for r in rows)
    recent = [r["step"] for r in rows if r["e"] >= last - seconds * 1e9]
    return (min(recent), 2**62)


#: Exit codes of ``argus diagnose`` (docs/diagnosis.md, "Exit codes").
EXIT_CLEAR, EXIT_NO_DATA, EXIT_ERROR, EXIT_FOUND = 0, 1, 2, 3
SEVERITY_ORDER = ["info", "warning", "critical"]


def _step_range(text: str) -> tuple[int, int]:
    a, sep, b = text.partition("-")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if (sep and b.strip()) else (lo if not sep else 2**62)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step range: use A-B, A- or A (e.g. 100-200)") from None
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"{text!r}: the range must run forward from step 0 or later")
    return lo, hi


def select(incidents: list, min_severity: str | None, steps: tuple[int, int] | None) -> list:
    """The incidents at least ``min_severity`` whose window overlaps ``steps``."""
    floor = SEVERITY_ORDER.index(min_severity) if min_severity else 0
    if steps is not None and steps[0] > steps[1]:
        return []
    return [i for i in incidents if SEVERITY_ORDER.index(str(i.severity)) >= floor
            and (steps is None or (i.start_step <= steps[1] and i.end_step >= steps[0]))]


def run(args: argparse.Namespace) -> int:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.cli.sources import open_source_attempt

    attempt = open_source_attempt(args.store, args.run, args.attempt)
    if not attempt.files("steps") and not attempt.files("phases") and not attempt.files("hangs"):
        stderr_console().print(
            f"[bold]no data[/bold]: {term(attempt.identity.run_id)} attempt {term(attempt.identity.attempt_id)} in "
            f"{term(args.store)} holds "
            "no steps, phases or hang snapshots, so there is nothing to diagnose (did any rank connect? `argus run` "
            "traces processes that call torch.distributed.init_process_group)", markup=True, highlight=False)
        return EXIT_NO_DATA
    config = DiagnoseConfig(window_steps=args.window_steps, store_incidents=not args.no_store)
    n_windows = max(1, len(attempt.sql("SELECT DISTINCT step FROM steps")) // (args.window_steps or 5))
    with progress_bar("diagnosing windows", n_windows) as advance:
        diagnosis = diagnose(attempt, config, on_window=lambda done, total: advance())
    diagnosis_all = diagnosis.incidents
    if args.since is not None:
        since = _since_steps(attempt, args.since)
        if since is not None:
            lo = max(since[0], args.steps[0]) if args.steps else since[0]
            hi = args.steps[1] if args.steps else since[1]
            args.steps = (lo, hi)  # lo > hi: the two filters do not overlap, nothing is kept
    in_range = select(diagnosis.incidents, None, args.steps)
    shown = select(in_range, args.severity, None)
    if len(shown) != len(diagnosis.incidents):
        diagnosis = dataclasses.replace(diagnosis, incidents=shown)
    if args.json:
        doc = diagnosis.to_json()
        if args.severity or args.steps:  # (--since is given as the steps it covers)
            doc["filters"] = {**({"min_severity": args.severity} if args.severity else {}),
                              **({"since_s": args.since} if args.since is not None else {}),
                              **({"steps": list(args.steps)} if args.steps else {}),
                              "left_out": len(diagnosis_all) - len(shown)}
        print(json.dumps(doc, indent=2, default=str))
    else:
        print_diagnosis(diagnosis, evidence=args.evidence, left_out=len(diagnosis_all) - len(shown))
    # what the store lacked (damaged files, uncommitted windows) and, on a read-only store,
    # that only storing the incidents was skipped: the diagnosis above stands
    for line in [*diagnosis.missing, *([diagnosis.store_note] if diagnosis.store_note else [])]:
        stderr_console().print(f"[yellow]{term(line)}[/yellow]", markup=True, highlight=False)
    if args.fail_on:
        floor = SEVERITY_ORDER.index(args.fail_on)
        return EXIT_FOUND if any(SEVERITY_ORDER.index(str(i.severity)) >= floor for i in in_range) else EXIT_CLEAR
    return EXIT_CLEAR


def _hours(h: float | None) -> str:
    return "-" if h is None else f"{h:.2f}" if h >= 0.01 else f"{h:.2g}"


def deep_lines(evidence: list[dict]) -> list[str]:
    """One line each for what L4/L5 found: the what-if, the critical path, the pipeline's
    origin stage, the device gaps of a stall and the host's stacks."""
    from argus.analysis.evidence import EvidenceKind as K

    by = {e.get("kind"): e for e in evidence}
    lines = []
    if K.WHAT_IF in by:
        w = by[K.WHAT_IF]
        pairs = ", ".join(f"{a:.3f}→{b:.3f} s" for a, b in list(zip(w["step_s"], w["without_fault_s"]))[:3])
        lines.append(f"L4 what-if: without the culprits' excess {pairs} (replayed {len(w['steps'])} step(s)); "
                     f"{w['extra_s']:.2f} s lost over {w['covers_steps']} steps")
    if K.ATTRIBUTION in by:
        a = by[K.ATTRIBUTION]
        s = (a.get("job") or {}).get("slowdown")
        parts = ""
        if isinstance(s, dict):
            parts = (f" (the job ×{s.get('durations', 1):.2f} its ideal step: ranks against peers ×{s.get('worker', 1):.2f}, "
                     f"stages ×{s.get('stage', 1):.2f}, time outside phases ×{s.get('host', 1):.2f})")
        who = a.get("group") or "the group"
        lines.append(f"L4 attribution: {who} explains {100 * float(a.get('share') or 0):.0f}% of the "
                     f"{a.get('part', '')} slowdown{parts}")
    if K.CRITICAL_PATH in by and by[K.CRITICAL_PATH]["by_rank"]:
        top = by[K.CRITICAL_PATH]["by_rank"][:3]
        lines.append("L4 critical path: " + ", ".join(f"rank {t['rank']} {100 * t['share']:.0f}%" for t in top))
    if K.PIPELINE in by:
        p = by[K.PIPELINE]
        amp = f", amplification ×{p['amplification']:.2f}" if p.get("amplification") is not None else ""
        lines.append(f"L4 pipeline: {p['note']}{amp}")
    if K.GPU_IDLE in by:
        g = by[K.GPU_IDLE]
        how = "measured" if g.get("method") == "raw_kernels" else "estimated"
        lines.append(f"L4 device idle {g.get('idle_pct', 0):.0f}% ({how}) in {g['phase']} step {g['step']}: "
                     f"{g['phase_ms']:.0f} ms vs peers' {g.get('peer_phase_ms') or 0:.0f} ms")
    if K.HOST_PHASES in by:
        h = by[K.HOST_PHASES]
        lines.append(f"L5 host: {h['cause'].replace('_', ' ')} (measured: {h['phase']} {h['rank_s']:.3f} s a step "
                     f"against peers' {h['peers_s']:.3f} s, {100 * h['share']:.0f}% of the stall)")
    elif K.STACKS in by:
        st = by[K.STACKS]
        frame = st["top_frames"][0]["frames"].split(";")[-1] if st.get("top_frames") else "-"
        lines.append(f"L5 host: {st['cause'].replace('_', ' ')} ({st['samples']} samples), top frame {frame}")
    return [term(x) for x in lines]


def print_diagnosis(diagnosis: Diagnosis, evidence: bool = False, left_out: int = 0) -> None:
    """``left_out``: incidents the caller's filters (--severity, --steps) removed: said, never
    passed off as a healthy job."""
    out = stdout_console()
    a = diagnosis.attempt
    l1 = diagnosis.l1
    steps = f"steps {int(l1.steps.min())}–{int(l1.steps.max())}" if len(l1.steps) else "no steps"
    out.print(f"[bold]{term(a.identity.run_id)}[/bold] attempt {term(a.identity.attempt_id)}: {a.layout.world_size} "
              f"ranks ({term(a.layout)}), {steps}, healthy step time {l1.baseline_s:.3f} s")
    faults = l1.faults
    if faults:
        out.print("L1: " + term("; ".join(f"{w.kind} steps {w.start_step}–{w.end_step} ×{w.magnitude:.2f}"
                                          for w in faults[:6])))
    normal = [w for w in l1.windows if w.kind in ("warmup", "checkpoint")]
    if normal:
        out.print("[dim]recognised as normal: " + term("; ".join(f"{w.kind} {w.start_step}–{w.end_step}"
                                                                for w in normal)) + "[/dim]")
    cov = diagnosis.coverage
    partial = cov.sentence() if cov is not None else ""
    if partial:
        out.print(f"[yellow]{term(partial)}[/yellow]")
    depth = diagnosis.depth
    thin = depth.sentence() if depth is not None else ""
    if left_out:
        out.print(f"[yellow]{left_out} incident(s) left out by --severity/--steps/--since[/yellow]")
    if not diagnosis.incidents and left_out:
        _print_observations(out, diagnosis.observations)
        return
    if not diagnosis.incidents:
        if cov is not None and cov.present and cov.comparable == 0:
            out.print("[yellow]no incident found, and none could be: nothing was compared[/yellow]")
        elif thin:
            out.print(f"[yellow]no incident found, but {term(thin)}[/yellow]")
        elif partial:
            out.print(f"[green]no incident[/green] among the {cov.comparable if cov else 0} ranks that could be compared")
        else:
            out.print("[green]no incident[/green]: every rank's work, collectives and kernels match its peers'")
        _print_observations(out, diagnosis.observations)
        return
    table = Table(title=f"{len(diagnosis.incidents)} incident(s), most severe first", title_justify="left")
    for col in ("sev", "class", "state", "culprits", "steps", "phase", "impact", "action"):
        table.add_column(col, overflow="fold")
    for inc in diagnosis.incidents:
        ranks = ", ".join(map(str, inc.culprit_ranks[:6])) + ("…" if len(inc.culprit_ranks) > 6 else "")
        hosts = term(", ".join(inc.hosts[:3]) + ("…" if len(inc.hosts) > 3 else ""))
        impact = (f"+{inc.slowdown_pct:.1f}% · {_hours(inc.gpu_hours_lost)} GPU-h"
                  if inc.slowdown_pct is not None else "not measurable")
        table.add_row(f"[{_STYLE.get(inc.severity, 'default')}]{term(inc.severity)}[/]", term(inc.klass),
                      term(inc.state), f"ranks {ranks}\n{hosts}" if ranks else "none (the whole job)", f"{inc.start_step}–{inc.end_step}" if inc.start_step >= 0 else "—",
                      term(inc.phase or "-"), impact, term(inc.action))
    out.print(table)
    for inc in diagnosis.incidents:
        out.print(f"[bold]{term(inc.id)}[/bold] {term(inc.summary)}")
        for line in deep_lines(inc.evidence):
            out.print(f"    [cyan]{line}[/cyan]", markup=True, highlight=False)
        if evidence:
            for ev in inc.evidence:
                out.print("    " + term(json.dumps(ev, default=str)[:300]))
    if thin:
        out.print(f"[yellow]{term(thin)}[/yellow]")
    _print_observations(out, diagnosis.observations)
    stored = any(a.files("incidents"))
    stderr_console().print(f"[dim]diagnosed in {diagnosis.timings_s['total']:.1f} s"
                           + (f"; incidents in {term(a.path / 'incidents')}" if stored else "") + "[/dim]")


def _print_observations(out, observations) -> None:
    """What each rank's own timeline shows: measured, not compared, never a verdict."""
    if not observations:
        return
    out.print("observations (measured on each rank's own timeline; not verdicts):")
    for o in observations:
        out.print(f"  [cyan]{term(o.kind)}[/cyan] {term(o.summary)}", markup=True, highlight=False)
