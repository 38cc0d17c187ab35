"""How busy the node was with work other than the check itself, while the check ran.

A figure below its baseline while another process held the node's CPUs says the node is busy,
not that a device is slow: such a deficit is reported as the node's state (``Status.LOADED``)
rather than failed. The meter reads the machine's busy CPU time (``/proc/stat``) and this
process's own, with its waited-for children (the net level's ranks): the rest was the others'.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["LOADED_SHARE", "LoadMeter", "NodeLoad"]

#: Other processes using this share of the node's CPU capacity during the check make a
#: deficit the node's state: one process spinning on a core of a 2-core machine is 0.5; an idle
#: machine's kernel and daemons a few hundredths
LOADED_SHARE = 0.15


@dataclass(frozen=True)
class NodeLoad:
    others_share: float  # of the node's CPU capacity (all its CPUs × the wall time), not this check's
    seconds: float
    cpus: int

    @property
    def loaded(self) -> bool:
        return self.others_share >= LOADED_SHARE

    def to_json(self) -> dict:
        return {"others_cpu_share": round(self.others_share, 3), "seconds": round(self.seconds, 2),
                "cpus": self.cpus, "loaded": self.loaded}


def _busy_s(stat: str = "/proc/stat") -> float | None:
    """Seconds every CPU spent busy since boot: user, nice, system, irq, softirq, steal (not
    idle or iowait); None where the file is not there (not Linux)."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [int(x) for x in fields[1:9]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMeter:
    """``with LoadMeter() as m: …`` then ``m.result()`` (None where the machine does not say)."""

    def __init__(self, stat: str = "/proc/stat"):
        self.stat = stat
        self._t0 = self._busy0 = self._own0 = 0.0
        self._end: tuple[float, float | None, float] | None = None

    def __enter__(self) -> "LoadMeter":
        self._t0, self._busy0, self._own0 = time.monotonic(), _busy_s(self.stat) or 0.0, _own_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = (time.monotonic(), _busy_s(self.stat), _own_s())

    def result(self) -> NodeLoad | None:
        if self._end is None or self._end[1] is None:
            return None
        t1, busy1, own1 = self._end
        assert busy1 is not None
        wall, cpus = max(t1 - self._t0, 1e-9), os.cpu_count() or 1
        others = max((busy1 - self._busy0) - (own1 - self._own0), 0.0)
        return NodeLoad(min(others / (wall * cpus), 1.0), wall, cpus)


def mark_loaded(verdicts: list, load: NodeLoad | None) -> list:
    """Failed verdicts as the node's state where others loaded the node: a deficit against the
    baseline or the peers then says the node is busy. A figure under the hardware's stated
    maximum (a PCIe link trained down) fails whatever the load."""
    from dataclasses import replace

    from argus.healthcheck.model import Status

    if load is None or not load.loaded:
        return verdicts
    out = []
    for v in verdicts:
        if v.status == Status.FAIL and "hardware's maximum" not in v.why:
            v = replace(v, status=Status.LOADED, why=f"{v.why}; not judged: other processes used "
                                                      f"{load.others_share:.0%} of the node's CPUs during the check")
        out.append(v)
    return out
