"""Store ↔ object storage: push committed files, pull them back, keep evidence bounded.

The embedded store is append-only — every window is a new immutable file committed by
rename — so synchronising is copying the files the other side lacks: nothing is ever
rewritten, a half-written file is never visible (local temp files are skipped; an S3 PUT is
all or nothing), and a push interrupted half-way is finished by the next one. Data files go
before the window commit records, and those before the metadata that makes an attempt visible
(``attempt.json``, the store manifest), so a reader of the bucket never finds an attempt whose
files are still on their way. A commit record whose data files a push did not list (a table
directory that appeared mid-walk) brings them along. A push stops at the first PUT that fails,
so nothing that a failed file should precede goes up without it.

What the store's readers skip is never shipped either way: names starting with ``.`` (temp
files, a staged attempt directory, the mirror's own ledger in ``.argus-mirror/``).

Evidence retention in the bucket follows the local rule (``argus.evidence.retention``):
Perfetto traces past a size budget or an age are deleted oldest first; nothing else is. The
budget is **per host** — each ``runs/<run>/<attempt>/evidence/<host>/`` host's traces, over all
the runs and attempts of the store, are one group with a budget of its own — so hosts sharing
a bucket never delete each other's traces. This module's functions list the bucket (one-shot
use); the live :class:`~argus.objstore.mirror.Mirror` keeps a ledger instead.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from argus import env as argus_env
from argus.objstore.backends import LocalObjectStore, ObjectInfo, ObjectStore, ObjectStoreError, open_objstore
from argus.store.commit import COMMITS_DIR
from argus.store.files import write_bytes_atomic

__all__ = ["SyncStats", "push", "pull", "enforce_remote_retention", "plan_retention", "evidence_host",
           "evidence_prefixes", "local_files", "is_private", "local_copy", "CACHE_ENV", "EVIDENCE_DIR"]

CACHE_ENV = argus_env.CACHE_DIR
EVIDENCE_DIR = "evidence"  # runs/<run>/<attempt>/evidence/<host>/<window>-<nonce>.pftrace (processor/daemon.py)
_METADATA = ("attempt.json", "argus-store.json")


@dataclass
class SyncStats:
    copied: int = 0
    bytes: int = 0
    skipped: int = 0
    deleted: int = 0
    listed: int = 0  # LIST requests sent to the destination (one per "directory" looked at)
    errors: list[str] = field(default_factory=list)


def is_private(key: str) -> bool:
    """True for a key that store readers skip: some segment starts with ``.``."""
    return any(part.startswith(".") for part in key.split("/"))


def _rank(key: str) -> int:
    """0 data, 1 window commit records (``store/commit.py``: a unit is visible once its record
    is), 2 the metadata that makes an attempt or the store visible."""
    if key.rsplit("/", 1)[-1] in _METADATA:
        return 2
    return 1 if f"/{COMMITS_DIR}/" in f"/{key}" else 0


def _order(objs: Iterable[ObjectInfo]) -> list[ObjectInfo]:
    """Data first, then the commit records that make windows visible, metadata last: a
    reader of the destination never sees a window or an attempt whose files are on their way."""
    return sorted(objs, key=lambda o: (_rank(o.key), o.key))


def _parent(key: str) -> str:
    return key.rsplit("/", 1)[0] if "/" in key else ""


def local_files(store_dir: str | Path, prefix: str = "") -> list[ObjectInfo]:
    """The files of a local store a push ships (under ``prefix``): regular files only, nothing
    whose name or directory starts with ``.``. Costs one ``lstat`` per file."""
    root = Path(store_dir)
    base = root / prefix if prefix else root
    out: list[ObjectInfo] = []
    for dirpath, dirnames, names in os.walk(base):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed meanwhile (evidence retention)
            if stat.S_ISREG(st.st_mode):
                out.append(ObjectInfo(Path(path).relative_to(root).as_posix(), st.st_size, st.st_mtime))
    return sorted(out, key=lambda o: o.key)


def _with_committed_data(store_dir: Path, todo: list[ObjectInfo], listed: set[str]) -> list[ObjectInfo]:
    """``todo`` plus the data files its commit records name that the listing missed.

    A commit record is written after its data, but a walk can see a table directory created
    after it listed the attempt and the commit record written after that: without this, the
    record would reach the bucket before its data. One small read per new commit record."""
    extra: list[ObjectInfo] = []
    for o in todo:
        if _rank(o.key) != 1:
            continue
        attempt, _, rest = o.key.rpartition(f"/{COMMITS_DIR}/")
        writer, _, name = rest.partition("/")
        try:
            tables = json.loads((store_dir / o.key).read_bytes()).get("tables", {})
        except (OSError, ValueError, AttributeError):
            continue
        for table in tables if isinstance(tables, dict) else ():
            key = f"{attempt}/{table}/{writer}/{name[:-5]}.parquet"
            if key in listed or not isinstance(table, str) or "/" in table or table.startswith("."):
                continue
            try:
                st = os.lstat(store_dir / key)
            except OSError:
                continue
            listed.add(key)
            extra.append(ObjectInfo(key, st.st_size, st.st_mtime))
    return todo + extra


def _remote_sizes(remote: ObjectStore, dirs: Iterable[str], stats: SyncStats) -> dict[str, ObjectInfo]:
    """What ``remote`` holds directly in each of ``dirs`` (one delimited listing each): the bucket
    is shared by every host, so nothing beyond the directories this side has is looked at."""
    have: dict[str, ObjectInfo] = {}
    for d in sorted(set(dirs)):
        stats.listed += 1
        for o in remote.list(d, recursive=False):
            have[o.key] = o
    return have


def _put_all(read: Callable[[str], bytes], dst: ObjectStore, todo: list[ObjectInfo], stats: SyncStats,
             on_put: Callable[[ObjectInfo], None] | None = None) -> None:
    """PUT ``todo`` in data → commits → metadata order; a source file gone meanwhile is skipped,
    the first failed PUT raises (what should follow it waits for the next push)."""
    for o in _order(todo):
        try:
            data = read(o.key)
        except FileNotFoundError:  # a local trace removed by retention since the listing
            stats.skipped += 1
            continue
        except ObjectStoreError as exc:  # a remote one removed meanwhile (or unreadable)
            stats.errors.append(str(exc))
            continue
        dst.put(o.key, data)
        stats.copied += 1
        stats.bytes += len(data)
        if on_put is not None:
            on_put(o)


def push(store_dir: str | Path, remote: ObjectStore, prefix: str = "") -> SyncStats:
    """Upload what ``remote`` lacks of the local store (under ``prefix``, e.g. one attempt).

    Correct without any state: it lists the bucket, but only the directories the local store
    has files in (one delimited LIST each), never the other hosts' partitions."""
    root = Path(store_dir)
    stats = SyncStats()
    local = local_files(root, prefix)
    have = _remote_sizes(remote, (_parent(o.key) for o in local), stats)
    todo = [o for o in local if not (o.key in have and have[o.key].size == o.size)]
    stats.skipped = len(local) - len(todo)
    todo = _with_committed_data(root, todo, {o.key for o in local})
    _put_all(lambda key: (root / key).read_bytes(), remote, todo, stats)
    return stats


