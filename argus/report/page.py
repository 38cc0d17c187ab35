"""HTML assembly: the self-contained report document and the sections the web UI reuses.

The report is one file with inline CSS and inline SVG, no script, no external resource
(its Content-Security-Policy forbids them, so even a rendering bug cannot make it load or
run anything). Every user-derived string goes through ``esc``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from argus import __version__
from argus.report.charts import (L1_COLORS, cdf_chart, critical_path_chart, phase_heatmap_chart, pipeline_chart,
                                 step_time_chart, w1_matrix_chart, what_if_chart)
from argus.analysis.evidence import EvidenceKind
from argus.analysis.incident import Action, IncidentClass
from argus.analysis.remedies import in_the_job, named_cause
from argus.joblog.signatures import FAIL_STOP_KINDS
from argus.report.model import EvidenceFile, IncidentView, JobLogView, ReportData
from argus.report.svg import esc, fmt

__all__ = ["CSS", "render_report", "document", "summary_section", "step_section", "incidents_table", "verdict_banner",
           "cost_per_hour", "job_log_section",
           "incident_section", "PERFETTO_URL", "REPORT_CSP"]

PERFETTO_URL = "https://ui.perfetto.dev"
REPORT_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
              "form-action 'none'")
MAX_RANKS_LISTED = 64
MAX_EVIDENCE_ROWS = 80

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1b1b1b;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
header.top{background:#1f2a37;color:#fff;padding:10px 24px}
header.top a{color:#cfe3ff}
h1{font-size:20px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px}h3{font-size:15px;margin:18px 0 6px}
section.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:12px 16px;margin:12px 0}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #e6e8eb;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f0f2f5}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}dl.kv dt{color:#555}
dl.kv dd{margin:0}
.sev{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;color:#fff}
.sev-critical{background:#c62828}.sev-warning{background:#ef8f00}.sev-info{background:#78909c}
.culprit{color:#b00;font-weight:600}
.muted{color:#666}.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
svg.plot{max-width:100%;height:auto;display:block;margin:6px 0}
.scroll{overflow-x:auto}
.chip{display:inline-block;border-radius:3px;padding:0 6px;margin-right:4px;font-size:12px;color:#fff}
details>summary{cursor:pointer;color:#234}
.sbar{display:inline-block;height:9px;background:#1f77b4;vertical-align:middle}
figure{margin:8px 0 14px}figcaption{color:#555;font-size:12px;max-width:860px}
.fig-title{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;margin:6px 0 0;word-break:break-all}
section.verdict{border-radius:6px;padding:10px 16px;margin:12px 0;border:1px solid #dde1e6;border-left-width:6px;
background:#fff;font-size:15px}section.verdict dl.kv{margin:6px 0 2px}
.verdict-critical{border-left-color:#c62828}.verdict-warning{border-left-color:#ef8f00}
.verdict-info{border-left-color:#78909c}.verdict-clear{border-left-color:#2e7d32}.verdict-none{border-left-color:#999}
"""


def document(title: str, body: str, *, csp: str = REPORT_CSP, head_extra: str = "") -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(csp)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>{esc(title)}</title><style>{CSS}</style>{head_extra}</head>'
            f"<body>{body}</body></html>\n")


def _ranks(ranks: list[int], culprit: bool = True) -> str:
    cls = ' class="culprit"' if culprit else ""
    shown = ", ".join(esc(r) for r in ranks[:MAX_RANKS_LISTED])
    extra = len(ranks) - MAX_RANKS_LISTED
    more = f' <span class="muted">… {extra} more</span>' if extra > 0 else ""
    return f"<span{cls}>{shown}</span>{more}" if ranks else '<span class="muted">none</span>'


def _list(items: list[Any], limit: int = 12) -> str:
    shown = ", ".join(esc(x) for x in items[:limit])
    return shown + (f' <span class="muted">… {len(items) - limit} more</span>' if len(items) > limit else "") \
        if items else '<span class="muted">—</span>'


