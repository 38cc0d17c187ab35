"""``argus dashboards --out DIR``: Grafana dashboard + provisioning and Prometheus alert rules."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboards", help="write the Grafana dashboard and Prometheus alert rules",
                       description="Write a provisioning-ready Grafana dashboard (job step time with Argus alert "
                                   "annotations, rank heatmaps, per-group communication quantiles, hardware "
                                   "health) and a Prometheus alerting-rule file (P0–P2) for the series the "
                                   "processor's --remote-write sends.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--prometheus-url", default="http://127.0.0.1:9090", help="datasource URL for provisioning")
    p.add_argument("--dashboards-dir", default="/var/lib/grafana/dashboards/argus",
                   help="where Grafana will find the dashboard JSON (provider path)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from argus.dashboards import write_all

    for path in write_all(args.out, args.prometheus_url, args.dashboards_dir):
        print(path)
    return 0
