"""``argus info S``: what a store holds — attempts, tables, step times, phases, injected truth."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from argus.cli.progress import stdout_console
from argus.cli.sources import SOURCE_HELP, open_source_attempt, store_root
from argus.store import Attempt, Store
from argus.text import term

__all__ = ["register", "print_store_summary", "store_summary", "sparkline"]

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
    p.add_argument("store", help=SOURCE_HELP)
    p.add_argument("--run", help="run id (default: latest)")
    p.add_argument("--attempt", help="attempt id (default: latest)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document")
    p.set_defaults(func=lambda a: print_store_summary(a.store, a.run, a.attempt, as_json=a.json))


def store_summary(path: str | Path, run_id: str | None = None, attempt_id: str | None = None) -> dict:
    """What ``argus info`` shows, as data."""
    attempt = open_source_attempt(str(path), run_id, attempt_id)
    root = store_root(attempt)
    store = Store.open(root)
    attempts = store.attempts()
    meta = attempt.meta
    topo = attempt.topology()
    doc: dict = {
        "store": str(store.root), "attempts": len(attempts), "run_id": attempt.identity.run_id,
        "attempt_id": attempt.identity.attempt_id, "source": meta.get("source"), "scenario": meta.get("scenario"),
        "layout": str(attempt.layout), "order": attempt.layout.order_str, "world_size": topo.world_size,
        "hosts": len(topo.host_names),
        "tables": {name: {"files": st.files, "rows": st.rows, "bytes": st.bytes} for name, st in attempt.stats().items()},
        "steps": None, "phases": [], "truth": None,
    }
    # Through Attempt.sql: a file whose data pages are corrupt is set aside, not a traceback.
    steps = _rows(attempt,
        "SELECT step, count(*) AS ranks, "
        "median(CASE WHEN end_ns >= 0 THEN end_ns - start_ns END) / 1e9 AS step_s, "
        "sum(CASE WHEN end_ns < 0 THEN 1 ELSE 0 END) AS unfinished "
        "FROM steps GROUP BY step ORDER BY step")
    if steps:
        times = [float("inf") if unf else (s if s is not None else float("inf")) for _, _, s, unf in steps]
        finite = sorted(t for t in times if t != float("inf"))
        doc["steps"] = {"first": int(steps[0][0]), "last": int(steps[-1][0]),
                        "median_s": finite[len(finite) // 2] if finite else None,
                        "min_s": finite[0] if finite else None, "max_s": finite[-1] if finite else None,
                        "step_s": [None if t == float("inf") else round(t, 6) for t in times],
                        "unfinished": [int(s) for s, _, _, unf in steps if unf]}
    phases = _rows(attempt,
        "SELECT name, category, count(*) AS n, median(dur_ns) / 1e6 AS med_ms, "
        "quantile_cont(dur_ns, 0.99) / 1e6 AS p99_ms, sum(dur_ns) / 1e9 AS total_s "
        "FROM phases WHERE dur_ns >= 0 GROUP BY name, category ORDER BY total_s DESC LIMIT 15")
    doc["phases"] = [{"name": n, "category": c, "rows": int(k), "median_ms": m, "p99_ms": p, "total_s": t}
                     for n, c, k, m, p, t in phases]
    truth_path = root / "truth.json"
    if truth_path.exists():
        doc["truth"] = json.loads(truth_path.read_text())
    doc["damage"] = [d.reason for d in attempt.damage]
    return doc


def print_store_summary(path: str | Path, run_id: str | None = None, attempt_id: str | None = None,
                        as_json: bool = False) -> int:
    doc = store_summary(path, run_id, attempt_id)
    if as_json:
        print(json.dumps(doc, indent=1, default=str))
        return 0
    con_out = stdout_console()
    n = doc["attempts"]
    con_out.print(f"[bold]store[/bold] {term(doc['store'])}  ({n} attempt{'s' * (n != 1)})")
    con_out.print(f"[bold]run[/bold] {term(doc['run_id'])}  attempt {term(doc['attempt_id'])}  "
                  f"source={term(doc['source'])}"
                  + (f"  scenario={term(doc['scenario'])}" if doc["scenario"] is not None else ""))
    con_out.print(f"[bold]layout[/bold] {term(doc['layout'])} (order {term(doc['order'])}) — "
                  f"{doc['world_size']} ranks on {doc['hosts']} hosts")

    tables = Table(title="tables", title_justify="left")
    for col in ("table", "files", "rows", "MB"):
        tables.add_column(col, justify="right" if col != "table" else "left")
    for name, st in doc["tables"].items():
        tables.add_row(term(name), f"{st['files']:,}", f"{st['rows']:,}", f"{st['bytes'] / 1e6:.2f}")
    con_out.print(tables)

    st = doc["steps"]
    if st:
        nan = float("nan")
        med, lo, hi = (nan if v is None else v for v in (st["median_s"], st["min_s"], st["max_s"]))
        con_out.print(f"[bold]steps[/bold] {st['first']}..{st['last']}  median {med:.3f} s  "
                      f"min {lo:.3f} s  max {hi:.3f} s")
        con_out.print(f"  step time  {sparkline([float('inf') if t is None else t for t in st['step_s']])}")
        if st["unfinished"]:
            con_out.print(f"  [red]steps that never finished on some ranks: {st['unfinished']}[/red]")
    if doc["phases"]:
        t = Table(title="phases (top 15 by total time)", title_justify="left")
        for col in ("phase", "category", "rows", "median ms", "p99 ms", "total s"):
            t.add_column(col, justify="left" if col in ("phase", "category") else "right")
        for ph in doc["phases"]:
            t.add_row(term(ph["name"]), term(ph["category"]), f"{ph['rows']:,}", f"{ph['median_ms']:.3f}",
                      f"{ph['p99_ms']:.3f}", f"{ph['total_s']:,.1f}")
        con_out.print(t)

    truth = doc["truth"]
    if truth:
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
    for reason in doc["damage"]:
        con_out.print(f"[yellow]skipped[/yellow] {term(reason)}")
    return 0


def _rows(attempt: Attempt, query: str) -> list[tuple]:
    table = attempt.sql(query)
    return list(zip(*(c.to_pylist() for c in table.columns))) if table.num_columns else []