def summary_section(data: ReportData) -> str:
    rng = data.step_range
    steps = f"{rng[0]}–{rng[1]} ({rng[1] - rng[0] + 1} steps)" if rng else "no steps recorded"
    base = f"{data.baseline_s:.3f} s" if data.baseline_s else "—"
    n = len(data.incidents)
    sev: dict[str, int] = {}
    for v in data.incidents:
        sev[str(v.incident.get("severity"))] = sev.get(str(v.incident.get("severity")), 0) + 1
    counts = ", ".join(f"{k} {c}" for k, c in sorted(sev.items()))
    scenario = f"<dt>scenario</dt><dd>{esc(data.scenario)}</dd>" if data.scenario else ""
    diag = ("not diagnosed yet (stored incidents only)" if not data.diagnosed else
            f"diagnosed in {data.diagnosis_s:.1f} s" if data.diagnosis_s is not None else "diagnosed")
    return (f'<section class="card summary"><dl class="kv">'
            f"<dt>run</dt><dd class=\"mono\">{esc(data.run_id)}</dd><dt>attempt</dt><dd class=\"mono\">"
            f"{esc(data.attempt_id)}</dd><dt>layout</dt><dd class=\"mono\">{esc(data.layout)}</dd>"
            f"<dt>ranks</dt><dd>{data.ranks:,} on {data.hosts:,} hosts</dd><dt>steps</dt><dd>{esc(steps)}</dd>"
            f"<dt>baseline step time</dt><dd>{esc(base)}</dd>"
            f"<dt>incidents</dt><dd id=\"incident-count\">{n}{' (' + esc(counts) + ')' if counts else ''}</dd>"
            f"<dt>source</dt><dd>{esc(data.source)}</dd>{scenario}<dt>analysis</dt><dd>{esc(diag)}</dd>"
            f"{_missing(data.missing)}</dl></section>")


#: What each action asks of the operator, and why it is the one recommended.
ACTION_TEXT = {
    "observe": ("Keep watching", "its cost is below the line worth acting on, or its cause is the job's, not a node's"),
    "raise_trace_fidelity": ("Raise trace fidelity on the culprits (stacks at 10 Hz, kernels every step)",
                             "the slowdown is measured but its cause is not yet named"),
    "verify": ("Verify the hardware before acting: argus verify STORE {id}",
               "the culprits are found by comparison only; a healthcheck on the suspect beside a peer settles it"),
    "cordon_node": ("Cordon {hosts} at the next checkpoint",
                    "independent evidence agrees the hardware is at fault"),
    "checkpoint_and_restart": ("Checkpoint if it still can, then restart", "the job has stopped"),
}


def cost_per_hour(incident: dict[str, Any], ranks: int) -> float | None:
    """GPU-hours the fault burns per hour of training, from its measured slowdown: the job runs
    ``1 + p/100`` times slower, so ``p/(100+p)`` of every GPU's time is lost (all of it when the
    job has stopped)."""
    pct = (incident.get("impact") or {}).get("slowdown_pct")
    if pct is None:
        return None
    pct = float(pct)
    stopped = incident.get("class") in (IncidentClass.HANG, IncidentClass.FAIL_STOP)
    return ranks * (1.0 if pct >= 100.0 and stopped else pct / (100.0 + pct))


