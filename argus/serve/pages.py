"""The web UI's HTML pages, built from the report's sections and charts.

Each page is a live fragment inside ``<div id="live">``: a few lines of inline script poll
the page's JSON endpoint and, when its ``version`` changes, fetch the fragment again
(``?fragment=1``) and swap it in. The server renders (and escapes) all HTML; the script
never builds markup from data.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from argus.report import EvidenceFile, IncidentView
from argus.report.page import (document, incident_section, incidents_table, nodes_section, step_section,
                               summary_section, verdict_banner)
from argus.report.svg import esc
from argus.serve.state import Snapshot
from argus.store import Attempt

__all__ = ["runs_page", "run_page", "incident_page", "message_page", "page_csp", "run_url", "incident_url",
           "evidence_url", "api_url"]


def _q(s: str) -> str:
    return quote(str(s), safe="")


def run_url(run_id: str, attempt_id: str) -> str:
    return f"/run/{_q(run_id)}/{_q(attempt_id)}"


def api_url(run_id: str, attempt_id: str, tail: str = "") -> str:
    return f"/api/run/{_q(run_id)}/{_q(attempt_id)}{tail}"


def incident_url(run_id: str, attempt_id: str, incident_id: str) -> str:
    return f"{run_url(run_id, attempt_id)}/incident/{_q(incident_id)}"


def evidence_url(run_id: str, attempt_id: str, f: EvidenceFile) -> str:
    return f"/evidence/{_q(run_id)}/{_q(attempt_id)}/{_q(f.host)}/{_q(f.name)}"


def page_csp(nonce: str) -> str:
    """Only our own inline script (by nonce) runs; fetches go to this server only. (The
    server adds ``frame-ancestors`` in the header: browsers ignore it in a meta tag.)"""
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'")


_LIVE_JS = """
(function () {
  var root = document.getElementById('live'), status = document.getElementById('live-status');
  var version = root.getAttribute('data-version'), api = root.getAttribute('data-api');
  var every = parseFloat(root.getAttribute('data-poll')) * 1000;
  function tick() {
    fetch(api, {credentials: 'same-origin', cache: 'no-store'}).then(function (r) {
      if (!r.ok) { throw new Error('HTTP ' + r.status); }
      return r.json();
    }).then(function (j) {
      status.textContent = 'live · checked ' + new Date().toLocaleTimeString() +
        (j.diagnosis && j.diagnosis.state === 'diagnosing' ? ' · diagnosing new data…' : '');
      if (j.version === version) { return null; }
      version = j.version;
      var sep = location.search ? '&' : '?';
      return fetch(location.pathname + location.search + sep + 'fragment=1',
                   {credentials: 'same-origin', cache: 'no-store'}).then(function (f) {
        return f.ok ? f.text().then(function (t) { root.innerHTML = t; }) : null;
      });
    }).catch(function () {
      status.textContent = 'server unreachable · retrying';
    }).then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
"""


def _shell(title: str, crumbs: list[tuple[str, str]], fragment: str, api: str, version: str, poll_s: float,
           nonce: str) -> str:
    nav = " / ".join(f'<a href="{esc(href)}">{esc(label)}</a>' if href else esc(label) for label, href in crumbs)
    body = (f'<header class="top"><b>Argus</b> · {nav} <span id="live-status" class="muted" '
            f'style="float:right;color:#cfd8e3">live</span></header><main><div id="live" data-api="{esc(api)}" '
            f'data-version="{esc(version)}" data-poll="{poll_s:g}">{fragment}</div></main>'
            f'<script nonce="{esc(nonce)}">{_LIVE_JS}</script>')
    return document(title, body, csp=page_csp(nonce))


def message_page(title: str, message: str, nonce: str) -> str:
    body = (f'<header class="top"><b>Argus</b> · <a href="/">runs</a></header><main><h1>{esc(title)}</h1>'
            f"<p>{esc(message)}</p></main>")
    return document(title, body, csp=page_csp(nonce))


# -- runs ------------------------------------------------------------------------------------
def runs_fragment(attempts: list[Attempt], store: str) -> str:
    if not attempts:
        return f'<h1>Runs</h1><p class="muted">No run in {esc(store)} yet; this page updates when one appears.</p>'
    rows = []
    for i, a in enumerate(reversed(attempts)):  # newest first
        m = a.meta
        counts = _severity_counts(a) if i < MAX_COUNTED_RUNS else None
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.get("created_ns", 0) / 1e9))
        href = run_url(a.identity.run_id, a.identity.attempt_id)
        rows.append(f'<tr class="run-row"><td class="mono"><a href="{esc(href)}">'
                    f"{esc(a.identity.run_id)}</a></td><td class=\"mono\">{esc(a.identity.attempt_id)}</td>"
                    f"<td>{esc(created)}</td><td>{esc(m.get('source', ''))}</td><td>{esc(m.get('scenario') or '')}</td>"
                    f"<td class=\"mono\">{esc(a.layout)}</td><td>{a.layout.world_size:,}</td>"
                    f"<td class=\"run-incidents\">{_counts_html(counts)}</td></tr>")
    return (f"<h1>Runs</h1><p class=\"muted\">Store {esc(store)}</p><table class=\"runs\"><tr><th>run</th>"
            "<th>attempt</th><th>created</th><th>source</th><th>scenario</th><th>layout</th><th>ranks</th>"
            "<th>incidents (last stored diagnosis)</th></tr>" + "".join(rows) + "</table>")


#: runs whose stored incidents are counted on the runs page (newest first); older ones show "…"
MAX_COUNTED_RUNS = 50


def _severity_counts(a: Attempt) -> dict[str, int] | None:
    """Incidents by severity as the attempt's last diagnosis stored them; None: never diagnosed."""
    try:
        if not a.files("incidents"):
            return None
        t = a.read("incidents", columns=["severity", "detected_ns"])
    except Exception:  # noqa: BLE001 - a damaged table: the run page says more
        return None
    sev, when = t.column("severity").to_pylist(), t.column("detected_ns").to_pylist()
    last = max(when, default=None)  # each diagnosis appends its incidents, stamped once
    out: dict[str, int] = {}
    for s, w in zip(sev, when):
        if w == last:
            out[str(s)] = out.get(str(s), 0) + 1
    return out


def _counts_html(counts: dict[str, int] | None) -> str:
    if counts is None:
        return '<span class="muted">not diagnosed</span>'
    shown = [f'<span class="sev sev-{esc(k)}">{esc(k)} {n}</span>' for k in ("critical", "warning", "info")
             if (n := counts.get(k))]
    return " ".join(shown) or '<span class="muted">none</span>'


def runs_page(attempts: list[Attempt], store: str, version: str, poll_s: float, nonce: str) -> str:
    return _shell("Argus · runs", [("runs", "")], runs_fragment(attempts, store), "/api/runs", version, poll_s, nonce)


# -- one run -----------------------------------------------------------------------------------
def _status(snap: Snapshot) -> str:
    if snap.state == "error":
        return f'<p class="culprit">Diagnosis failed: {esc(snap.error)}</p>'
    if snap.state == "diagnosing":
        what = "new data arrived; showing the previous diagnosis" if snap.data and snap.data.diagnosed else \
            "the first diagnosis is running"
        return f'<p class="muted diagnosing">Diagnosing… {esc(what)}. This page updates by itself.</p>'
    return ""


def run_fragment(snap: Snapshot, run_id: str, attempt_id: str) -> str:
    if snap.data is None:
        return f"<h1>{esc(run_id)} / {esc(attempt_id)}</h1>{_status(snap)}" \
               '<p class="muted">The attempt is being written; its data appears here shortly.</p>'
    d = snap.data
    return (f"{verdict_banner(d)}<h1>{esc(run_id)} / {esc(attempt_id)}</h1>{_status(snap)}{summary_section(d)}"
            f"<h2>Step time</h2>{step_section(d)}<h2>Incidents</h2>"
            + incidents_table(d, lambda v: incident_url(run_id, attempt_id, v.id)) + nodes_section(d)
            + f'<p class="muted">JSON: <a href="{esc(api_url(run_id, attempt_id))}">summary</a> · '
              f'<a href="{esc(api_url(run_id, attempt_id, "/incidents"))}">incidents</a></p>')


def run_page(snap: Snapshot, run_id: str, attempt_id: str, poll_s: float, nonce: str) -> str:
    return _shell(f"Argus · {run_id}/{attempt_id}", [("runs", "/"), (f"{run_id} / {attempt_id}", "")],
                  run_fragment(snap, run_id, attempt_id), api_url(run_id, attempt_id, "/status"), snap.version, poll_s,
                  nonce)


# -- one incident --------------------------------------------------------------------------------
def incident_fragment(snap: Snapshot, view: IncidentView | None, run_id: str, attempt_id: str,
                      incident_id: str) -> str:
    back = f'<p><a href="{esc(run_url(run_id, attempt_id))}">← {esc(run_id)} / {esc(attempt_id)}</a></p>'
    if view is None or snap.data is None:
        why = ("It appears here when the diagnosis finishes, if the diagnosis finds it." if snap.state == "diagnosing"
               else "It is not in the current diagnosis (the data may have changed since).")
        return back + _status(snap) + f'<p class="muted">Incident {esc(incident_id)}: {esc(why)}</p>'

    w = view.incident.get("window") or {}
    hl = (int(w["start_step"]), int(w["end_step"])) if isinstance(w.get("start_step"), int) and \
        isinstance(w.get("end_step"), int) else None
    return (back + _status(snap) + f"<h1>Incident {esc(incident_id)}</h1>"
            + incident_section(view, lambda f: evidence_url(run_id, attempt_id, f))
            + f"<h2>Step time</h2>{step_section(snap.data, hl)}")


def incident_page(snap: Snapshot, view: IncidentView | None, run_id: str, attempt_id: str, incident_id: str,
                  poll_s: float, nonce: str) -> str:
    return _shell(f"Argus · incident {incident_id}", [("runs", "/"), (f"{run_id} / {attempt_id}",
                                                                        run_url(run_id, attempt_id)),
                                                       (incident_id, "")],
                  incident_fragment(snap, view, run_id, attempt_id, incident_id),
                  api_url(run_id, attempt_id, "/status"), snap.version, poll_s, nonce)


def incident_json(view: IncidentView, run_id: str, attempt_id: str) -> dict[str, Any]:
    return {**view.incident, "source": view.source,
            "evidence_files": [{"host": f.host, "name": f.name, "bytes": f.bytes, "window": f.window,
                                "steps": list(f.steps) if f.steps else None,
                                "url": evidence_url(run_id, attempt_id, f)} for f in view.files]}
