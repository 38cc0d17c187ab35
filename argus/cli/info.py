"""``argus info S``: what a store holds — attempts, tables, step times, phases, injected truth."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from argus.cli.progress import stdout_console
from argus.store import Attempt, Store
from argus.text import term

__all__ = ["register", "print_store_summary", "sparkline"]

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """Unicode bars scaled between the smallest and largest finite value; ``✕`` = never ended."""
    finite = [v for v in values if v == v and v not in (float("inf"), None)]
    if not finite:
        return ""
    lo, hi = min(finite), max(finite)
    out = []
    for v in values:
        if v is None or v != v or v == float("inf"):
            out.append("✕")
        else:
            out.append(_BARS[0 if hi == lo else min(7, int((v - lo) / (hi - lo) * 7.999))])
    return "".join(out)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="summarise what a store holds",
                       description="Summarise a store: attempts, tables, step times, phases and, for "
                                   "simulated runs, the injected fault.")
    p.add_argument("store", help="store directory")
    p.add_argument("--run", help="run id (default: latest)")
    p.add_argument("--attempt", help="attempt id (default: latest)")
    p.set_defaults(func=lambda a: print_store_summary(a.store, a.run, a.attempt))


def print_store_summary(path: str | Path, run_id: str | None = None, attempt_id: str | None = None) -> int:
    con_out = stdout_console()
    store = Store.open(path)
    attempts = store.attempts()
    attempt = store.attempt(run_id, attempt_id)
    meta = attempt.meta
    topo = attempt.topology()
    con_out.print(f"[bold]store[/bold] {term(store.root)}  ({len(attempts)} attempt{'s' * (len(attempts) != 1)})")
    con_out.print(f"[bold]run[/bold] {term(attempt.identity.run_id)}  attempt {term(attempt.identity.attempt_id)}  "
                  f"source={term(meta.get('source'))}"
                  + (f"  scenario={term(meta['scenario'])}" if "scenario" in meta else ""))
    con_out.print(f"[bold]layout[/bold] {term(attempt.layout)} (order {term(attempt.layout.order_str)}) — "
                  f"{topo.world_size} ranks on {len(topo.host_names)} hosts")

    tables = Table(title="tables", title_justify="left")
    for col in ("table", "files", "rows", "MB"):
        tables.add_column(col, justify="right" if col != "table" else "left")
    for name, st in attempt.stats().items():
        tables.add_row(term(name), f"{st.files:,}", f"{st.rows:,}", f"{st.bytes / 1e6:.2f}")
    con_out.print(tables)

    # Through Attempt.sql: a file whose data pages are corrupt is set aside, not a traceback.
    steps = _rows(attempt,
        "SELECT step, count(*) AS ranks, "
        "median(CASE WHEN end_ns >= 0 THEN end_ns - start_ns END) / 1e9 AS step_s, "
        "sum(CASE WHEN end_ns < 0 THEN 1 ELSE 0 END) AS unfinished "
        "FROM steps GROUP BY step ORDER BY step")
    if steps:
        times = [float("inf") if unf else (s if s is not None else float("inf")) for _, _, s, unf in steps]
        finite = sorted(t for t in times if t != float("inf"))
        med = finite[len(finite) // 2] if finite else float("nan")
        con_out.print(f"[bold]steps[/bold] {steps[0][0]}..{steps[-1][0]}  median {med:.3f} s  "
                      f"min {finite[0] if finite else float('nan'):.3f} s  "
                      f"max {finite[-1] if finite else float('nan'):.3f} s")
        con_out.print(f"  step time  {sparkline(times)}")
        hung = [s for s, _, _, unf in steps if unf]
        if hung:
            con_out.print(f"  [red]steps that never finished on some ranks: {hung}[/red]")
    phases = _rows(attempt,
        "SELECT name, category, count(*) AS n, median(dur_ns) / 1e6 AS med_ms, "
        "quantile_cont(dur_ns, 0.99) / 1e6 AS p99_ms, sum(dur_ns) / 1e9 AS total_s "
        "FROM phases WHERE dur_ns >= 0 GROUP BY name, category ORDER BY total_s DESC LIMIT 15")
    if phases:
        t = Table(title="phases (top 15 by total time)", title_justify="left")
        for col in ("phase", "category", "rows", "median ms", "p99 ms", "total s"):
            t.add_column(col, justify="left" if col in ("phase", "category") else "right")
        for name, cat, n, med, p99, tot in phases:
            t.add_row(term(name), term(cat), f"{n:,}", f"{med:.3f}", f"{p99:.3f}", f"{tot:,.1f}")
        con_out.print(t)

    truth_path = Path(path) / "truth.json"
    if truth_path.exists():
        truth = json.loads(truth_path.read_text())
        con_out.print(f"[bold]ground truth[/bold] scenario={term(truth['scenario'])} class={term(truth['class'])}")
        for f in truth["faults"]:
            imp = f.get("impact", {})
            impact = ("job stalled" if imp.get("stalled") else
                      f"+{imp.get('slowdown_pct', 0):.1f}% step time, {imp.get('gpu_hours_lost', 0):.3f} GPU-h lost")
            ranks = f["culprit_ranks"]
            shown = ", ".join(map(str, ranks[:8])) + (f" … ({len(ranks)} ranks)" if len(ranks) > 8 else "")
            con_out.print(f"  {term(f['class'])}: ranks [{term(shown)}] on {term(', '.join(f['culprit_hosts'][:4]))}; "
                          f"steps {term(f['window']['start_step'])}–{term(f['window']['end_step'])}; "
                          f"phase {term(f.get('phase') or '-')}; {term(impact)}")
    for d in attempt.damage:
        con_out.print(f"[yellow]skipped[/yellow] {term(d.reason)}")
    return 0


def _rows(attempt: Attempt, query: str) -> list[tuple]:
    table = attempt.sql(query)
    return list(zip(*(c.to_pylist() for c in table.columns))) if table.num_columns else []