def verdict_banner(data: ReportData) -> str:
    """The first thing on the page: what is wrong, who, what it costs per hour, what to do and
    why — the most severe incident, then how many more there are."""
    if not data.diagnosed:
        return ('<section class="verdict verdict-none"><b>Not diagnosed yet</b>: the incidents below are the '
                "stored ones.</section>")
    if not data.incidents:
        return ('<section class="verdict verdict-clear" id="verdict"><b>No incident found</b>: every rank that could '
                "be compared matches its peers. <span class=\"muted\">(What was compared, and what could not be, "
                "is below.)</span></section>")
    top = data.incidents[0].incident
    sev = str(top.get("severity"))
    ranks = list(top.get("culprit_ranks") or [])
    hosts = list(top.get("hosts") or [])
    cost = cost_per_hour(top, data.ranks)
    imp = top.get("impact") or {}
    impact = (f"+{fmt(imp.get('slowdown_pct'))}% step time · <b>{cost:.2f} GPU-h lost per hour</b> of training"
              if cost is not None else "impact not measurable from this job")
    do, why = ACTION_TEXT.get(str(top.get("action")), (str(top.get("action")), ""))
    evidence = [e for e in top.get("evidence") or [] if isinstance(e, dict)]
    if top.get("remedy") and in_the_job(str(top.get("class")), evidence) and top.get("action") in (
            Action.OBSERVE, Action.RAISE_TRACE_FIDELITY, Action.VERIFY):
        cause = named_cause(evidence)
        do, why = "Change the job (the remedy below)", (f"the cause is named ({cause.replace('_', ' ')}) and is the "
                                                        "job's own: no node is at fault" if cause else
                                                        "the cause is the job's structure: no node is at fault")
    do = do.format(id=top.get("id", ""), hosts=", ".join(hosts[:3]) or "the culprits' host")
    more = len(data.incidents) - 1
    return (f'<section class="verdict verdict-{esc(sev)}" id="verdict">'
            f'<div class="v-what"><span class="sev sev-{esc(sev)}">{esc(sev)}</span> <b>{esc(top.get("class"))}</b> '
            f'<span class="muted">· {esc(top.get("state"))}</span> — {esc(top.get("summary") or "")}</div>'
            f'<dl class="kv"><dt>who</dt><dd class="v-who">ranks {_ranks(ranks[:16])}'
            f'{" …" if len(ranks) > 16 else ""} on <span class="mono">{_list(hosts, 4)}</span></dd>'
            f'<dt>cost</dt><dd class="v-cost">{impact}</dd>'
            f'<dt>do</dt><dd class="v-action"><b>{esc(do)}</b> <span class="muted">— {esc(why)}</span></dd>'
            + (f'<dt>remedy</dt><dd class="v-remedy">{esc(top["remedy"])}</dd>' if top.get("remedy") else "")
            + "</dl>"
            + (f'<div class="muted">{more} more incident(s) below.</div>' if more > 0 else "")
            + f' <a href="#{esc(data.incidents[0].id)}">evidence ↓</a></section>')


def _missing(lines: list[str], limit: int = 8) -> str:
    """What the store lacked (damaged files, uncommitted windows, windows without phases): the
    diagnosis ran on the rest, and the reader should know."""
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines[:limit])
    more = f"<li>… and {len(lines) - limit} more</li>" if len(lines) > limit else ""
    return f'<dt>not read</dt><dd class="missing"><ul>{items}{more}</ul></dd>'


def step_section(data: ReportData, highlight: tuple[int, int] | None = None) -> str:
    windows = [w for w in data.l1_windows]
    rows = "".join(
        f'<tr><td><span class="chip" style="background:{L1_COLORS.get(str(w.get("kind")), "#ffbf00")}">'
        f'{esc(w.get("kind"))}</span></td><td>{esc(w.get("start_step"))}–{esc(w.get("end_step"))}</td>'
        f'<td>×{fmt(w.get("magnitude"))}</td><td>{esc(w.get("detail", ""))}</td></tr>' for w in windows)
    table = (f"<table><tr><th>L1 window</th><th>steps</th><th>vs baseline</th><th>detail</th></tr>{rows}</table>"
             if rows else '<p class="muted">No anomalous window in the step-time series.</p>'
             if data.diagnosed else '<p class="muted">Step-time windows appear once the attempt is diagnosed.</p>')
    unfinished = (f'<p class="culprit">Steps that never finished on some rank: {_list(data.series.unfinished_steps)}'
                  "</p>" if data.series.unfinished_steps else "")
    return (f'<section class="card steps">{step_time_chart(data, highlight).html()}{unfinished}'
            f"{table}</section>")


def _utc(t: Any) -> str:
    return "—" if t is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


