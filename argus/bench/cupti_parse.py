"""``argus bench cupti``: the cost of one CUPTI activity buffer on CUPTI's thread.

CUPTI hands completed buffers to a callback on its own thread; cupti-python has already turned
them into record objects, and Argus's callback turns those into kernel rows while holding the GIL
(the training thread waits for it meanwhile). This times that callback on synthetic records with
cupti-python's field names (a real kernel mix's shape: a few dozen distinct kernel names, some
memcpy and memset), both ways side by side in one run: the per-record loop Argus used before
(branch per record, demangle and name lookup per record, a row tuple) and
:meth:`argus.producer.cupti.CuptiSource.rows`. No GPU is needed; what is measured is Python.
"""

from __future__ import annotations

import enum
import json
import sys
import time
import types
from typing import Any

import numpy as np

__all__ = ["run"]


class _Kind(enum.IntEnum):  # cupti-python's values
    MEMCPY = 1
    MEMSET = 2
    KERNEL = 3
    CONCURRENT_KERNEL = 10


class _MemcpyKind(enum.IntEnum):
    HTOD = 1
    DTOH = 2
    DTOD = 8


class _Cupti:
    ActivityKind = _Kind
    ActivityMemcpyKind = _MemcpyKind


class _Names:
    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def name_id(self, name: str) -> int:
        return self.ids.setdefault(name, len(self.ids))


def _records(n: int, distinct: int, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    names = [f"_ZN2at6native{len(str(i)) + 7}kernel_{i}ILi4EEEviT0_" for i in range(distinct)]
    out = []
    t = 0
    for _ in range(n):
        t += int(rng.integers(2_000, 20_000))
        r = rng.random()
        if r < 0.9:
            out.append(types.SimpleNamespace(kind=_Kind.CONCURRENT_KERNEL, start=t, end=t + 1_500,
                                             stream_id=7, device_id=0, name=names[int(rng.integers(distinct))]))
        elif r < 0.97:
            out.append(types.SimpleNamespace(kind=_Kind.MEMCPY, start=t, end=t + 800, stream_id=7, device_id=0,
                                             copy_kind=int(_MemcpyKind.HTOD)))
        else:
            out.append(types.SimpleNamespace(kind=_Kind.MEMSET, start=t, end=t + 100, stream_id=7, device_id=0))
    return out


def _per_record(activities: list, name_id: Any, offset: int) -> np.ndarray:
    """The callback as it was: one branch ladder, demangle lookup, name lookup and tuple per record."""
    from argus.producer.cupti import demangle
    from argus.producer.recorder import KIND
    from argus.vocab import KernelKind
    from argus.wire import DTYPES, Msg

    rows = []
    for a in activities:
        if a.kind in (_Kind.CONCURRENT_KERNEL, _Kind.KERNEL):
            name, kind = demangle(str(a.name)), KIND[KernelKind.KERNEL]
        elif a.kind == _Kind.MEMCPY:
            name, kind = f"Memcpy {_MemcpyKind(a.copy_kind).name}", KIND[KernelKind.MEMCPY]
        elif a.kind == _Kind.MEMSET:
            name, kind = "Memset", KIND[KernelKind.MEMSET]
        else:
            continue
        rows.append((-1, int(a.start) + offset, int(a.end - a.start), name_id(name),
                     int(a.stream_id), int(a.device_id), kind))
    return np.array(rows, dtype=DTYPES[Msg.KERNELS])


def run(records: int = 50_000, distinct: int = 40, repeats: int = 5, seed: int = 0) -> dict:
    """Median µs per record of each way over ``repeats`` interleaved rounds, and their ratio."""
    from argus.producer.cupti import CuptiSource  # not at import: ``argus --help`` stays light

    acts = _records(records, distinct, seed)
    names = _Names()
    src = CuptiSource(names, cupti_module=_Cupti(), other_profiler=lambda: False)  # type: ignore[arg-type]
    a, b = _per_record(acts, names.name_id, 0), src.rows(acts)
    if not (np.array_equal(a, b)):
        raise AssertionError("the two parses disagree")
    old: list[float] = []
    new: list[float] = []
    for _ in range(repeats):
        for fn, into in ((lambda: _per_record(acts, names.name_id, 0), old), (lambda: src.rows(acts), new)):
            t0 = time.perf_counter()
            fn()
            into.append(time.perf_counter() - t0)
    per = 1e6 / records
    old_us, new_us = float(np.median(old)) * per, float(np.median(new)) * per
    return {"bench": "cupti", "records": records, "distinct_names": distinct, "repeats": repeats,
            "per_record_us": round(old_us, 3), "vectorised_us": round(new_us, 3),
            "speedup": round(old_us / new_us, 2),
            "gil_ms_per_1e5_kernels": {"per_record": round(old_us * 100, 1), "vectorised": round(new_us * 100, 1)}}


def add_arguments(p: Any) -> None:
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--distinct", type=int, default=40, help="distinct kernel names in the mix")
    p.add_argument("--repeats", type=int, default=5)


def run_args(args: Any) -> int:
    if args.records < 1 or args.distinct < 1 or args.repeats < 1:
        print("argus bench cupti: --records, --distinct and --repeats must be ≥ 1", file=sys.stderr)
        return 2
    print(json.dumps(run(args.records, args.distinct, args.repeats)))
    return 0
