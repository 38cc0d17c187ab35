"""Bounded retention for evidence files: delete the oldest traces past a size or age budget.

Evidence is the only thing Argus deletes, and only files matching the evidence pattern under
the evidence directory: Parquet tables, notes and anything else a person put there are never
touched. Other processes may delete files at the same time (a second processor, a person):
a file that vanishes between listing and deleting is simply skipped.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from argus import env as argus_env
from argus.errors import ConfigError
from argus.store.files import TMP_PREFIX

__all__ = ["RetentionPolicy", "enforce_retention", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_AGE_S",
           "STALE_TMP_S", "ENV_MAX_BYTES", "ENV_MAX_AGE_S"]

DEFAULT_MAX_BYTES = 512 * 1024 * 1024  # ≈ 50 windows of 100k events (~10 MB each) per host
DEFAULT_MAX_AGE_S = 24 * 3600.0  # a day: long enough to look at last night's incident
STALE_TMP_S = 3600.0  # a hidden temp file older than this is a crashed writer's leftover
ENV_MAX_BYTES = argus_env.EVIDENCE_MAX_BYTES  # overrides max_bytes; "none" disables the size limit
ENV_MAX_AGE_S = argus_env.EVIDENCE_MAX_AGE_S  # overrides max_age_s; "none" disables the age limit


@dataclass(kw_only=True, slots=True)
class RetentionPolicy:
    """How much evidence a processor keeps: at most ``max_bytes`` of files matching ``pattern``
    (recursively) and none older than ``max_age_s``; ``None`` switches a limit off."""

    max_bytes: int | None = DEFAULT_MAX_BYTES
    max_age_s: float | None = DEFAULT_MAX_AGE_S
    pattern: str = "*.pftrace"

    def __post_init__(self) -> None:
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int)
                                           or self.max_bytes < 0):
            raise ConfigError(f"retention max_bytes must be a non-negative integer or None, got {self.max_bytes!r}")
        if self.max_age_s is not None and (isinstance(self.max_age_s, bool)
                                           or not isinstance(self.max_age_s, int | float) or not self.max_age_s >= 0):
            raise ConfigError(f"retention max_age_s must be a non-negative number of seconds or None, "
                              f"got {self.max_age_s!r}")
        if not self.pattern or "/" in self.pattern or os.sep in self.pattern:
            raise ConfigError(f"retention pattern must be a file-name glob such as '*.pftrace', got {self.pattern!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **explicit: object) -> RetentionPolicy:
        """Explicit arguments, else ``ARGUS_EVIDENCE_*`` variables, else the defaults."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(explicit) - known)
        if unknown:
            raise ConfigError(f"unknown retention setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for key, var, kind in (("max_bytes", ENV_MAX_BYTES, int), ("max_age_s", ENV_MAX_AGE_S, float)):
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[key] = None if raw.strip().lower() == "none" else kind(raw)
            except ValueError:
                raise ConfigError(f"{var}={raw!r} is not a {kind.__name__} (or 'none')") from None
        values.update(explicit)
        return cls(**values)  # type: ignore[arg-type]

    def enforce(self, directory: Path, *, now: float | None = None) -> list[Path]:
        """Apply this policy to ``directory``; returns the files removed."""
        return enforce_retention(directory, max_bytes=self.max_bytes, max_age_s=self.max_age_s,
                                 now=now, pattern=self.pattern)


def enforce_retention(directory: Path, *, max_bytes: int | None, max_age_s: float | None,
                      now: float | None = None, pattern: str = "*.pftrace") -> list[Path]:
    """Delete the oldest evidence files until the directory (recursively) is under max_bytes
    and nothing is older than max_age_s; returns what was removed.

    Only regular files whose name matches ``pattern`` count and are deleted (symlinks and
    directories are left alone). Age is ``now - mtime``; ``now`` defaults to ``time.time()``.
    Hidden temporary files of an atomic write in progress are skipped, unless older than
    :data:`STALE_TMP_S` (a crashed writer's leftover), which are removed. Costs one ``lstat``
    per file in the tree."""
    now = time.time() if now is None else now
    files: list[tuple[float, str, int]] = []  # (mtime, path, size)
    removed: list[Path] = []
    for path, st in _matching_files(Path(directory), pattern):
        if os.path.basename(path).startswith(TMP_PREFIX):
            if now - st.st_mtime > STALE_TMP_S and _unlink(path):
                removed.append(Path(path))
            continue
        files.append((st.st_mtime, path, st.st_size))
    files.sort()
    total = sum(size for _, _, size in files)
    for mtime, path, size in files:
        too_old = max_age_s is not None and now - mtime > max_age_s
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_big):
            break  # oldest first: everything after is younger, and the size is within budget
        if _unlink(path):
            removed.append(Path(path))
        total -= size  # gone either way: deleted here or by someone else
    return removed


def _matching_files(directory: Path, pattern: str):
    """(path, lstat) of regular files under ``directory`` matching ``pattern``; tolerates
    files and directories disappearing during the walk."""
    for root, _dirs, names in os.walk(directory):
        for name in names:
            if not fnmatch.fnmatchcase(name, pattern):
                continue
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield path, st


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