def nodes_section(data: ReportData) -> str:
    """The job's hosts as the store's health checks judge them: a node out of service (it failed
    a check, none passed since) first — empty when the store keeps no check of them."""
    if not data.nodes:
        return ""
    rows = []
    for n in data.nodes:
        out = n.get("standing") == "out"
        readmitted = ", ".join(_utc(r.get("readmitted_s")) for r in (n.get("readmissions") or [])[-2:])
        rows.append(f'<tr class="node-row"><td class="mono">{esc(n.get("host"))}</td>'
                    f'<td><span class="sev sev-{"critical" if out else "info"}">'
                    f'{"out of service" if out else "in service"}</span></td>'
                    f'<td>{esc(_utc(n.get("out_since_s")) if out else "")}</td><td>{esc(_utc(n.get("last_check_s")))}</td>'
                    f'<td>{esc(readmitted)}</td><td>{_list(list(n.get("failing") or []), 4)}</td></tr>')
        figures = n.get("figures") or []
        if figures:
            rows.append(f'<tr class="node-figures"><td colspan="6"><details{" open" if out else ""}><summary>'
                        f'last check: {len(figures)} figure(s), failures first</summary>{_figure_table(figures)}'
                        "</details></td></tr>")
    return ("<h2>Node health</h2><table class=\"nodes\"><tr><th>node</th><th>standing</th><th>out since</th>"
            "<th>last check</th><th>re-admitted</th><th>failing</th></tr>" + "".join(rows) + "</table>"
            '<p class="muted">From the checks kept in the store (<span class="mono">argus healthcheck --store</span>);'
            " a node that failed stays out until a later check of it passes.</p>")


def _figure_table(figures: list[dict[str, Any]]) -> str:
    """A node's last check, figure by figure: measured, its own baseline, its peers' median (or
    what the hardware says it should be), the deficit and the verdict."""
    def num(v: Any) -> str:
        return fmt(float(v), 3) if isinstance(v, (int, float)) else "—"

    rows = []
    for f in figures:
        size = f" @{f['size_bytes']} B" if f.get("size_bytes") else ""
        deficit = f.get("deficit")
        short = f"{100 * float(deficit):.1f}%" if isinstance(deficit, (int, float)) else "—"
        ref = f.get("peers") if f.get("expected") is None else f.get("expected")
        sev = "critical" if f.get("status") == "fail" else "info"
        rows.append(f'<tr><td class="mono">{esc(str(f.get("metric")) + size)}</td><td class="mono">'
                    f'{esc(f.get("subject"))}</td><td>{num(f.get("value"))} {esc(f.get("unit") or "")}</td>'
                    f'<td>{num(f.get("baseline"))}</td><td>{num(ref)}</td><td>{esc(short)}</td>'
                    f'<td><span class="sev sev-{sev}">{esc(f.get("status"))}</span></td></tr>')
    return ('<table class="node-figures"><tr><th>figure</th><th>subject</th><th>measured</th><th>baseline</th>'
            f"<th>peers / expected</th><th>deficit</th><th>verdict</th></tr>{''.join(rows)}</table>")


def _log_time(ts_ns: Any) -> str:
    """UTC to the millisecond (the scanner's clock: when ``argus run`` read the line)."""
    try:
        ns = int(ts_ns)
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns // 10**6 % 1000:03d}"
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ts_ns)


def job_log_section(log: JobLogView | None) -> str:
    """Everything the job's output said that a signature knows, by kind — not only what an
    incident took as evidence: an NCCL warning on a job that then ran on is still worth reading."""
    if log is None:
        return ""
    other = (f'<p class="muted">{log.other_lines:,} other line(s) matched no signature: counted, not kept.</p>'
             if log.other_lines else "")
    if not log.counts:
        return (f'<h2>Job log</h2><section class="card job-log"><p class="muted">No line of the job\'s output '
                f"matched a known signature.</p>{other}</section>")
    chips = " ".join(f'<span class="chip" style="background:{"#c62828" if k in FAIL_STOP_KINDS else "#546e7a"}">'
                     f'{esc(k.replace("_", " "))} {n:,}</span>' for k, n in log.counts.items())
    parts = []
    for kind, n in log.counts.items():
        rows = "".join(
            f'<tr><td class="mono">{esc(_log_time(e.get("ts_ns")))}</td>'
            f'<td>{esc(e.get("rank")) if isinstance(e.get("rank"), int) and e["rank"] >= 0 else "—"}</td>'
            f'<td class="mono">{esc(e.get("host") or "")}</td><td>{esc(e.get("stream") or "")}</td>'
            f'<td class="mono">{esc(str(e.get("text") or "")[:500])}</td></tr>' for e in log.shown(kind))
        more = n - len(log.shown(kind))
        stops = ' <span class="culprit">(a rank stopped)</span>' if kind in FAIL_STOP_KINDS else ""
        parts.append(f'<h4>{esc(kind.replace("_", " "))} <span class="muted">({n:,})</span>{stops}</h4>'
                     f'<div class="scroll"><table class="log-events" data-kind="{esc(kind)}"><tr><th>time (UTC)</th>'
                     f"<th>rank</th><th>host</th><th>stream</th><th>line</th></tr>{rows}</table></div>"
                     + (f'<p class="muted">… {more:,} more in the store\'s logs table</p>' if more > 0 else ""))
    return (f'<h2>Job log</h2><section class="card job-log"><p>What the job\'s output said, by kind '
            f'(<span class="mono">argus run</span>\'s logs table): {chips}</p>{other}{"".join(parts)}</section>')


