"""The store root: a directory holding run attempts, marked by a manifest.

``<store>/argus-store.json`` marks the directory as an Argus store and records the schema
version; ``<store>/runs/<run_id>/<attempt_id>/`` holds each attempt (see ``attempt.py``).
A directory that is not empty and has no manifest is refused for writing, so pointing
``--out`` at the wrong place never mixes Argus files into someone else's data.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

from argus.errors import StoreError
from argus.store.attempt import ATTEMPT_META, Attempt, JoinedAttempt
from argus.store.files import TMP_PREFIX, read_regular_bytes, write_bytes_atomic
from argus.store.schema import SCHEMA_VERSION
from argus.topology import Layout, RunIdentity, Topology

__all__ = ["Store", "MANIFEST"]

MANIFEST = "argus-store.json"
_FORMAT = "argus-store"
log = logging.getLogger("argus.store")


class Store:
    """An embedded run store rooted at a local directory."""

    def __init__(self, root: Path, manifest: Mapping[str, Any]):
        self.root = Path(root)
        self.manifest = dict(manifest)
        self.damaged: dict[Path, StoreError] = {}  # attempt directories :meth:`attempts` could not open

    @classmethod
    def open(cls, root: str | Path) -> "Store":
        root = Path(root)
        path = root / MANIFEST
        if not root.exists():
            raise StoreError(f"{root}: no such store directory")
        if not root.is_dir():
            raise StoreError(f"{root}: not a directory, so not an Argus store")
        try:
            manifest = json.loads(read_regular_bytes(path))
        except FileNotFoundError:
            raise StoreError(f"{root}: not an Argus store (no {MANIFEST}); create one with "
                             "`argus simulate --out DIR` or `argus run --store DIR`") from None
        except (OSError, ValueError, RecursionError) as exc:
            raise StoreError(f"{path}: unreadable store manifest ({type(exc).__name__}: {exc})"[:500]) from None
        if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
            fmt = manifest.get("format") if isinstance(manifest, dict) else None
            raise StoreError(f"{path}: not an Argus store manifest (format={fmt!r:.80})")
        version = manifest.get("schema_version")
        if not isinstance(version, int) or isinstance(version, bool) or version > SCHEMA_VERSION:
            raise StoreError(f"{path}: store schema v{version}; this Argus reads up to v{SCHEMA_VERSION}")
        return cls(root, manifest)

    @classmethod
    def create(cls, root: str | Path) -> "Store":
        """Open the store at ``root``, creating it if the directory is absent or empty."""
        root = Path(root)
        if (root / MANIFEST).exists():
            return cls.open(root)
        if root.exists() and not root.is_dir():
            raise StoreError(f"{root}: exists and is not a directory")
        if root.exists() and any(root.iterdir()):
            if cls._manifest_in_flight(root):  # another host's processor is creating it right now
                return cls.open(root)
            if any(root.iterdir()):
                raise StoreError(f"{root}: directory is not empty and is not an Argus store; "
                                 "refusing to write into it (choose a new or empty directory)")
        root.mkdir(parents=True, exist_ok=True)
        manifest = {"format": _FORMAT, "schema_version": SCHEMA_VERSION, "created_ns": time.time_ns()}
        write_bytes_atomic(root / MANIFEST, json.dumps(manifest, indent=2).encode())
        return cls(root, manifest)

    @staticmethod
    def _manifest_in_flight(root: Path, timeout_s: float = 10.0) -> bool:
        """True once the manifest appears, if all the directory holds meanwhile is its temp file."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (root / MANIFEST).exists():
                return True
            names = [p.name for p in root.iterdir()]
            if not names:
                return False  # emptied again: the caller creates it
            if not all(n.startswith(TMP_PREFIX) and n.endswith(MANIFEST) for n in names):
                return False
            time.sleep(0.02)
        return False

    # -- attempts ----------------------------------------------------------------------
    def attempt_path(self, identity: RunIdentity) -> Path:
        return self.root / "runs" / identity.run_id / identity.attempt_id

    def create_attempt(self, identity: RunIdentity, topology: Topology | Layout, source: str,
                       extra: Mapping[str, Any] | None = None) -> Attempt:
        path = self.attempt_path(identity)
        if path.exists():
            raise StoreError(f"{path}: attempt {identity.run_id}/{identity.attempt_id} already exists")
        return Attempt.create(path, identity, topology, source, extra)

    def open_or_create_attempt(self, identity: RunIdentity, topology: Topology | Layout, source: str,
                               extra: Mapping[str, Any] | None = None) -> Attempt:
        """Several hosts (or a restarted processor) append to the same attempt."""
        path = self.attempt_path(identity)
        if (path / ATTEMPT_META).exists() or (path.is_dir() and not path.name.startswith(".")):
            attempt = self._open_dir(path)  # StoreError naming attempt.json if it is missing, corrupt or foreign
            layout = topology.layout if isinstance(topology, Topology) else topology
            if attempt.layout != layout:
                raise StoreError(f"{path}: stored layout {attempt.layout} differs from {layout}")
            return attempt
        try:
            return Attempt.create(path, identity, topology, source, extra)
        except FileExistsError:  # another host created it between our check and mkdir
            return self._open_dir(path)

    @staticmethod
    def _open_dir(path: Path) -> Attempt:
        """Open the attempt in ``runs/<run_id>/<attempt_id>``; an ``attempt.json`` naming another
        run or attempt than its directory (copied from elsewhere) is refused."""
        attempt = Attempt.open(path)
        if (attempt.identity.run_id, attempt.identity.attempt_id) != (path.parent.name, path.name):
            raise StoreError(f"{path / ATTEMPT_META}: foreign attempt metadata (it names run "
                             f"{attempt.identity.run_id!r:.80} attempt {attempt.identity.attempt_id!r:.40}, the "
                             f"directory is {path.parent.name}/{path.name})")
        return attempt

    def _attempt_dirs(self) -> list[Path]:
        runs = self.root / "runs"
        if not runs.is_dir():
            return []
        return [att for run_dir in sorted(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith("."))
                for att in sorted(p for p in run_dir.iterdir() if p.is_dir() and not p.name.startswith("."))]

    def attempts(self) -> list[Attempt]:
        """All readable attempts, oldest first. One whose ``attempt.json`` is missing, corrupt
        or foreign is left out and listed in :attr:`damaged` (a crash or a stray directory
        must not hide the store's other attempts)."""
        found = []
        self.damaged = {}
        for att in self._attempt_dirs():
            try:
                found.append(self._open_dir(att))
            except StoreError as exc:
                log.warning("skipping attempt: %s", exc)
                self.damaged[att] = exc
        return sorted(found, key=lambda a: (a.meta.get("created_ns", 0) if isinstance(a.meta.get("created_ns"), int)
                                            else 0, a.identity.run_id))

    def attempt(self, run_id: str | None = None, attempt_id: str | None = None) -> Attempt:
        """The attempt asked for; by default the most recently created one. Asking for one
        whose metadata is damaged raises that damage (naming the file)."""
        attempts = self.attempts()
        if run_id is not None:
            attempts = [a for a in attempts if a.identity.run_id == run_id]
        if attempt_id is not None:
            attempts = [a for a in attempts if a.identity.attempt_id == attempt_id]
        if not attempts:
            what = f" matching run={run_id} attempt={attempt_id}" if run_id or attempt_id else ""
            for att, exc in self.damaged.items():
                if (run_id is None or att.parent.name == run_id) and (attempt_id is None or att.name == attempt_id):
                    raise exc
            raise StoreError(f"{self.root}: no run attempt{what} in this store")
        if run_id is None:
            return one_job(attempts[-1], attempts)
        return attempts[-1]

    def __repr__(self) -> str:
        return f"Store({self.root})"


