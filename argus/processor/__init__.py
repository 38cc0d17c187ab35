"""The per-host processor: wire protocol, client, windowing, and the daemon that writes the store.

Names resolve lazily: a training process imports the client and protocol (numpy only), never
the daemon and its store dependencies (pyarrow, DuckDB) — tens of MB of memory per rank.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"Processor": "daemon", "ProcessorConfig": "daemon", "HangConfig": "hangs",
          "WindowData": "window",
          "WindowStats": "window", "WindowWriter": "window"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"argus.processor.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'argus.processor' has no attribute {name!r}")
