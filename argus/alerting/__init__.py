"""Continuous analysis and alerts: diagnosis on a schedule over a live store, new incidents
stored and notified (JSON webhook, Prometheus Alertmanager) with priorities P0–P2, one
alert per fault."""

from argus.alerting.priority import PRIORITIES, priority
from argus.alerting.service import AnalysisService, Cycle
from argus.alerting.sinks import Alert, AlertmanagerSink, NotifyError, WebhookSink

__all__ = ["PRIORITIES", "Alert", "AlertmanagerSink", "AnalysisService", "Cycle", "NotifyError", "WebhookSink",
           "priority"]