def pull(remote: ObjectStore, store_dir: str | Path, prefix: str = "") -> SyncStats:
    """Download what the local store lacks (lists both sides under ``prefix``)."""
    stats = SyncStats()
    dst = LocalObjectStore(store_dir)
    have = {o.key: o.size for o in dst.list(prefix)}
    stats.listed += 1
    todo = []
    for o in remote.list(prefix):
        if is_private(o.key):
            continue
        if have.get(o.key) == o.size:
            stats.skipped += 1
        else:
            todo.append(o)
    _put_all(remote.get, dst, todo, stats)
    return stats


def evidence_host(key: str) -> str | None:
    """The ``<host>`` of ``runs/<run>/<attempt>/evidence/<host>/…``; ``""`` for a file directly
    in ``evidence/``; ``None`` for a key outside an attempt's evidence directory."""
    parts = key.split("/")
    if len(parts) >= 5 and parts[0] == "runs" and parts[3] == EVIDENCE_DIR:
        return parts[4] if len(parts) >= 6 else ""
    return None


def evidence_prefixes(store_dir: str | Path, host: str | None = None) -> list[str]:
    """The evidence directories (``runs/<run>/<attempt>/evidence/<host>``) of a local store, of
    every host or of ``host`` only — also those whose traces local retention already removed."""
    runs = Path(store_dir) / "runs"
    out = []
    for ev in sorted(runs.glob(f"*/*/{EVIDENCE_DIR}")):
        if not ev.is_dir() or any(p.startswith(".") for p in ev.relative_to(runs).parts):
            continue
        for d in sorted(ev.iterdir()):
            if d.is_dir() and not d.name.startswith(".") and (host is None or d.name == host):
                out.append(d.relative_to(store_dir).as_posix())
    return out


