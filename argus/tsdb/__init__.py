"""The cluster data plane: Prometheus remote write out of the processor, PromQL back in.

* ``remote_write`` — ``prompb.WriteRequest`` encoding (numpy) and snappy;
* ``series`` — what a closed window becomes: series names, labels, timestamps;
* ``sink`` — the processor's background sender: bounded queue, retries, drop counters;
* ``promql`` — a small Prometheus HTTP API client (Prometheus, VictoriaMetrics, Mimir…);
* ``readback`` — ``prom://HOST:PORT?job=…`` → an embedded store the analysis runs on.

Names resolve lazily, so importing the package costs nothing until a part is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {"encode_write_request": "remote_write", "encode_labels": "remote_write", "compress": "remote_write",
          "WindowJob": "series", "SeriesBatch": "series", "build_window_series": "series", "METRICS": "series",
          "RemoteWriteConfig": "sink", "RemoteWriteSink": "sink", "DROP_REASONS": "sink",
          "PromClient": "promql", "PromUrl": "promql", "parse_prom_url": "promql",
          "materialize": "readback", "open_attempt": "readback", "is_prom_url": "promql"}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"argus.tsdb.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'argus.tsdb' has no attribute {name!r}")
