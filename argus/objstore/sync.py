"""Store ↔ object storage: push committed files, pull them back, keep evidence bounded.

The embedded store is append-only — every window is a new immutable file committed by
rename — so synchronising is copying the files the other side lacks: nothing is ever
rewritten, a half-written file is never visible (local temp files are skipped; an S3 PUT is
all or nothing), and a push interrupted half-way is finished by the next one. Data files go
before the window commit records, and those before the metadata that makes an attempt visible (``attempt.json``, the store manifest),
so a reader of the bucket never finds an attempt whose files are still on their way.

Evidence retention in the bucket follows the local rule (``argus.evidence.retention``):
Perfetto traces past a size budget or an age are deleted oldest first; nothing else is.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from argus.objstore.backends import LocalObjectStore, ObjectInfo, ObjectStore, ObjectStoreError, open_objstore
from argus.store.commit import COMMITS_DIR
from argus.store.files import write_bytes_atomic

__all__ = ["SyncStats", "push", "pull", "enforce_remote_retention", "Mirror", "local_copy", "CACHE_ENV"]

log = logging.getLogger("argus.objstore")
CACHE_ENV = "ARGUS_CACHE_DIR"
_METADATA = ("attempt.json", "argus-store.json")


@dataclass
class SyncStats:
    copied: int = 0
    bytes: int = 0
    skipped: int = 0
    deleted: int = 0
    errors: list[str] = field(default_factory=list)


def _rank(key: str) -> int:
    """0 data, 1 window commit records (``store/commit.py``: a unit is visible once its record
    is), 2 the metadata that makes an attempt or the store visible."""
    if key.rsplit("/", 1)[-1] in _METADATA:
        return 2
    return 1 if f"/{COMMITS_DIR}/" in f"/{key}" else 0


def _order(objs: list[ObjectInfo]) -> list[ObjectInfo]:
    """Data first, then the commit records that make windows visible, metadata last: a
    reader of the destination never sees a window or an attempt whose files are on their way."""
    return sorted(objs, key=lambda o: (_rank(o.key), o.key))


def _copy(src: ObjectStore, dst: ObjectStore, prefix: str = "") -> SyncStats:
    stats = SyncStats()
    have = {o.key: o.size for o in dst.list(prefix)}
    for o in _order(src.list(prefix)):
        if have.get(o.key) == o.size:
            stats.skipped += 1
            continue
        try:
            data = src.get(o.key)
        except ObjectStoreError as exc:  # deleted by retention meanwhile
            stats.errors.append(str(exc))
            continue
        dst.put(o.key, data)
        stats.copied += 1
        stats.bytes += len(data)
    return stats


def push(store_dir: str | Path, remote: ObjectStore, prefix: str = "") -> SyncStats:
    """Upload what ``remote`` lacks of the local store (under ``prefix``, e.g. one attempt)."""
    return _copy(LocalObjectStore(store_dir), remote, prefix)


def pull(remote: ObjectStore, store_dir: str | Path, prefix: str = "") -> SyncStats:
    """Download what the local store lacks."""
    return _copy(remote, LocalObjectStore(store_dir), prefix)


def enforce_remote_retention(remote: ObjectStore, *, max_bytes: int | None, max_age_s: float | None,
                             pattern: str = "*.pftrace", now: float | None = None) -> list[str]:
    """Delete evidence objects (``*/evidence/*`` matching ``pattern``) past the age or size budget."""
    now = time.time() if now is None else now
    ev = [o for o in remote.list() if "/evidence/" in f"/{o.key}" and fnmatch.fnmatch(o.key.rsplit("/", 1)[-1],
                                                                                        pattern)]
    ev.sort(key=lambda o: (o.mtime, o.key))  # oldest first
    doomed = [o for o in ev if max_age_s is not None and now - o.mtime > max_age_s]
    keep = [o for o in ev if o not in doomed]
    if max_bytes is not None:
        total = sum(o.size for o in keep)
        while keep and total > max_bytes:
            o = keep.pop(0)
            doomed.append(o)
            total -= o.size
    for o in doomed:
        remote.delete(o.key)
    return [o.key for o in doomed]


class Mirror:
    """Push a live store to object storage every ``interval_s`` (and once more on ``stop``),
    applying evidence retention in the bucket. Failures are logged and retried next time:
    the object store being down never blocks whoever writes the store."""

    def __init__(self, store_dir: str | Path, remote: ObjectStore, interval_s: float = 30.0,
                 max_bytes: int | None = 512 << 20, max_age_s: float | None = 24 * 3600.0):
        self.store_dir, self.remote, self.interval_s = Path(store_dir), remote, interval_s
        self.max_bytes, self.max_age_s = max_bytes, max_age_s
        self.stats = SyncStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="argus-mirror", daemon=True)

    def start(self) -> "Mirror":
        self._thread.start()
        return self

    def once(self) -> None:
        try:
            s = push(self.store_dir, self.remote)
            self.stats.copied += s.copied
            self.stats.bytes += s.bytes
            self.stats.deleted += len(enforce_remote_retention(self.remote, max_bytes=self.max_bytes,
                                                               max_age_s=self.max_age_s))
        except ObjectStoreError as exc:
            self.stats.errors = (self.stats.errors + [str(exc)])[-20:]
            log.warning("mirror to %s failed (will retry): %s", self.remote.uri, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        self.once()


def local_copy(uri: str) -> Path:
    """A local directory holding the store at ``uri`` (pulled into a cache for ``s3://``)."""
    if not uri.startswith("s3://"):
        return Path(uri)
    base = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "argus" / "objstore")
    target = base / hashlib.sha1(uri.encode()).hexdigest()[:16]
    pull(open_objstore(uri), target)
    write_bytes_atomic(target / ".source", uri.encode())
    return target