def plan_retention(objs: Iterable[ObjectInfo], *, max_bytes: int | None, max_age_s: float | None,
                   hosts: Iterable[str] | None = None, pattern: str = "*.pftrace",
                   now: float | None = None) -> list[ObjectInfo]:
    """The evidence among ``objs`` to delete: per host (of ``hosts``, default every host seen),
    oldest first, what is older than ``max_age_s`` and what exceeds ``max_bytes`` for that host.

    Only files of an evidence directory whose name matches ``pattern`` count and go; tables and
    anything else are never touched. Pure: the caller lists or remembers the objects."""
    now = time.time() if now is None else now
    wanted = None if hosts is None else set(hosts)
    by_host: dict[str, list[ObjectInfo]] = {}
    for o in objs:
        host = evidence_host(o.key)
        if host is None or (wanted is not None and host not in wanted) \
                or not fnmatch.fnmatchcase(o.key.rsplit("/", 1)[-1], pattern):
            continue
        by_host.setdefault(host, []).append(o)
    doomed: list[ObjectInfo] = []
    for group in by_host.values():
        group.sort(key=lambda o: (o.mtime, o.key))  # oldest first
        total = sum(o.size for o in group)
        for o in group:
            too_old = max_age_s is not None and now - o.mtime > max_age_s
            too_big = max_bytes is not None and total > max_bytes
            if not (too_old or too_big):
                break  # everything after is younger, and the host is within budget
            doomed.append(o)
            total -= o.size
    return doomed


def enforce_remote_retention(remote: ObjectStore, *, max_bytes: int | None, max_age_s: float | None,
                             pattern: str = "*.pftrace", now: float | None = None,
                             hosts: Iterable[str] | None = None,
                             prefixes: Iterable[str] | None = None) -> list[str]:
    """Delete evidence objects past the age or the size budget, **each host its own budget**
    (see :func:`plan_retention`); returns the keys deleted.

    Lists ``remote`` under each of ``prefixes`` (default: all of it; pass
    :func:`evidence_prefixes` of the local store to look only at its own hosts' directories).
    ``hosts`` limits deletion to those hosts. Age is the object's upload time."""
    objs: list[ObjectInfo] = []
    for p in ([""] if prefixes is None else sorted(set(prefixes))):
        objs.extend(remote.list(p))
    doomed = plan_retention(objs, max_bytes=max_bytes, max_age_s=max_age_s, hosts=hosts, pattern=pattern, now=now)
    for o in doomed:
        remote.delete(o.key)
    return [o.key for o in doomed]


def local_copy(uri: str) -> Path:
    """A local directory holding the store at ``uri`` (pulled into a cache for ``s3://``)."""
    if not uri.startswith("s3://"):
        return Path(uri)
    base = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "argus" / "objstore")
    target = base / hashlib.sha1(uri.encode()).hexdigest()[:16]
    pull(open_objstore(uri), target)
    write_bytes_atomic(target / ".source", uri.encode())
    return target
