"""The mirror's ledger: what one local store has already put in one remote, so a live mirror
never lists the bucket to find out.

One JSON-lines file per (store, remote) in the store's private directory,
``<store>/.argus-mirror/<sha1(remote uri)[:16]>.jsonl`` — a dot name, so store readers skip it
and a push never ships it. The first line is a header naming the remote; each further line is
one object::

    {"format": "argus-mirror-ledger", "version": 1, "remote": "s3://bucket/prefix"}
    {"k": "runs/r/0/steps/host-a/000000001-u1a2b3c4d.parquet", "s": 18211, "t": 1733090000.123}
    {"k": "runs/r/0/evidence/host-a/000000001-9f8e7d6c.pftrace", "s": 3310411, "t": 1733090001.5, "gone": true}

``k`` is the key, ``s`` the size and ``t`` the local file's mtime when it was PUT (for a copy
found in the bucket by a rebuild whose local file is gone: the upload time); ``gone`` marks a
remote copy the mirror's retention deleted, so the next push does not upload the local file
again. A later line for a key replaces an earlier one.

A record is appended only after its PUT or DELETE succeeded, each in one ``write`` of a whole
line: a crash loses at most the last few records (their files are PUT again, which is
harmless: same key, same bytes) and can leave a torn last line, which loading ignores. The file
is rewritten whole (temp + rename) only to compact it: when loading found a torn line, or when
superseded lines outnumber live ones. Memory: one dict entry per file the store ever pushed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from argus.objstore.sync import evidence_host
from argus.store.files import read_regular_bytes, write_bytes_atomic

__all__ = ["Ledger", "LedgerEntry", "MIRROR_STATE_DIR"]

log = logging.getLogger("argus.objstore")
MIRROR_STATE_DIR = ".argus-mirror"
_FORMAT, _VERSION = "argus-mirror-ledger", 1
_MAX_LEDGER_BYTES = 1 << 34  # a readability bound, not a budget: ~150 M records
_COMPACT_MIN_DEAD = 10_000  # superseded lines tolerated before a rewrite, whatever the live count


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    size: int
    mtime: float
    gone: bool = False  # deleted from the remote by retention; the local file is not PUT again


class Ledger:
    """Key → :class:`LedgerEntry` for one remote, persisted beside the store (see the module
    docstring). Not thread-safe: one mirror owns it."""

    def __init__(self, store_dir: str | Path, remote_uri: str, state_dir: str | Path | None = None):
        """``state_dir``: where the ledger lives (default ``<store>/.argus-mirror``): elsewhere
        when the store is mounted read-only for the mirror, as in a Kubernetes sidecar."""
        self.remote_uri = remote_uri
        name = hashlib.sha1(remote_uri.encode()).hexdigest()[:16]
        self.path = (Path(state_dir) if state_dir is not None else Path(store_dir) / MIRROR_STATE_DIR) / f"{name}.jsonl"
        self.entries: dict[str, LedgerEntry] = {}
        #: the entries in an evidence directory still in the remote: what retention looks at
        #: each cycle without a pass over every table file the store ever pushed
        self.evidence: dict[str, LedgerEntry] = {}
        self._lines = 0  # record lines in the file (live + superseded)
        self._unsynced = False

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> bool:
        """Read the file; False when it is absent or unreadable (then the caller rebuilds it).
        A torn or foreign line is skipped and the file compacted, never a reason to rebuild."""
        self.entries, self.evidence, self._lines = {}, {}, 0
        try:
            raw = read_regular_bytes(self.path, _MAX_LEDGER_BYTES)
        except FileNotFoundError:
            return False
        except Exception as exc:  # noqa: BLE001 - StoreError (not a regular file, too large), OSError
            log.warning("mirror ledger %s unreadable (%s): listing the bucket once to rebuild it", self.path, exc)
            return False
        lines = raw.split(b"\n")
        try:
            head = json.loads(lines[0])
            ok = isinstance(head, dict) and head.get("format") == _FORMAT and head.get("version") == _VERSION \
                and head.get("remote") == self.remote_uri
        except ValueError:
            ok = False
        if not ok:
            log.warning("mirror ledger %s has no valid header for %s: listing the bucket once to rebuild it",
                        self.path, self.remote_uri)
            return False
        torn = not raw.endswith(b"\n")  # a crash mid-append: compact before appending after it
        bad = 0
        for line in lines[1:]:
            if not line:
                continue
            try:
                rec = json.loads(line)
                key, size, mtime = rec["k"], rec["s"], rec["t"]
                if not (isinstance(key, str) and isinstance(size, int) and isinstance(mtime, int | float)):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                bad += 1
                continue
            self._set(key, LedgerEntry(size, float(mtime), bool(rec.get("gone", False))))
            self._lines += 1
        if bad or torn:
            log.info("mirror ledger %s: %d torn or foreign line(s) skipped; compacting", self.path, max(bad, 1))
            self.replace(self.entries)
        return True

    def replace(self, entries: dict[str, LedgerEntry]) -> None:
        """Rewrite the file with exactly ``entries`` (temp + rename: whole or not at all)."""
        lines = [json.dumps({"format": _FORMAT, "version": _VERSION, "remote": self.remote_uri})]
        lines += [_line(k, e) for k, e in sorted(entries.items())]
        write_bytes_atomic(self.path, ("\n".join(lines) + "\n").encode())
        self.entries, self.evidence, self._lines = {}, {}, len(entries)
        for k, e in entries.items():
            self._set(k, e)

    def record(self, key: str, size: int, mtime: float, gone: bool = False) -> None:
        """Remember ``key`` (call only after its PUT, or with ``gone`` its DELETE, succeeded)."""
        entry = LedgerEntry(size, mtime, gone)
        if not self.path.exists():
            self.replace({**self.entries, key: entry})
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (_line(key, entry) + "\n").encode())
        finally:
            os.close(fd)
        self._set(key, entry)
        self._lines += 1
        self._unsynced = True

    def _set(self, key: str, entry: LedgerEntry) -> None:
        self.entries[key] = entry
        if entry.gone:
            self.evidence.pop(key, None)
        elif evidence_host(key) is not None:
            self.evidence[key] = entry

    def compact(self, keep_gone: set[str] | None = None) -> bool:
        """Rewrite the file when superseded lines outnumber live ones; a ``gone`` entry whose key
        is not in ``keep_gone`` (the local files now) is dropped: nothing would PUT it again."""
        dead = self._lines - len(self.entries)
        if dead < max(_COMPACT_MIN_DEAD, len(self.entries)):
            return False
        keep = {k: e for k, e in self.entries.items() if not e.gone or keep_gone is None or k in keep_gone}
        self.replace(keep)
        return True

    def sync(self) -> None:
        """``fsync`` the records appended since the last call (once per push, not per record)."""
        if not self._unsynced:
            return
        self._unsynced = False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _line(key: str, e: LedgerEntry) -> str:
    rec: dict[str, object] = {"k": key, "s": e.size, "t": e.mtime}
    if e.gone:
        rec["gone"] = True
    return json.dumps(rec, separators=(",", ":"))
