"""What values a Kineto trace may hold, and the counted record of what was left out.

Each limit keeps an imported value inside what the store's columns and the analysis can hold
without wrapping (an int64 of ns, an int32 stream) and inside what a real job can produce, so a
hand-edited, corrupted or hostile file cannot smuggle in ``INT64_MIN`` timestamps, negative
durations, rank ``-1`` or step 2⁶³. A bad value drops its event (counted by kind, field and
reason, with the first event's index) or, for file-level fields, is ignored with a note; it is
never stored. ``bool`` is never taken for a number (``true`` is not rank 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_TS_US", "MAX_DUR_US", "MAX_BASE_NS", "MAX_STEP", "MAX_WORLD_SIZE", "MAX_INT32", "MAX_NAME_CHARS", "MAX_HOSTNAME",
           "Rejects", "as_count", "as_time_us", "as_dur_us", "as_rank", "as_world_size", "as_base_ns", "as_hostname"]

#: Latest event start, µs (≈ year 2065 as a Unix time; 95 years as a time since the trace's base).
#: With :data:`MAX_DUR_US` and :data:`MAX_BASE_NS` every end in ns stays below 6.1e18 < 2⁶³.
MAX_TS_US = 3_000_000_000_000_000
#: Longest event, µs (11.6 days): a profiler captures seconds to minutes; anything longer is corrupt.
MAX_DUR_US = 1_000_000_000_000
#: Largest ``baseTimeNanoseconds`` (≈ year 2065 as a Unix time in ns).
MAX_BASE_NS = 3_000_000_000_000_000_000
#: Highest ``ProfilerStep#N``: a billion steps is 11 days at 1 ms a step, 31 years at one a second,
#: beyond any run; it keeps window and step arithmetic far from int64 overflow.
MAX_STEP = 1_000_000_000
#: Largest world size (and rank + 1): 2²⁰, ten times the largest jobs run today (~100k GPUs). The
#: importer builds per-rank arrays of this length (≈100 bytes a rank: ~100 MB at the limit).
MAX_WORLD_SIZE = 1 << 20
#: Streams, devices and microbatches are stored as int32.
MAX_INT32 = (1 << 31) - 1
#: Longest kernel or annotation name kept (characters): templated CUDA kernel names reach ~10 KB;
#: a name is stored with every row, so longer ones (corrupt or hostile) drop their event.
MAX_NAME_CHARS = 1 << 16
#: Longest host name kept (DNS names are at most 253 characters).
MAX_HOSTNAME = 253


def as_count(value: Any, hi: int = MAX_INT32) -> int | None:
    """A non-negative int up to ``hi``; None for anything else (bools, floats, strings, out of range)."""
    return value if type(value) is int and 0 <= value <= hi else None


def as_time_us(value: Any) -> float | None:
    """A finite start time in µs within ``[0, MAX_TS_US]``; None otherwise (NaN fails both bounds)."""
    t = type(value)
    if (t is int or t is float) and 0 <= value <= MAX_TS_US:
        return float(value)
    return None


def as_dur_us(value: Any) -> float | None:
    """A duration in µs within ``[0, MAX_DUR_US]``; a missing one is 0."""
    if value is None:
        return 0.0
    t = type(value)
    if (t is int or t is float) and 0 <= value <= MAX_DUR_US:
        return float(value)
    return None


def as_rank(value: Any) -> int | None:
    return as_count(value, MAX_WORLD_SIZE - 1)


def as_world_size(value: Any) -> int | None:
    size = as_count(value, MAX_WORLD_SIZE)
    return size if size else None


def as_base_ns(value: Any) -> int | None:
    """``baseTimeNanoseconds``: an int (or integral float) within ``[0, MAX_BASE_NS]``."""
    if type(value) is float and math.isfinite(value) and value.is_integer():
        value = int(value)
    return as_count(value, MAX_BASE_NS)


def as_hostname(value: Any) -> str | None:
    if type(value) is str and 0 < len(value) <= MAX_HOSTNAME and value.isprintable():
        return value
    return None


@dataclass
class Rejects:
    """Events left out (or a field of theirs ignored) for a bad value, by ``"kind|field|reason"``,
    with the index in ``traceEvents`` of the first such event so a reader can find it."""

    counts: dict[str, int] = field(default_factory=dict)
    first_event: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, event_index: int) -> None:
        n = self.counts.get(what)
        if n is None:
            self.counts[what] = 1
            self.first_event[what] = event_index
        else:
            self.counts[what] = n + 1

    def __bool__(self) -> bool:
        return bool(self.counts)

    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        """One line per reason: ``3 kernel events: dur negative, …: dropped (first: traceEvents[12])``."""
        out = []
        for what, n in sorted(self.counts.items()):
            kind, fld, reason = what.split("|", 2)
            noun = "event" if kind == "any" else f"{kind} event"
            out.append(f"{n:,} {noun}{'s' * (n != 1)}: {fld} {reason} (first: traceEvents[{self.first_event[what]}])")
        return out

    def to_json(self) -> dict[str, dict[str, int]]:
        return {what.replace("|", " ", 2): {"events": n, "first_event": self.first_event[what]}
                for what, n in sorted(self.counts.items())}
