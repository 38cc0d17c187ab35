"""What the web UI knows about the store, kept current without a restart.

Each request recomputes the attempt's fingerprint (a directory listing: files, newest
mtime). When the data changed since the last diagnosis, one background thread per attempt
diagnoses again while requests keep getting the previous result, marked stale; callers
may ``wait`` for the fresh one. Stored incidents are re-read when only the ``incidents``
files changed — no diagnosis needed for that.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argus.analysis.diagnosis import Diagnosis
from argus.report import Fingerprint, Gatherer, IncidentView, ReportData, fingerprint, incidents_of
from argus.store import Attempt, Store

__all__ = ["StoreState", "AttemptState", "Snapshot", "reached_without_links"]


def reached_without_links(root: Path, path: Path) -> bool:
    """True if ``path`` lies below ``root`` and no directory or file from ``root`` down to it
    is a symbolic link: the UI shows and serves only what is in the store itself, never what
    a link (planted by another user, or left by a copy) points to elsewhere."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    except ValueError:
        return False
    here = Path(os.path.abspath(root))
    try:
        for part in rel.parts:
            if part in ("", ".", ".."):
                return False
            here = here / part
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return False
        return here.resolve(strict=True).is_relative_to(Path(root).resolve(strict=True))
    except OSError:
        return False


@dataclass(slots=True)
class Snapshot:
    """One consistent view of an attempt: the run summary and its incidents."""

    data: ReportData | None
    state: str  # "ready" | "diagnosing" | "error"
    fresh: bool  # diagnosed data is the data in the store now
    version: str
    error: str = ""
    diagnosed_at_ns: int = 0

    def status_json(self) -> dict[str, Any]:
        return {"state": self.state, "fresh": self.fresh, "error": self.error or None,
                "seconds": self.data.diagnosis_s if self.data else None, "diagnosed_at_ns": self.diagnosed_at_ns}


@dataclass(slots=True)
class _Result:
    data_fp: tuple[int, int, int]
    diagnosis: Diagnosis | None
    error: str = ""
    at_ns: int = field(default_factory=time.time_ns)


class AttemptState:
    """The live state of one attempt; thread-safe."""

    def __init__(self, path: Path):
        self.path = path
        self._cond = threading.Condition()  # guards the diagnosis result and the running flag
        self._glock = threading.RLock()  # guards the gatherer and the cached views
        self._result: _Result | None = None
        self._running: tuple[int, int, int] | None = None  # data fingerprint being diagnosed
        self._gatherer: tuple[tuple[int, int, int], Gatherer] | None = None
        self._summary: tuple[tuple, ReportData | None] | None = None
        self._views: dict[tuple, IncidentView] = {}

    # -- diagnosis in the background -------------------------------------------------------
    def _start(self, fp: tuple[int, int, int]) -> None:
        self._running = fp
        threading.Thread(target=self._diagnose, args=(fp,), name=f"argus-diagnose-{self.path.name}",
                         daemon=True).start()

    def _diagnose(self, fp: tuple[int, int, int]) -> None:
        try:
            from argus.analysis import DiagnoseConfig, diagnose

            attempt = Attempt.open(self.path)
            result = _Result(fp, diagnose(attempt, DiagnoseConfig(store_incidents=False)))
        except Exception as exc:  # noqa: BLE001 - a store mid-write, an analysis bug: report it, keep serving
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            result = _Result(fp, None, detail)
        with self._cond:
            self._result = result
            self._running = None
            self._cond.notify_all()

    def snapshot(self, wait_s: float = 0.0) -> Snapshot:
        """The newest view; with ``wait_s``, block up to that long for a diagnosis of the
        store's current data."""
        deadline = time.monotonic() + max(wait_s, 0.0)
        with self._cond:
            while True:
                fp = fingerprint(self.path)
                res = self._result
                current = res is not None and res.data_fp == fp.data
                if not current and self._running != fp.data and self._running is None:
                    self._start(fp.data)
                left = deadline - time.monotonic()
                if current or left <= 0:
                    break
                self._cond.wait(min(left, 0.5))  # re-list: the data may change again meanwhile
        with self._glock:
            return self._build(fp, res, current)

    def _build(self, fp: Fingerprint, res: _Result | None, current: bool) -> Snapshot:
        state = "diagnosing" if not current else ("error" if res and res.error else "ready")
        version = hashlib.sha1(repr((fp, res.data_fp if res else None, state)).encode()).hexdigest()[:16]
        if res is None:
            return Snapshot(self._summary_of(fp, None), state, False, version)
        key = (fp.data, fp.incidents, res.data_fp, id(res))
        data = self._summary[1] if self._summary and self._summary[0] == key else None
        if data is None:
            data = self._summary_of(fp, res)
            self._summary = (key, data)
        return Snapshot(data, state, current, version, res.error, res.at_ns)

    def _summary_of(self, fp: Fingerprint, res: _Result | None) -> ReportData | None:
        try:
            g = self.gatherer(fp)
            diagnosis = res.diagnosis if res else None
            return g.report(diagnosis, incidents_of(g.attempt, diagnosis), details=False)
        except Exception:  # noqa: BLE001 - an unreadable store is shown as such, the UI keeps serving
            return None  # an attempt directory still being created

    def gatherer(self, fp: Fingerprint | None = None) -> Gatherer:
        """A gatherer over the files present now (a new one when the data changed)."""
        fp = fp or fingerprint(self.path)
        with self._glock:
            cached = self._gatherer
            if cached is None or cached[0] != fp.data:
                cached = (fp.data, Gatherer(Attempt.open(self.path)))
                self._gatherer = cached
                self._views.clear()
            return cached[1]

    def incident(self, snap: Snapshot, incident_id: str) -> IncidentView | None:
        """The incident's plots, gathered on first view and cached for this snapshot."""
        if snap.data is None:
            return None
        found = [v for v in snap.data.incidents if v.id == incident_id]
        if not found:
            return None
        key = (snap.version, incident_id)
        with self._glock:
            if key not in self._views:
                g = self.gatherer()
                g.evidence(refresh=True)  # evidence files come and go (retention) without new data
                self._views[key] = g.incident(found[0].incident, found[0].source)
            return self._views[key]


class StoreState:
    """All attempts of one store, discovered again on every call (new runs appear live)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.store = Store.open(self.root)  # fails early, with the store's own message
        self._lock = threading.Lock()
        self._attempts: dict[Path, AttemptState] = {}

    def attempts(self) -> list[Attempt]:
        """The store's attempts, less any reached through a symbolic link."""
        try:
            found = self.store.attempts()
        except Exception:  # noqa: BLE001 - an attempt directory half-created by a writer right now
            return []
        return [a for a in found if reached_without_links(self.root, a.path)]

    def find(self, run_id: str, attempt_id: str) -> Attempt | None:
        """The attempt with this identity — looked up, never built from the URL as a path."""
        for a in self.attempts():
            if a.identity.run_id == run_id and a.identity.attempt_id == attempt_id:
                return a
        return None

    def state(self, attempt: Attempt) -> AttemptState:
        with self._lock:
            st = self._attempts.get(attempt.path)
            if st is None:
                st = self._attempts[attempt.path] = AttemptState(attempt.path)
            return st

    def runs_version(self) -> str:
        items = [(a.identity.run_id, a.identity.attempt_id, a.meta.get("created_ns")) for a in self.attempts()]
        return hashlib.sha1(repr(items).encode()).hexdigest()[:16]