#: Attempts created this close together can be one job whose hosts named it apart.
JOIN_WINDOW_S = 120.0


def one_job(latest: Attempt, attempts: list[Attempt]) -> Attempt:
    """``latest`` and the attempts of other runs that are the same job: same layout and attempt
    id, created within ``JOIN_WINDOW_S``, written by other hosts, holding other ranks. Hosts of
    one job launched a second apart, each naming the run itself (what Argus did before the ranks
    agreed on a run id), left halves that only together are the job: read as one
    (:class:`JoinedAttempt`)."""
    def created(a: Attempt) -> float:
        value = a.meta.get("created_ns")
        return float(value) / 1e9 if isinstance(value, int) else float("nan")

    def writers(a: Attempt) -> set[str]:
        return {d.name for d in Attempt._entries(a.path / "steps")}

    def ranks(a: Attempt) -> set[int]:
        return set(a.read("steps", columns=["rank"]).column("rank").to_pylist())

    mine_w, mine_r = writers(latest), None
    parts = [latest]
    for other in reversed(attempts[:-1]):
        if (other.identity.run_id == latest.identity.run_id or other.identity.attempt_id != latest.identity.attempt_id
                or str(other.layout) != str(latest.layout) or other.layout.order != latest.layout.order
                or not abs(created(other) - created(latest)) <= JOIN_WINDOW_S):
            continue
        w = writers(other)
        if not w or w & mine_w:
            continue
        mine_r = ranks(latest) if mine_r is None else mine_r
        r = ranks(other)
        if not r or r & mine_r:
            continue
        parts.append(other)
        mine_w |= w
        mine_r |= r
    if len(parts) == 1:
        return latest
    return JoinedAttempt(sorted(parts, key=lambda a: a.identity.run_id))
