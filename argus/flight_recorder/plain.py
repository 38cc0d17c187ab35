"""Decode a Flight Recorder dump as plain data only.

A dump is a pickle (or, from ``_dump_fr_trace_json``, JSON) written by another machine's
process: untrusted input. A pickle can name any importable callable and have the loader call
it, so the unpickler here resolves no global at all — dicts, lists, tuples, sets, strings,
bytes, numbers, booleans and None are built by opcodes of their own, and that is all a dump
holds. A dump that names a class or a function is refused, and nothing in it runs.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

from argus.errors import IngestError

__all__ = ["FlightRecorderError", "load_plain", "MAX_DUMP_BYTES"]

#: One rank's dump: 2,000 entries with stack traces are a few MB; past this a file is not a dump.
MAX_DUMP_BYTES = 512 << 20


class FlightRecorderError(IngestError):
    """A Flight Recorder dump that cannot be read as one (names the file and why)."""


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, path: Path):
        super().__init__(io.BytesIO(data))
        self.path = path

    def find_class(self, module: str, name: str) -> Any:  # every global is refused
        raise FlightRecorderError(
            f"{self.path}: refused: the file names a Python object ({module}.{name}) to build; a Flight "
            f"Recorder dump holds only plain data, and nothing from an untrusted file is imported or run")

    def persistent_load(self, pid: Any) -> Any:
        raise FlightRecorderError(f"{self.path}: refused: the file refers to an external object ({pid!r:.60})")


def load_plain(path: Path, max_bytes: int = MAX_DUMP_BYTES) -> Any:
    """The dump at ``path`` as plain Python data (pickle or JSON, told apart by the first byte)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise FlightRecorderError(f"{path}: {size / 2**20:.0f} MiB is more than a dump holds "
                                      f"(limit {max_bytes / 2**20:.0f} MiB)")
        data = path.read_bytes()
    except OSError as exc:
        raise FlightRecorderError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not data.strip():
        raise FlightRecorderError(f"{path}: empty (the rank was killed or stopped before its dump was written)")
    if data.lstrip()[:1] == b"{":
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FlightRecorderError(f"{path}: not valid JSON ({exc})") from None
    try:
        return _PlainUnpickler(data, path).load()
    except FlightRecorderError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            MemoryError, RecursionError) as exc:
        raise FlightRecorderError(f"{path}: not a Flight Recorder dump (cannot decode: {exc or type(exc).__name__})"
                                  ) from None
