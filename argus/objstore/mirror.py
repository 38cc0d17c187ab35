"""The live mirror: a thread that pushes a store to object storage as it grows, and keeps its
host's evidence in the bucket within budget — without listing the bucket.

Each cycle lists the **local** store, PUTs the files its :class:`~argus.objstore.ledger.Ledger`
does not hold (data → commit records → metadata, as :func:`~argus.objstore.sync.push`) and
records each one once its PUT succeeded; then it deletes, oldest first, the remote copies of
its evidence that the ledger knows, past the age limit or the host's size budget. A bucket
shared by 1,250 hosts costs each host no LIST at all in the steady state: the bucket is listed
only when the ledger is absent or unreadable (first start, a lost ledger), and then only the
directories the local store has (one delimited LIST each), never the other hosts' partitions.

The budget is per host. A processor's mirror (``host=`` its host) manages only that host's
``runs/*/*/evidence/<host>/`` traces, all its runs and attempts together; ``host=None`` (``argus
sync --watch``) gives each host directory of the store a budget of its own. Local retention
deleting a trace does not delete its remote copy: the remote budget holds on its own, over what
the ledger knows is in the bucket.

Failures (bucket down, disk full for the ledger) are logged, counted and retried next cycle; a
push stops at the first failed PUT and the next one finishes it. Nothing here ever blocks
whoever writes the store.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from argus.evidence.retention import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES
from argus.objstore.backends import ObjectInfo, ObjectStore, ObjectStoreError
from argus.objstore.ledger import Ledger, LedgerEntry
from argus.objstore.sync import (SyncStats, _parent, _put_all, _remote_sizes, _with_committed_data, evidence_host,
                                 evidence_prefixes, local_files, plan_retention)

__all__ = ["Mirror"]

log = logging.getLogger("argus.objstore")


class Mirror:
    """Push a live store to object storage every ``interval_s`` (and once more on ``stop``),
    applying evidence retention in the bucket per host (``host``: only this host's evidence;
    ``None``: every host of the store, each its own budget). Failures are logged and retried
    next time: the object store being down never blocks whoever writes the store."""

    def __init__(self, store_dir: str | Path, remote: ObjectStore, interval_s: float = 30.0,
                 max_bytes: int | None = DEFAULT_MAX_BYTES, max_age_s: float | None = DEFAULT_MAX_AGE_S, *,
                 host: str | None = None, pattern: str = "*.pftrace", clock: Callable[[], float] = time.time,
                 state_dir: str | Path | None = None):
        self.store_dir, self.remote, self.interval_s = Path(store_dir), remote, interval_s
        self.max_bytes, self.max_age_s, self.host, self.pattern = max_bytes, max_age_s, host, pattern
        self.clock = clock
        self.ledger = Ledger(self.store_dir, remote.uri, state_dir)
        self.stats = SyncStats()  # totals since start (``skipped`` only in ``last``); ``errors`` the last 20
        self.last = SyncStats()  # the latest cycle
        self._loaded = False
        self._lock = threading.Lock()  # ``stop`` may push while a slow cycle of the thread still runs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="argus-mirror", daemon=True)

    def start(self) -> "Mirror":
        self._thread.start()
        return self

    def once(self) -> SyncStats:
        """One cycle: push what the ledger lacks, then retention. Never raises for the bucket."""
        with self._lock:
            cycle = SyncStats()
            try:
                self._push(cycle)
                self._retain(cycle)
            except (ObjectStoreError, OSError) as exc:
                cycle.errors.append(str(exc))
                log.warning("mirror to %s failed (will retry): %s", self.remote.uri, exc)
            except Exception as exc:  # a bug must not end the thread: the next cycle tries again
                cycle.errors.append(f"{type(exc).__name__}: {exc}")
                log.exception("mirror to %s failed (will retry)", self.remote.uri)
            finally:
                try:
                    self.ledger.sync()
                except OSError as exc:
                    log.warning("mirror ledger %s: fsync failed: %s", self.ledger.path, exc)
            for name in ("copied", "bytes", "deleted", "listed"):
                setattr(self.stats, name, getattr(self.stats, name) + getattr(cycle, name))
            self.stats.errors = (self.stats.errors + cycle.errors)[-20:]
            self.last = cycle
            return cycle

    def _manages(self, key: str) -> bool:
        """Evidence whose remote copy this mirror's retention is in charge of."""
        host = evidence_host(key)
        return host is not None and (self.host is None or host == self.host) \
            and fnmatch.fnmatchcase(key.rsplit("/", 1)[-1], self.pattern)

    def _push(self, cycle: SyncStats) -> None:
        local = local_files(self.store_dir)
        if not self._loaded:
            if not local and not self.ledger.exists():
                return  # nothing to push: leave a directory that is not a store yet untouched
            if not self.ledger.load():
                self._rebuild(local, cycle)
            self._loaded = True
        entries, now = self.ledger.entries, self.clock()

        def known(o: ObjectInfo) -> bool:
            e = entries.get(o.key)
            return e is not None and e.size == o.size and e.mtime == o.mtime

        todo = [o for o in local if not known(o)]
        cycle.skipped = len(local) - len(todo)
        listed = {o.key for o in local}
        todo = [o for o in _with_committed_data(self.store_dir, todo, set(listed)) if not known(o)]
        doomed = self._doomed_on_arrival(todo, now)
        for o in todo:
            if o.key in doomed:
                self.ledger.record(o.key, o.size, o.mtime, gone=True)
        todo = [o for o in todo if o.key not in doomed]
        root = self.store_dir
        _put_all(lambda key: (root / key).read_bytes(), self.remote, todo, cycle,
                 on_put=lambda o: self.ledger.record(o.key, o.size, o.mtime))
        self.ledger.compact(keep_gone=listed)

    def _doomed_on_arrival(self, todo: list[ObjectInfo], now: float) -> set[str]:
        """New traces that retention would delete as soon as they arrived (past the age limit, or
        older than what the host's budget keeps): they are not uploaded. After a rebuild this is
        also what keeps the traces retention had deleted before the ledger was lost from going up
        again."""
        if self.max_bytes is None and self.max_age_s is None:
            return set()
        new = [o for o in todo if self._manages(o.key)]
        if not new:
            return set()
        there = [ObjectInfo(k, e.size, e.mtime) for k, e in self.ledger.evidence.items() if self._manages(k)]
        fresh = {o.key for o in new}
        return {o.key for o in plan_retention(there + new, max_bytes=self.max_bytes, max_age_s=self.max_age_s,
                                              pattern=self.pattern, now=now) if o.key in fresh}

    def _rebuild(self, local: list[ObjectInfo], cycle: SyncStats) -> None:
        """The ledger from the bucket: list the directories the local store has files in, and
        its evidence directories (whose traces local retention may have removed already)."""
        dirs = {_parent(o.key) for o in local} | set(evidence_prefixes(self.store_dir, self.host))
        have = _remote_sizes(self.remote, dirs, cycle)
        by_key = {o.key: o for o in local}
        entries: dict[str, LedgerEntry] = {}
        for key, r in have.items():
            lo = by_key.get(key)
            if lo is not None:
                if lo.size == r.size:
                    entries[key] = LedgerEntry(lo.size, lo.mtime)
            elif self._manages(key):
                entries[key] = LedgerEntry(r.size, r.mtime)  # ours, gone locally: still counts against the budget
        log.info("mirror to %s: ledger rebuilt from %d listing(s), %d object(s) already there",
                 self.remote.uri, len(dirs), len(entries))
        self.ledger.replace(entries)

    def _retain(self, cycle: SyncStats) -> None:
        if not self._loaded or (self.max_bytes is None and self.max_age_s is None):
            return
        objs = [ObjectInfo(k, e.size, e.mtime) for k, e in self.ledger.evidence.items() if self._manages(k)]
        doomed = plan_retention(objs, max_bytes=self.max_bytes, max_age_s=self.max_age_s,
                                pattern=self.pattern, now=self.clock())
        for o in doomed:
            self.remote.delete(o.key)
            self.ledger.record(o.key, o.size, o.mtime, gone=True)
            cycle.deleted += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.once()

    def stop(self) -> None:
        """Stop the thread and push once more (what the writer flushed at exit reaches the bucket)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        self.once()

    def __enter__(self) -> "Mirror":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
