"""Continuous analysis: diagnose a live store on a schedule, store new incidents, notify.

Each cycle looks at the latest attempt (a restarted job is a new attempt), and only when its
data changed since the last cycle runs L1–L3 over every window and L4/L5 on the incidents
(:func:`argus.analysis.diagnose`). An incident's id is stable (class, culprits, onset), so
one fault is one alert however many cycles see it: the ids already notified, with their
priority, are kept in ``alerts.json`` next to the attempt, which survives a restart of the
service. A priority that rises (P2 → P1) is notified again; Alertmanager alerts still in
progress are re-posted every cycle so they stay active, and resolve by themselves when the
fault ends. A sink that fails is retried next cycle; nothing is marked sent until accepted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from argus.alerting.priority import PRIORITIES, priority
from argus.alerting.sinks import Alert, NotifyError
from argus.analysis.incident import IncidentClass
from argus.store import Attempt, Store
from argus.store.files import write_bytes_atomic

__all__ = ["Cycle", "AnalysisService"]

log = logging.getLogger("argus.alerting")
STATE_FILE = "alerts.json"


@dataclass
class Cycle:
    attempt: str
    analysed: bool  # False: nothing changed since the previous cycle
    incidents: int = 0
    new_incidents: list[str] = field(default_factory=list)  # stored this cycle
    sent: list[tuple[str, str, str]] = field(default_factory=list)  # (sink, incident id, priority)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


class AnalysisService:
    """``cycle()`` once, or ``run(interval_s, stop)`` until ``stop`` is set."""

    def __init__(self, store: str | Path, sinks: list[Any], run_id: str | None = None, attempt_id: str | None = None,
                 active_steps: int = 10):
        self.store_path = str(store)
        self.sinks = sinks
        self.run_id, self.attempt_id = run_id, attempt_id
        self.active_steps = active_steps  # an incident ending this close to the last step is still on
        self._signature: dict[str, tuple] = {}
        self._active: dict[str, list[Alert]] = {}

    # -- one cycle ---------------------------------------------------------------------
    def cycle(self) -> Cycle:
        t0 = time.perf_counter()
        attempt = Store.open(self.store_path).attempt(self.run_id, self.attempt_id)
        key = str(attempt.path)
        out = Cycle(f"{attempt.identity.run_id}/{attempt.identity.attempt_id}", analysed=False)
        sig = self._data_signature(attempt)
        if sig != self._signature.get(key):
            self._analyse(attempt, out)
            if not out.errors:  # a sink that failed is retried next cycle, changed data or not
                self._signature[key] = sig
        else:  # nothing new: keep Alertmanager's alerts alive
            for alert in self._active.get(key, []):
                for sink in self.sinks:
                    try:
                        sink.refresh(alert)
                    except NotifyError as exc:
                        out.errors.append(str(exc))
        out.seconds = time.perf_counter() - t0
        return out

    def run(self, interval_s: float, stop: threading.Event | None = None,
            on_cycle: Callable[[Cycle], None] | None = None) -> None:
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                c = self.cycle()
                if on_cycle is not None:
                    on_cycle(c)
            except Exception as exc:  # noqa: BLE001 - a bad cycle (store mid-write, server down) must not end the service
                log.warning("analysis cycle failed: %s", exc)
            stop.wait(interval_s)

    # -- internals ---------------------------------------------------------------------
    @staticmethod
    def _data_signature(attempt: Attempt) -> tuple:
        files = [p for t in ("steps", "phases", "kernel_summaries", "stacks", "hw", "hangs") for p in attempt.files(t)]
        return len(files), max((p.stat().st_mtime_ns for p in files), default=0)

    def _analyse(self, attempt: Attempt, out: Cycle) -> None:
        from argus.analysis import DiagnoseConfig, diagnose
        from argus.analysis.incident import incidents_table

        d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
        doc = d.to_json()
        out.analysed = True
        out.incidents = len(d.incidents)
        stored = self._stored_ids(attempt)
        new = [i for i in d.incidents if i.id not in stored]
        if new:
            attempt.writer("analyze").write("incidents", incidents_table(new), window=len(attempt.files("incidents")))
            out.new_incidents = [i.id for i in new]
        state = self._load_state(attempt)
        last_step = max(doc.get("steps") or [0])
        active: list[Alert] = []
        for inc in doc["incidents"]:
            p = priority(inc)
            if p is None:
                continue
            alert = Alert(p, doc["run_id"], doc["attempt_id"], inc, self.store_path)
            stopped = inc["class"] in (IncidentClass.HANG, IncidentClass.FAIL_STOP)
            if inc["window"]["end_step"] >= last_step - self.active_steps or stopped:
                active.append(alert)
            known = state.get(inc["id"], {})
            for sink in self.sinks:
                sent = known.get(sink.name)
                if sent is not None and PRIORITIES.index(sent) <= PRIORITIES.index(p):
                    continue  # already told this sink at this priority or higher
                try:
                    sink.send(alert)
                except NotifyError as exc:
                    out.errors.append(str(exc))
                    continue
                known[sink.name] = p
                out.sent.append((sink.name, inc["id"], p))
            state[inc["id"]] = known
        self._save_state(attempt, state)
        self._active[str(attempt.path)] = active

    @staticmethod
    def _stored_ids(attempt: Attempt) -> set[str]:
        if not attempt.files("incidents"):
            return set()
        return {str(x) for x in attempt.read("incidents", columns=["id"]).column("id").to_pylist()}

    @staticmethod
    def _load_state(attempt: Attempt) -> dict[str, dict[str, str]]:
        path = attempt.path / STATE_FILE
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("%s unreadable (%s): starting a new alert state", path, exc)
            return {}

    @staticmethod
    def _save_state(attempt: Attempt, state: dict) -> None:
        write_bytes_atomic(attempt.path / STATE_FILE, json.dumps(state, indent=1, sort_keys=True).encode())