def incidents_table(data: ReportData, href: Callable[[IncidentView], str]) -> str:
    if not data.incidents:
        return ('<p class="healthy">No incident: every rank\'s work, collectives and kernels match its peers\'.</p>'
                if data.diagnosed else '<p class="muted">No incident yet.</p>')
    rows = []
    for v in data.incidents:
        j = v.incident
        w = j.get("window") or {}
        imp = j.get("impact") or {}
        impact = (f"+{fmt(imp.get('slowdown_pct'))}% · {fmt(imp.get('gpu_hours_lost'))} GPU-h"
                  if imp.get("slowdown_pct") is not None else "not measurable")
        rows.append(f'<tr class="incident-row"><td><span class="sev sev-{esc(j.get("severity"))}">'
                    f'{esc(j.get("severity"))}</span></td><td><a href="{esc(href(v))}">{esc(j.get("class"))}</a></td>'
                    f'<td>{esc(j.get("state"))}</td><td>{_ranks(list(j.get("culprit_ranks") or [])[:12])}'
                    f'{" …" if len(j.get("culprit_ranks") or []) > 12 else ""}</td>'
                    f'<td>{esc(w.get("start_step"))}–{esc(w.get("end_step"))}</td><td>{esc(j.get("phase") or "—")}</td>'
                    f'<td>{esc(impact)}</td><td>{esc(j.get("action"))}</td></tr>')
    return ("<table class=\"incidents\"><tr><th>severity</th><th>class</th><th>state</th><th>culprit ranks</th>"
            "<th>steps</th><th>phase</th><th>impact</th><th>action</th></tr>" + "".join(rows) + "</table>")


def _header(j: dict[str, Any], source: str) -> str:
    w = j.get("window") or {}
    imp = j.get("impact") or {}
    steps = list(j.get("steps") or [])
    affected = f"<dt>steps affected</dt><dd>{_list(steps, 30)}</dd>" if steps else ""
    src = '<dt>source</dt><dd>stored incident (incidents table)</dd>' if source == "store" else ""
    return (f'<h3><span class="sev sev-{esc(j.get("severity"))}">{esc(j.get("severity"))}</span> '
            f'{esc(j.get("class"))} <span class="muted">· {esc(j.get("state"))} · {esc(j.get("id"))}</span></h3>'
            f'<p class="summary">{esc(j.get("summary") or "")}</p><dl class="kv">'
            f'<dt>culprit ranks</dt><dd class="culprits">{_ranks(list(j.get("culprit_ranks") or []))}</dd>'
            f'<dt>hosts</dt><dd class="mono">{_list(list(j.get("hosts") or []))}</dd>'
            f'<dt>GPUs</dt><dd class="mono">{_list(list(j.get("gpus") or []), 4)}</dd>'
            f'<dt>window</dt><dd>steps {esc(w.get("start_step"))}–{esc(w.get("end_step"))}</dd>{affected}'
            f'<dt>phase</dt><dd class="mono">{esc(j.get("phase") or "—")}</dd>'
            f'<dt>kernels</dt><dd class="mono">{_list(list(j.get("kernels") or []), 6)}</dd>'
            f'<dt>impact</dt><dd>slowdown {fmt(imp.get("slowdown_pct"))}% · {fmt(imp.get("gpu_hours_lost"))} '
            f'GPU-hours lost</dd><dt>action</dt><dd><b>{esc(j.get("action"))}</b></dd>{src}</dl>')


