"""Grafana dashboard (provisioning-ready JSON) and Prometheus alerting rules from
:mod:`argus.dashboards.queries`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from argus.dashboards.queries import PANELS, RULES, Panel, Rule

__all__ = ["dashboard", "alert_rules_yaml", "provisioning", "write_all", "DASHBOARD_UID"]

DASHBOARD_UID = "argus-training"
_DS = {"type": "prometheus", "uid": "${datasource}"}


def _panel(i: int, p: Panel) -> dict[str, Any]:
    w, h = (24, 9) if p.kind in ("heatmap",) or i == 0 else (12, 8)
    targets: list[dict[str, Any]] = [
        {"refId": chr(65 + j), "datasource": _DS, "expr": expr, "legendFormat": legend}
        for j, (legend, expr) in enumerate(p.exprs)]
    panel: dict[str, Any] = {"id": i + 1, "title": p.title, "type": p.kind, "datasource": _DS,
                             "description": p.description, "targets": targets,
                             "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                             "gridPos": {"h": h, "w": w, "x": 0, "y": 0}}
    if p.kind == "heatmap":
        panel["options"] = {"calculate": False, "yAxis": {"axisLabel": "rank"}, "color": {"scheme": "Oranges"}}
    if p.kind == "bargauge":
        panel["options"] = {"orientation": "horizontal", "displayMode": "gradient"}
        for t in targets:
            t["instant"] = True
    return panel


def _layout(panels: list[dict[str, Any]]) -> None:
    x = y = row_h = 0
    for p in panels:
        g = p["gridPos"]
        if x + g["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        g["x"], g["y"] = x, y
        x += g["w"]
        row_h = max(row_h, g["h"])


def _var(name: str, query: str, multi: bool = False) -> dict[str, Any]:
    return {"name": name, "type": "query", "datasource": _DS, "query": {"query": query, "refId": name},
            "definition": query, "refresh": 2, "includeAll": multi, "multi": multi,
            "allValue": ".*" if multi else None, "current": {}}


def dashboard() -> dict[str, Any]:
    panels = [_panel(i, p) for i, p in enumerate(PANELS)]
    _layout(panels)
    return {
        "uid": DASHBOARD_UID, "title": "Argus — training job health", "schemaVersion": 38, "version": 1,
        "tags": ["argus", "training"], "time": {"from": "now-3h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "current": {}},
            _var("job", "label_values(argus_step, job)"),
            _var("run", 'label_values(argus_step{job="$job"}, run)', multi=True),
            _var("phase", 'label_values(argus_phase_seconds{job="$job", category="compute"}, phase)', multi=True),
        ]},
        "annotations": {"list": [{
            "name": "Argus alerts", "datasource": _DS, "enable": True, "iconColor": "red",
            "expr": 'ALERTS{alertname=~"Argus.*", alertstate="firing", job="$job"}',
            "titleFormat": "{{alertname}} ({{priority}})", "textFormat": "{{run}}", "step": "60s"}]},
        "panels": panels,
    }


def alert_rules_yaml(rules: tuple[Rule, ...] = RULES, interval: str = "30s") -> str:
    """The rules as a Prometheus rule file (YAML, written by hand: no YAML library needed)."""
    lines = ["groups:", "- name: argus", f"  interval: {interval}", "  rules:"]
    for r in rules:
        lines += [f"  - alert: {r.name}", f"    expr: {json.dumps(r.expr)}", f"    for: {r.for_}",
                  "    labels:", f"      priority: {r.priority}",
                  f"      severity: {'page' if r.priority == 'P0' else 'ticket' if r.priority == 'P1' else 'info'}",
                  "    annotations:", f"      summary: {json.dumps(r.summary)}"]
    return "\n".join(lines) + "\n"


def provisioning(dashboards_dir: str, prometheus_url: str) -> dict[str, str]:
    """Grafana provisioning files: the Prometheus datasource and the dashboard provider."""
    ds = (f"apiVersion: 1\ndatasources:\n- name: Prometheus\n  uid: prometheus\n  type: prometheus\n"
          f"  access: proxy\n  url: {prometheus_url}\n  isDefault: true\n")
    prov = (f"apiVersion: 1\nproviders:\n- name: argus\n  folder: Argus\n  type: file\n  options:\n"
            f"    path: {dashboards_dir}\n")
    return {"datasources/argus.yaml": ds, "dashboards/argus.yaml": prov}


def write_all(out: str | Path, prometheus_url: str = "http://127.0.0.1:9090",
              dashboards_dir: str = "/var/lib/grafana/dashboards/argus") -> list[Path]:
    out = Path(out)
    files = {"grafana/dashboards/argus-training.json": json.dumps(dashboard(), indent=2),
             "prometheus/argus-alerts.yml": alert_rules_yaml(),
             **{f"grafana/provisioning/{k}": v for k, v in provisioning(dashboards_dir, prometheus_url).items()}}
    written = []
    for rel, text in files.items():
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        written.append(p)
    return written
