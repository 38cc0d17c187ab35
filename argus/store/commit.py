"""Window commits: the files of one window become visible together, or not at all.

A window of one writer is several files (steps, phases, kernel summaries, sketches …), each
renamed into place on its own. Written alone, a crash between two renames would leave a
half window that readers take for a whole one (steps without their phases). So the files of
a window share one *unit id* in their names, and a **commit record** written after the last
of them makes the unit visible::

    <table>/<writer>/<window>-u<hex8>.parquet     data files of the unit
    commits/<writer>/<window>-u<hex8>.json        commit record, written last (temp + rename)

Readers show a ``u…`` file only when its commit record exists. Files whose nonce does not
start with ``u`` are single-file units (every file written before commits existed, and the
one-off writes of topology, drops, hangs and incidents): visible once renamed into place.

Leftovers — hidden temp files of a killed write and unit files whose commit never came —
are removed by the writer that owns the partition when it starts, and only once older
than :data:`STALE_LEFTOVER_S`, so a second live process using the same writer id (two
``argus diagnose`` runs; a restarted processor while its predecessor still flushes) never
loses a file it is writing. Other writers' partitions are never touched.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import pyarrow as pa

from argus.errors import StoreError
from argus.store.phase_totals import TWIN_OF, phase_totals_of
from argus.store.files import TMP_PREFIX, is_regular_file, write_bytes_atomic, write_parquet_atomic
from argus.store.schema import conform

__all__ = ["COMMITS_DIR", "UNIT_PREFIX", "STALE_LEFTOVER_S", "WindowUnit", "committed_units", "is_unit_file",
           "new_unit_id", "clean_leftovers"]

log = logging.getLogger("argus.store")

COMMITS_DIR = "commits"
UNIT_PREFIX = "u"  # single-file nonces are 8 hex digits, which never contain a "u"
#: Age after which a writer removes its own partition's temp files and uncommitted unit files.
#: Writing one file of a 10,000-rank window takes seconds; ten minutes is far beyond any live
#: write yet short enough that a restarted processor cleans what its killed predecessor left.
STALE_LEFTOVER_S = 600.0


def new_unit_id() -> str:
    return f"{UNIT_PREFIX}{uuid.uuid4().hex[:8]}"


def is_unit_file(path: Path) -> bool:
    """True for a data file that belongs to a multi-file unit (visible only once committed)."""
    _, _, nonce = path.stem.partition("-")
    return nonce.startswith(UNIT_PREFIX)


def committed_units(attempt_path: Path, writer: str) -> set[str]:
    """Stems (``<window>-u<hex8>``) of the units of ``writer`` that have a commit record."""
    root = attempt_path / COMMITS_DIR / writer
    try:
        names = os.listdir(root)
    except OSError:
        return set()
    return {n[:-5] for n in names if n.endswith(".json") and not n.startswith(".") and is_regular_file(root / n)}


@dataclass
class WindowUnit:
    """The files of one window of one writer; :meth:`commit` makes them visible together."""

    attempt_path: Path
    writer: str
    window: int
    durable: bool = True
    unit_id: str = field(default_factory=new_unit_id)
    rows: dict[str, int] = field(default_factory=dict)
    bytes_written: int = 0
    committed: bool = False
    totals: Callable[[pa.Table], pa.Table] = phase_totals_of  # derives a phases file's twin (its writer's connection)

    @property
    def stem(self) -> str:
        return f"{int(self.window):09d}-{self.unit_id}"

    def write(self, table: str, data: pa.Table | Mapping[str, object]) -> Path | None:
        """Stage one table's rows of the window (invisible to readers until :meth:`commit`)."""
        if self.committed:
            raise StoreError(f"window {self.window} of writer {self.writer!r} is already committed")
        if table in self.rows:
            raise StoreError(f"table {table!r} written twice in window {self.window} of writer {self.writer!r}")
        t = conform(table, data)
        if t.num_rows == 0:
            return None
        path = self.attempt_path / table / self.writer / f"{self.stem}.parquet"
        self.bytes_written += write_parquet_atomic(path, t, table, self.writer, self.durable)
        self.rows[table] = t.num_rows
        if table == TWIN_OF:  # its aggregates, committed with it
            totals = self.totals(t)
            self.bytes_written += write_parquet_atomic(self.attempt_path / "phase_totals" / self.writer / path.name,
                                                       totals, "phase_totals", self.writer, self.durable)
            self.rows["phase_totals"] = totals.num_rows
        return path

    def commit(self) -> None:
        """Write the commit record (after every data file is durable); a unit with no rows
        writes nothing."""
        if self.committed:
            return
        self.committed = True
        if not self.rows:
            return
        record = {"window": int(self.window), "writer": self.writer, "tables": self.rows, "committed_ns": time.time_ns()}
        write_bytes_atomic(self.attempt_path / COMMITS_DIR / self.writer / f"{self.stem}.json",
                           json.dumps(record).encode(), durable=self.durable)


def clean_leftovers(attempt_path: Path, writer: str, tables: list[str], older_than_s: float = STALE_LEFTOVER_S,
                    now: float | None = None) -> int:
    """Remove ``writer``'s own temp files and uncommitted unit files older than ``older_than_s``.

    Returns how many files went. Errors (a read-only store, a file another process removed
    first) are logged and skipped: cleaning is a courtesy, never a reason to fail."""
    now = time.time() if now is None else now
    committed = committed_units(attempt_path, writer)
    removed = 0
    dirs = [attempt_path / t / writer for t in tables] + [attempt_path / COMMITS_DIR / writer]
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            path = d / name
            leftover = name.startswith(TMP_PREFIX) or (
                d.parent.name != COMMITS_DIR and name.endswith(".parquet") and is_unit_file(path)
                and path.stem not in committed)
            if not leftover:
                continue
            try:
                st = os.lstat(path)
                if now - st.st_mtime < older_than_s:
                    continue
                path.unlink()
                removed += 1
            except OSError as exc:
                log.debug("could not remove leftover %s: %s", path, exc)
    if removed:
        log.info("removed %d leftover file(s) of writer %s in %s", removed, writer, attempt_path)
    return removed