def _stacks(ev: dict[str, Any]) -> str:
    frames = [f for f in ev.get("top_frames") or [] if isinstance(f, dict)]
    total = max([int(f.get("samples") or 0) for f in frames] + [1])
    rows = []
    for f in frames[:10]:
        parts = str(f.get("frames", "")).split(";")
        leaf = " ← ".join(reversed(parts[-3:]))
        n = int(f.get("samples") or 0)
        rows.append(f'<tr><td>{n}<br><span class="sbar" style="width:{60 * n / total:.0f}px"></span></td>'
                    f'<td class="mono">{esc(leaf)}<details><summary>full stack ({len(parts)} frames)</summary>'
                    + "<br>".join(esc(p) for p in parts) + "</details></td></tr>")
    return (f'<h4>Top stack frames of rank <span class="culprit">{esc(ev.get("rank"))}</span> · cause '
            f'<b>{esc(ev.get("cause", "unknown"))}</b> · {esc(ev.get("samples", "?"))} samples</h4>'
            f'<table class="stacks"><tr><th>samples</th><th>leaf frames (innermost first)</th></tr>{"".join(rows)}'
            "</table>")


def _what_if(ev: dict[str, Any]) -> str:
    nums = " · ".join(f"{label} {fmt(ev.get(k))}{unit}" for k, label, unit in (
        ("slowdown_pct", "slowdown", "%"), ("gpu_hours_lost", "GPU-hours lost", ""), ("extra_s", "extra time", " s"))
        if ev.get(k) is not None)
    chart = what_if_chart(ev)
    return f'<h4>What-if impact</h4><p class="what-if-numbers">{esc(nums)}</p>{chart.html() if chart else ""}'


def _gpu_idle(evs: list[dict[str, Any]]) -> str:
    keys = ("rank", "step", "phase", "microbatch", "phase_ms", "gpu_busy_ms", "idle_pct")
    rows = "".join("<tr>" + "".join(f"<td>{esc(fmt(e.get(k)) if isinstance(e.get(k), float) else e.get(k, '—'))}</td>"
                                    for k in keys) + "</tr>" for e in evs[:20])
    return ("<h4>GPU idle inside phases (host stall)</h4><table class=\"gpu-idle\"><tr>"
            + "".join(f"<th>{k}</th>" for k in keys) + f"</tr>{rows}</table>")


#: evidence fields drawn as charts elsewhere on the page, or too long for a cell
_EVIDENCE_SKIP = ("level", "kind", "w1_ms", "top_frames", "stages", "by_rank", "checks", "stacks")
MAX_EVIDENCE_COLUMNS = 10


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return esc(fmt(v))
    if isinstance(v, (list, tuple)):
        shown = ", ".join(str(x) for x in v[:8]) + (" …" if len(v) > 8 else "")
        return esc(shown[:160])
    if isinstance(v, dict):
        return esc("; ".join(f"{k} {x}" for k, x in list(v.items())[:6])[:160])
    return esc(str(v)[:160])


def _evidence_table(evidence: list[Any]) -> str:
    """All evidence, one table per kind with a column per field (not ``k=v`` strings)."""
    by_kind: dict[tuple[str, str], list[dict]] = {}
    for ev in evidence[:MAX_EVIDENCE_ROWS]:
        if isinstance(ev, dict):
            by_kind.setdefault((str(ev.get("level", "")), str(ev.get("kind", ""))), []).append(ev)
    parts = []
    for (level, kind), rows in by_kind.items():
        cols: list[str] = []
        for ev in rows:
            cols += [k for k in ev if k not in _EVIDENCE_SKIP and k not in cols]
        cols = cols[:MAX_EVIDENCE_COLUMNS]
        head = "".join(f"<th>{esc(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f'<td class="mono">{_cell(ev.get(c, ""))}</td>' for c in cols) + "</tr>"
                       for ev in rows)
        parts.append(f'<h5>{esc(kind)} <span class="muted">({esc(level)}, {len(rows)})</span></h5>'
                     f'<div class="scroll"><table class="evidence-{esc(kind)}"><tr>{head}</tr>{body}</table></div>')
    extra = len(evidence) - MAX_EVIDENCE_ROWS
    more = f'<p class="muted">… {extra} more</p>' if extra > 0 else ""
    return (f"<details class=\"evidence\"><summary>All evidence ({len(evidence)} entries)</summary>"
            f"{''.join(parts)}{more}</details>")


