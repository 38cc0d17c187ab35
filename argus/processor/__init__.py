"""The per-host processor: the daemon that drains its ranks' rings and sockets, windows,
compresses and writes the store, and watches for hangs. The wire it speaks is ``argus.wire``;
the window pipeline it shares with the offline importers is ``argus.ingest`` (into
``argus.store.WindowWriter``).

Names resolve lazily: importing this package loads neither the daemon nor its store
dependencies (pyarrow, DuckDB).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"Processor": "daemon", "ProcessorConfig": "config", "HangConfig": "hangs", "ProcessorStatus": "status",
          "read_status": "status", "status_path": "status"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"argus.processor.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'argus.processor' has no attribute {name!r}")
