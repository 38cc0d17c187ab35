"""Synthetic hardware telemetry (what NVML would report), one sample per GPU per step.

Healthy GPUs report a Gen5 x16 PCIe link, boost clocks and normal temperatures with a
little noise; a scenario's :class:`~argus.sim.faults.HwOverride` entries change what the
culprit GPUs report (e.g. a link that trained down to Gen3 x4).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from argus.sim.faults import FaultPlan
from argus.topology import Topology

__all__ = ["step_samples", "HEALTHY"]

#: metric → (healthy value, noise sigma)
HEALTHY: dict[str, tuple[float, float]] = {
    "sm_clock_mhz": (1980.0, 5.0),
    "temperature_c": (66.0, 2.0),
    "power_w": (640.0, 20.0),
    "pcie_gen": (5.0, 0.0),
    "pcie_width": (16.0, 0.0),
    "pcie_gen_max": (5.0, 0.0),
    "pcie_width_max": (16.0, 0.0),
    "throttle_reasons": (0.0, 0.0),
    "nic_port_up": (1.0, 0.0),
}


def step_samples(*, step: int, start: np.ndarray, topology: Topology, faults: FaultPlan,
                 rng: np.random.Generator, to_ns: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> pa.Table:
    """Samples at the start of ``step`` for every rank that started it."""
    ranks = np.flatnonzero(np.isfinite(start))
    n, names = ranks.size, list(HEALTHY)
    values = np.empty((len(names), topology.world_size))
    for i, (mean, sigma) in enumerate(HEALTHY.values()):
        values[i] = mean + (rng.standard_normal(topology.world_size) * sigma if sigma else 0.0)
    for override_ranks, metric, value in faults.hw_at(step):
        values[names.index(metric), list(override_ranks)] = value
    ts = to_ns(ranks, start[ranks])
    return pa.table({
        "rank": pa.array(np.tile(ranks, len(names)), pa.int32()),
        "gpu_uuid": pa.array(np.tile(topology.gpu_uuids[ranks].astype(object), len(names)), pa.string()),
        "ts_ns": np.tile(ts, len(names)),
        "metric": pa.array(np.repeat(np.array(names, dtype=object), n), pa.string()),
        "value": values[:, ranks].ravel(),
    })