def _log_lines(e: dict[str, Any]) -> str:
    """What the job printed that bears on the incident (``argus run``'s logs table)."""
    rows = "".join(
        f'<tr><td>{esc(x.get("rank", -1) if x.get("rank", -1) >= 0 else "—")}</td><td>{esc(x.get("host", ""))}</td>'
        f'<td>{esc(x.get("step", "—"))}</td><td><span class="chip">{esc(str(x.get("kind", "")).replace("_", " "))}'
        f'</span></td><td class="mono">{esc(str(x.get("text", ""))[:300])}</td></tr>'
        for x in e.get("events") or [] if isinstance(x, dict))
    more = int(e.get("total") or 0) - len(e.get("events") or [])
    return (f'<h4>The job\'s log</h4><table class="log-lines"><tr><th>rank</th><th>host</th><th>step</th><th>kind</th>'
            f'<th>line</th></tr>{rows}</table>' + (f'<p class="muted">{more} more in the store\'s logs table</p>'
                                                     if more > 0 else ""))


def _collective_stacks(ev: dict[str, Any]) -> str:
    """Where the ranks of a stuck collective (Flight Recorder) are: the never-joined ranks' last
    collective and the waiting ranks' call, each distinct stack once with its ranks."""
    rows = []
    for st in [x for x in ev.get("stacks") or [] if isinstance(x, dict)][:16]:
        frames = [str(f) for f in st.get("frames") or []][:16]
        ranks = [r for r in st.get("ranks") or [] if isinstance(r, int)]
        try:
            n = int(st.get("n_ranks") or len(ranks))
        except (TypeError, ValueError):
            n = len(ranks)
        role = "never joined" if st.get("role") == "never_joined" else "waiting"
        state = f' <span class="muted">({esc(st.get("state"))})</span>' if st.get("state") else ""
        rows.append(f'<tr><td>{esc(role)}</td><td>{_ranks(ranks, st.get("role") == "never_joined")}'
                    + (f' <span class="muted">({n} ranks)</span>' if n > len(ranks) else "")
                    + f'</td><td class="mono">{esc(st.get("in") or "")}{state}</td>'
                    f'<td class="mono">{esc(frames[0] if frames else "—")}'
                    f'<details><summary>stack ({len(frames)} frames, innermost first)</summary>'
                    + "<br>".join(esc(f) for f in frames) + "</details></td></tr>")
    if not rows:
        return ""
    return (f'<h4>Stacks in {esc(str(ev.get("op") or "").split(":")[-1] or "the collective")} '
            f'#{esc(ev.get("seq"))} of {esc(ev.get("group_desc") or ev.get("group"))} (Flight Recorder)</h4>'
            '<table class="fr-stacks"><tr><th></th><th>ranks</th><th>their collective</th><th>where (the job\'s '
            f'frames)</th></tr>{"".join(rows)}</table>')


def _trace_files(view: IncidentView, file_href: Callable[[EvidenceFile], str]) -> str:
    how = (f'Open <a href="{PERFETTO_URL}" rel="noopener noreferrer" target="_blank">ui.perfetto.dev</a> and drag a '
           "trace file onto the page (or use <i>Open trace file</i>); the trace is read in your browser, nothing "
           "is uploaded. Each rank is a track; collectives are joined by flow arrows that end at the rank "
           "everybody waited for.")
    if not view.files:
        return ("<h4>Evidence trace</h4><p class=\"muted\">No Perfetto evidence file covers this window (the processor "
                "writes one for every slow window; the simulator writes none). Per-rank traces of any store: "
                "<span class=\"mono\">argus export kineto STORE --out DIR</span>, then " + how + "</p>")
    rows = "".join(f'<tr><td class="mono"><a class="evidence-file" href="{esc(file_href(f))}">{esc(f.rel_path)}</a>'
                   f'</td><td>{esc(f.host)}</td><td>{f"steps {f.steps[0]}–{f.steps[1]}" if f.steps else "—"}'
                   f"</td><td>{f.bytes / 1e6:.2f} MB</td></tr>" for f in view.files)
    more = (f'<p class="muted">{view.files_total - len(view.files)} more files under '
            f'<span class="mono">evidence/</span></p>' if view.files_total > len(view.files) else "")
    return (f"<h4>Evidence trace</h4><p>{how}</p><table class=\"trace-files\"><tr><th>file (relative to the attempt "
            f"directory)</th><th>host</th><th>window</th><th>size</th></tr>{rows}</table>{more}")


