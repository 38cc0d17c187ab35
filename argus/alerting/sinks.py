"""Where alerts go: a JSON webhook, and Prometheus Alertmanager's v2 API.

Both are plain HTTP POSTs with a timeout; a sink that fails raises ``NotifyError`` and the
service retries it on its next cycle (nothing is marked sent until a sink accepted it).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from argus.errors import ArgusError

__all__ = ["Alert", "NotifyError", "WebhookSink", "AlertmanagerSink", "post_json"]


class NotifyError(ArgusError):
    """A notification endpoint did not accept an alert."""


@dataclass(frozen=True)
class Alert:
    priority: str  # P0 | P1 | P2
    run_id: str
    attempt_id: str
    incident: dict[str, Any]  # the incident as in the incidents document
    store: str

    @property
    def key(self) -> str:
        return f"{self.run_id}/{self.attempt_id}/{self.incident['id']}"

    def to_json(self) -> dict[str, Any]:
        inc = self.incident
        return {"source": "argus", "priority": self.priority, "run_id": self.run_id, "attempt_id": self.attempt_id,
                "store": self.store, "incident_id": inc["id"], "class": inc["class"], "state": inc["state"],
                "severity": inc["severity"], "culprit_ranks": inc["culprit_ranks"][:64], "hosts": inc["hosts"][:16],
                "window": inc["window"], "phase": inc["phase"], "impact": inc["impact"], "action": inc["action"],
                "remedy": inc.get("remedy", ""), "decision": inc.get("decision"), "summary": inc.get("summary", "")}


def post_json(url: str, payload: Any, timeout_s: float = 5.0) -> int:
    body = json.dumps(payload, default=str).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # (operator-given URL)
            return resp.status
    except (urllib.error.URLError, OSError) as exc:
        raise NotifyError(f"{url}: {exc}") from exc


class WebhookSink:
    """One JSON document per new alert (or per priority change)."""

    name = "webhook"

    def __init__(self, url: str, timeout_s: float = 5.0):
        self.url, self.timeout_s = url, timeout_s

    def send(self, alert: Alert) -> None:
        status = post_json(self.url, alert.to_json(), self.timeout_s)
        if status >= 300:
            raise NotifyError(f"{self.url}: HTTP {status}")

    def refresh(self, alert: Alert) -> None:
        """Webhooks get one message per alert: nothing to refresh."""


class AlertmanagerSink:
    """Alerts posted to ``<url>/api/v2/alerts``. Alertmanager groups and de-duplicates by
    label set; an alert stays active until its ``endsAt``, so active alerts are re-posted
    (``refresh``) like Prometheus does, and resolve by themselves when they stop."""

    name = "alertmanager"

    def __init__(self, url: str, timeout_s: float = 5.0, hold_s: float = 900.0):
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout_s, self.hold_s = timeout_s, hold_s

    def _payload(self, alert: Alert) -> list[dict[str, Any]]:
        inc = alert.incident
        now = time.time()

        def iso(t: float) -> str:
            return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")

        labels = {"alertname": "ArgusIncident", "priority": alert.priority, "class": inc["class"],
                  "run": alert.run_id, "attempt": alert.attempt_id, "incident": inc["id"],
                  "hosts": ",".join(inc["hosts"][:8])}
        annotations = {"summary": inc.get("summary", "")[:1000], "action": inc["action"],
                       "culprit_ranks": ",".join(map(str, inc["culprit_ranks"][:64])),
                       "slowdown_pct": str((inc.get("impact") or {}).get("slowdown_pct")),
                       "gpu_hours_lost": str((inc.get("impact") or {}).get("gpu_hours_lost")),
                       "remedy": inc.get("remedy", "")[:1000],
                       "loss_gpuh_per_h": str((inc.get("decision") or {}).get("loss_gpuh_per_h")),
                       "action_cost_gpuh": str((inc.get("decision") or {}).get("action_cost_gpuh")),
                       "target_hosts": ",".join(((inc.get("decision") or {}).get("target") or {}).get("hosts", [])[:8]),
                       "store": alert.store}
        return [{"labels": labels, "annotations": annotations, "startsAt": iso(now),
                 "endsAt": iso(now + self.hold_s)}]

    def send(self, alert: Alert) -> None:
        status = post_json(self.url, self._payload(alert), self.timeout_s)
        if status >= 300:
            raise NotifyError(f"{self.url}: HTTP {status}")

    refresh = send
