"""Grafana dashboards and Prometheus alerting rules for the TSDB data plane (``argus.tsdb``),
generated from one table of PromQL that a test runs against a real Prometheus."""

from argus.dashboards.grafana import alert_rules_yaml, dashboard, provisioning, write_all
from argus.dashboards.queries import PANELS, RULES, Rule, substitute, watcher_rules

__all__ = ["PANELS", "RULES", "Rule", "alert_rules_yaml", "dashboard", "provisioning", "substitute", "watcher_rules",
           "write_all"]
