"""What the store holds right now, read cheaply: a change fingerprint, stored incidents that
are still current, and the Perfetto evidence files.

The store is append-only (a new window is a new file, nothing is rewritten), so the number
of files and the newest modification time say whether anything changed: one ``scandir``
pass, no Parquet is opened. The web UI keys its caches on this.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from argus.analysis.incident import Incident
from argus.report.model import EvidenceFile
from argus.store import TABLES, Attempt

__all__ = ["Fingerprint", "fingerprint", "stored_incidents", "evidence_files", "EVIDENCE_DIR"]

EVIDENCE_DIR = "evidence"
_EVIDENCE_NAME = re.compile(r"^(\d+)-[0-9A-Za-z]+\.pftrace$")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """(files, newest mtime in ns, bytes) of the data tables, of ``incidents`` and of evidence."""

    data: tuple[int, int, int]
    incidents: tuple[int, int, int]
    evidence: tuple[int, int, int]

    @property
    def data_mtime_ns(self) -> int:
        return self.data[1]


def _scan(root: Path, depth: int) -> tuple[int, int, int]:
    """Files (not hidden, not links) ``depth`` levels below ``root``."""
    n = newest = size = 0
    stack = [(str(root), 0)]
    while stack:
        path, level = stack.pop()
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            if e.name.startswith("."):
                continue  # temp files of in-flight writes
            if level + 1 < depth:
                if e.is_dir(follow_symlinks=False):
                    stack.append((e.path, level + 1))
            elif e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                n += 1
                newest = max(newest, st.st_mtime_ns)
                size += st.st_size
    return n, newest, size


def fingerprint(attempt_path: Path) -> Fingerprint:
    """Cost: one directory listing per table writer (≈ 1 ms per thousand files)."""
    data = [0, 0, 0]
    for table in TABLES:
        if table == "incidents":
            continue
        n, newest, size = _scan(attempt_path / table, 2)
        data = [data[0] + n, max(data[1], newest), data[2] + size]
    meta = attempt_path / "attempt.json"
    if meta.exists():
        data[1] = max(data[1], meta.stat().st_mtime_ns)
    return Fingerprint(tuple(data), _scan(attempt_path / "incidents", 2),  # type: ignore[arg-type]
                       _scan(attempt_path / EVIDENCE_DIR, 2))


def stored_incidents(attempt: Attempt, newer_than_ns: int) -> list[dict[str, Any]]:
    """Incidents from the store's ``incidents`` files written after the newest data file.

    An incidents file older than the data describes data that has since grown, so it is
    skipped: what is shown is always a diagnosis of what is in the store now. Rows are
    turned back into the incident JSON (same id → the most recently detected one wins)."""
    files = [f for f in attempt.files("incidents") if f.stat().st_mtime_ns >= newer_than_ns]
    if not files:
        return []
    import pyarrow.dataset as ds

    rows = ds.dataset([str(f) for f in files], schema=TABLES["incidents"].schema, format="parquet").to_table()
    by_id: dict[str, dict[str, Any]] = {}
    for r in sorted(rows.to_pylist(), key=lambda r: r.get("detected_ns") or 0):
        by_id[str(r["id"])] = Incident.json_from_row(r)
    return list(by_id.values())


def window_steps(attempt: Attempt) -> dict[int, tuple[int, int]]:
    """Window index → (first, last) step, from the kernel summaries the processor wrote."""
    t = attempt.sql('SELECT DISTINCT "window" AS w, min(start_step) AS a, max(end_step) AS b '
                    'FROM kernel_summaries GROUP BY "window"')
    return {int(w): (int(a), int(b)) for w, a, b in zip(*(t.column(c).to_pylist() for c in ("w", "a", "b")))}


def evidence_files(attempt: Attempt, windows: dict[int, tuple[int, int]] | None = None) -> list[EvidenceFile]:
    """Every ``evidence/<host>/<window>-<nonce>.pftrace`` of the attempt (links are ignored:
    the web UI serves these files and must never follow a link out of the store)."""
    root = attempt.path / EVIDENCE_DIR
    if not root.is_dir():
        return []
    windows = window_steps(attempt) if windows is None else windows
    out = []
    for host_dir in sorted(os.scandir(root), key=lambda e: e.name):
        if host_dir.name.startswith(".") or not host_dir.is_dir(follow_symlinks=False):
            continue
        for e in sorted(os.scandir(host_dir.path), key=lambda e: e.name):
            m = _EVIDENCE_NAME.match(e.name)
            if not m or not e.is_file(follow_symlinks=False):
                continue
            w = int(m.group(1))
            out.append(EvidenceFile(host_dir.name, e.name, e.stat(follow_symlinks=False).st_size, w, windows.get(w)))
    return out
