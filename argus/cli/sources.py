"""Where a command's store comes from: a directory, object storage, or a Prometheus-compatible TSDB."""

from __future__ import annotations

from pathlib import Path

from argus.store import Attempt

__all__ = ["open_source_attempt", "store_root", "SOURCE_HELP"]

SOURCE_HELP = ("store directory, s3://bucket/prefix (pulled into a local cache) or prom://HOST:PORT?job=NAME[&run=ID] "
               "(a Prometheus-compatible TSDB, see docs/tsdb.md)")


def open_source_attempt(source: str, run: str | None = None, attempt: str | None = None) -> Attempt:
    """The attempt of ``source``: s3:// is pulled into a local cache, prom:// materialised into a
    temporary store (removed at exit), a directory opened as it is."""
    if source.startswith("s3://"):
        from argus.objstore import local_copy

        source = str(local_copy(source))
    from argus.tsdb import open_attempt

    return open_attempt(source, run, attempt)


def store_root(attempt: Attempt) -> Path:
    """The store directory holding ``attempt`` (``<root>/runs/<run>/<attempt>``)."""
    return Path(attempt.path).parents[2]
