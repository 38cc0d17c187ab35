"""Health reports kept in a store, beside the runs: ``<store>/health/<host>/<started>.json``.

Each is the document ``argus healthcheck --json`` prints (the measurements, their verdicts, the
versions they ran on). Kept per host and time, so ``argus verify`` finds the newest one that
measured an incident's suspects, and a node's history of checks — a failure, then the check that
re-admitted it — stays with the jobs it served.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Callable, Iterator

from argus.store.files import read_regular_bytes, write_bytes_atomic

__all__ = ["HEALTH_DIR", "save_health", "stored_health", "covering"]

HEALTH_DIR = "health"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
log = logging.getLogger("argus.healthcheck")


def save_health(store_root: Path, doc: dict) -> Path:
    """Keep one health document in the store (its host and start time name the file)."""
    host = _SAFE.sub("_", str(doc.get("host") or "unknown"))[:120] or "unknown"
    started_ns = int(float(doc.get("started_s", 0.0)) * 1e9)
    path = Path(store_root) / HEALTH_DIR / host / f"{started_ns:020d}.json"
    write_bytes_atomic(path, json.dumps(doc, indent=1).encode())
    return path


def stored_health(store_root: Path) -> Iterator[tuple[Path, dict]]:
    """The store's health documents, newest first; an unreadable one is skipped (logged)."""
    root = Path(store_root) / HEALTH_DIR
    if not root.is_dir():
        return
    files = sorted(root.glob("*/*.json"), key=lambda p: p.name, reverse=True)
    for f in files:
        try:
            doc = json.loads(read_regular_bytes(f, max_bytes=64 << 20))
        except Exception as exc:  # noqa: BLE001 - one bad file costs only itself
            log.warning("skipping %s: %s", f, exc)
            continue
        if isinstance(doc, dict) and isinstance(doc.get("verdicts"), list):
            yield f, doc


def covering(store_root: Path, measured: Callable[[dict], bool]) -> tuple[Path, dict] | None:
    """The newest stored health document for which ``measured(doc)`` holds (``verify.measures``:
    it measured one of an incident's suspects with a figure that answers the incident)."""
    for f, doc in stored_health(store_root):
        if measured(doc):
            return f, doc
    return None
