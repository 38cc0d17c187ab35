"""Independent evidence outside the timing data: hardware telemetry (a PCIe link below its
maximum generation or width, NIC ports reported down, thermal throttling, link error counters
that climb) and the host's own pressure (CPU, I/O). CPU stacks are L5 (``l5_stacks``),
re-exported here for the callers that read both."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus.analysis.frames import encode
from argus.analysis.l5_stacks import CAUSE_WORDS, StackCause, stack_cause
from argus.store import Attempt
from argus.uniques import sorted_unique

__all__ = ["HwSignals", "load_hw_signals", "StackCause", "stack_cause", "CAUSE_WORDS", "LINK_ERROR_METRICS",
           "PRESSURE_PCT"]

#: Counters whose increase over a sample's interval is a link's own error (host counters and NVML)
LINK_ERROR_METRICS = ("ib_link_errors", "ib_link_downed", "nvlink_errors", "nvlink_down")
#: A host's CPUs (some task waiting: PSI, or time stolen / spent on softirq) or storage (PSI I/O,
#: iowait) are under pressure from this share (%) of a sample's interval
PRESSURE_PCT = 20.0
_CPU_PRESSURE = ("psi_cpu_some", "cpu_steal_pct", "cpu_softirq_pct")
_IO_PRESSURE = ("psi_io_some", "cpu_iowait_pct")

@dataclass
class HwSignals:
    pcie_degraded: dict[int, tuple[float, float]] = field(default_factory=dict)  # rank → (gen, width) at worst
    nic_down: dict[int, list[int]] = field(default_factory=dict)  # rank → steps (sample index) with port down
    thermal: dict[int, float] = field(default_factory=dict)  # rank → max temperature when throttled
    pcie_steps: dict[int, list[int]] = field(default_factory=dict)  # rank → steps (sample index) below its max
    link_errors: dict[int, dict[int, float]] = field(default_factory=dict)  # rank → step → link errors counted
    cpu_pressure: dict[int, dict[int, float]] = field(default_factory=dict)  # rank → step → worst % (host's)
    io_pressure: dict[int, dict[int, float]] = field(default_factory=dict)  # rank → step → worst % (host's)

    @property
    def empty(self) -> bool:
        return not (self.pcie_degraded or self.nic_down or self.thermal or self.link_errors)


def load_hw_signals(attempt: Attempt, step_of_ts=None) -> HwSignals:
    t = attempt.read("hw", columns=["rank", "ts_ns", "metric", "value"])
    out = HwSignals()
    if t.num_rows == 0:
        return out
    rank = t.column("rank").to_numpy()
    # the metric names as codes: an object array of 1.8 M strings (10,240 ranks) was a
    # second to build and compare
    codes, vocab = encode(t.column("metric").fill_null(""))
    value = t.column("value").to_numpy()
    ts = t.column("ts_ns").to_numpy()

    def named(*names: str) -> np.ndarray:
        return np.isin(codes, [i for i, v in enumerate(vocab) if v in names])

    def per_rank(name: str, reducer) -> dict[int, float]:
        m = named(name)
        if not m.any():
            return {}
        r, v = rank[m].astype(np.int64), value[m]
        out_v = np.full(int(r.max()) + 1, np.inf if reducer is np.min else -np.inf)
        (np.minimum if reducer is np.min else np.maximum).at(out_v, r, v)
        present = sorted_unique(r)
        return dict(zip(present.tolist(), out_v[present].tolist()))

    gen, gen_max = per_rank("pcie_gen", np.min), per_rank("pcie_gen_max", np.max)
    width, width_max = per_rank("pcie_width", np.min), per_rank("pcie_width_max", np.max)
    for r in set(gen) | set(width):
        g, gm = gen.get(r, np.nan), gen_max.get(r, np.nan)
        w, wm = width.get(r, np.nan), width_max.get(r, np.nan)
        if (g < gm) or (w < wm):
            out.pcie_degraded[r] = (g, w)
    # when: the samples below the rank's maximum (a link trains down at boot or on a bus
    # error, and stays so; the steps it covers are no clean baseline for the job)
    for r in out.pcie_degraded:
        low = (named("pcie_gen") & (value < gen_max.get(r, np.inf))) | \
              (named("pcie_width") & (value < width_max.get(r, np.inf)))
        tss = ts[low & (rank == r)]
        out.pcie_steps[r] = sorted({int(step_of_ts(r, int(x))) if step_of_ts else int(x) for x in tss})
    m = named("nic_port_up") & (value < 0.5)
    for r in sorted_unique(rank[m]):
        tss = ts[m & (rank == r)]
        out.nic_down[int(r)] = [int(step_of_ts(int(r), int(x))) if step_of_ts else int(x) for x in tss]
    def per_step(names: tuple[str, ...], keep) -> dict[int, dict[int, float]]:
        """rank → step → the largest of ``names`` in that step's samples, where ``keep`` holds."""
        got: dict[int, dict[int, float]] = {}
        m = named(*names)
        for r, x, v in zip(rank[m].tolist(), ts[m].tolist(), value[m].tolist()):
            if keep(v):
                step = int(step_of_ts(int(r), int(x))) if step_of_ts else int(x)
                by = got.setdefault(int(r), {})
                by[step] = max(by.get(step, 0.0), float(v))
        return got

    out.link_errors = per_step(LINK_ERROR_METRICS, lambda v: v > 0)
    out.cpu_pressure = per_step(_CPU_PRESSURE, lambda v: v >= 0)
    out.io_pressure = per_step(_IO_PRESSURE, lambda v: v >= 0)
    thr = per_rank("throttle_reasons", np.max)
    temp = per_rank("temperature_c", np.max)
    for r, v in thr.items():
        if v > 0 and temp.get(r, 0) >= 80:
            out.thermal[r] = temp[r]
    return out