def incident_section(view: IncidentView, file_href: Callable[[EvidenceFile], str]) -> str:
    j = view.incident
    evidence = [e for e in j.get("evidence") or [] if isinstance(e, dict)]
    parts = [_header(j, view.source)]
    culprits = {int(r) for r in j.get("culprit_ranks") or [] if isinstance(r, int)}
    if view.heatmap is not None:
        parts.append("<h4>Where the time went: culprits vs peers</h4>" + phase_heatmap_chart(view.heatmap).html())
    w1 = [f for f in (w1_matrix_chart(e) for e in evidence if e.get("kind") == EvidenceKind.W1_MATRIX) if f][:2]
    if w1:
        parts.append("<h4>Kernel distances (W₁)</h4>" + "".join(f.html() for f in w1))
    if view.cdfs:
        parts.append("<h4>Kernel duration distributions: culprits vs peers</h4>"
                     + "".join(cdf_chart(k).html() for k in view.cdfs))
    pipes = [f for f in (pipeline_chart(e) for e in evidence if e.get("kind") == EvidenceKind.PIPELINE) if f][:2]
    if pipes:
        parts.append("<h4>Pipeline stages</h4>" + "".join(f.html() for f in pipes))
    paths = [f for f in (critical_path_chart(e, culprits) for e in evidence
                         if e.get("kind") == EvidenceKind.CRITICAL_PATH) if f]
    if paths:
        parts.append("<h4>Critical path</h4>" + paths[0].html())
    idle = [e for e in evidence if e.get("kind") == EvidenceKind.GPU_IDLE]
    if idle:
        parts.append(_gpu_idle(idle))
    parts += [_stacks(e) for e in evidence if e.get("kind") == EvidenceKind.STACKS][:3]
    parts += [_what_if(e) for e in evidence if e.get("kind") == EvidenceKind.WHAT_IF][:1]
    parts += [_log_lines(e) for e in evidence if e.get("kind") == EvidenceKind.LOG_LINES][:1]
    parts += [_collective_stacks(e) for e in evidence if e.get("kind") == EvidenceKind.STUCK_COLLECTIVE][:2]
    parts.append(_trace_files(view, file_href))
    parts.append(_evidence_table(evidence))
    return f'<section class="card incident" id="{esc(view.id)}">' + "".join(parts) + "</section>"


def render_report(data: ReportData, out_dir: Path | None = None) -> str:
    """The whole report as one HTML string; evidence links are relative to ``out_dir``
    (where the report is written), so they open from the same machine."""
    base = Path(out_dir or Path.cwd()).resolve()

    def file_href(f: EvidenceFile) -> str:
        rel = os.path.relpath(Path(data.attempt_path).resolve() / f.rel_path, base)
        return quote(rel.replace(os.sep, "/"))

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data.generated_ns / 1e9 if data.generated_ns else None))
    body = (f'<header class="top"><b>Argus</b> report · <span class="mono">{esc(data.run_id)}</span> attempt '
            f'<span class="mono">{esc(data.attempt_id)}</span></header><main>'
            f"{verdict_banner(data)}<h1>{esc(data.run_id)} / {esc(data.attempt_id)}</h1>{summary_section(data)}"
            f"<h2>Step time</h2>{step_section(data)}"
            f"<h2>Incidents</h2>{incidents_table(data, lambda v: '#' + v.id)}"
            + "".join(incident_section(v, file_href) for v in data.incidents) + job_log_section(data.job_log)
            + nodes_section(data)
            + f'<p class="muted">Generated {esc(when)} by argus {esc(__version__)}. Heatmaps show culprits, at most '
              "32 evenly sampled peers and peer quantiles; step time is the median rank's.</p></main>")
    return document(f"Argus report · {data.run_id}/{data.attempt_id}", body)
