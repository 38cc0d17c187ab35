"""What the GPUs' own sensors say while the matrix products burn them: clocks, throttling,
temperature headroom and power, from NVML, for every local GPU.

A GPU that computes slowly is often not broken but held back: a hot one drops its boost clock,
a failing fan or a power brake sets a hardware slowdown. The GEMM rate says *that* it is slow;
these say *why*, and a GPU whose clock or headroom is below its peers' under the same burn fails
like any other measurement (``baseline.judge``: against its own baseline and the other GPUs).
The sampling is the hardware channel's (``processor/hardware.py``: the same guarded NVML calls
and throttle-reason bits), every ``interval_s`` while the burn runs, in a thread.

Per GPU (subject ``gpu:<uuid>``), all higher-is-better:

* ``burn_sm_clock_mhz`` — the median SM clock under load;
* ``burn_clock_share`` — that clock over the GPU's maximum SM clock;
* ``burn_unthrottled_share`` — the share of samples without a thermal or hardware slowdown
  (``SLOWDOWN``: HW slowdown, SW/HW thermal, HW power brake; the power cap a burn meets on a
  healthy GPU is not one);
* ``burn_temp_headroom_c`` — the slowdown temperature threshold minus the hottest sample;
* ``burn_power_w`` — the median power draw (a GPU drawing less under the same burn is capped).

The same samples carry each GPU's PCIe link (:meth:`BurnMonitor.pcie_links`): the generation
and width it ran at while busy (the sampler reads them only then — an idle GPU lowers its link
to save power) beside the maximum NVML says the GPU *and the slot* support, which the node
level reports and judges (``pcie_measurements``: a link trained below its maximum fails).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from argus.healthcheck.model import Level, Measurement, gpu_subject
from argus.processor.hardware import HardwareSampler

__all__ = ["BurnMonitor", "PcieLink", "SLOWDOWN", "merge_links", "pcie_measurements"]

log = logging.getLogger("argus.healthcheck")

#: Clock-event bits that hold a busy GPU back for its health, not its workload: HW slowdown
#: (0x8), SW thermal (0x20), HW thermal (0x40), HW power brake (0x80).
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80
_CLOCK_SM, _THRESHOLD_SLOWDOWN = 1, 1  # NVML_CLOCK_SM, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN


@dataclass(frozen=True)
class PcieLink:
    """One GPU's PCIe link: the best generation and width seen while busy (None: never seen
    busy), and the maxima of the GPU and its slot together (None: not reported)."""

    gen: float | None
    width: float | None
    gen_max: float | None
    width_max: float | None

    def merged(self, other: "PcieLink") -> "PcieLink":
        return PcieLink(*(_top(a, b) for a, b in ((self.gen, other.gen), (self.width, other.width),
                                                   (self.gen_max, other.gen_max), (self.width_max, other.width_max))))


def _top(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def merge_links(*sampled: dict[str, PcieLink]) -> dict[str, PcieLink]:
    """The links seen by several monitors (the burn's, the host copies'), per GPU UUID."""
    out: dict[str, PcieLink] = {}
    for links in sampled:
        for uuid, link in links.items():
            out[uuid] = out[uuid].merged(link) if uuid in out else link
    return out


def pcie_measurements(links: dict[str, PcieLink]) -> list[Measurement]:
    """``pcie_gen`` and ``pcie_width`` per GPU (``Level.NODE``), each expected at its maximum: a
    link trained down (Gen3 on a Gen4 slot, x8 of x16) fails even where every GPU shares it."""
    out = []
    for uuid, link in sorted(links.items()):
        for metric, value, top, unit in (("pcie_gen", link.gen, link.gen_max, "gen"),
                                         ("pcie_width", link.width, link.width_max, "lanes")):
            if value is not None:
                out.append(Measurement(Level.NODE, metric, gpu_subject(uuid), value, unit, expected=top))
    return out


class _Rounds(HardwareSampler):
    """The hardware channel's sampler, its rounds kept here instead of queued to a processor."""

    def __init__(self, interval_s: float, nvml: Any):
        super().__init__(interval_s=interval_s, nvml=nvml)
        self.kept: list[list[tuple[str, int, list[tuple[str, float]]]]] = []

    def put(self, payload: Any) -> bool:
        self.kept.append(payload[2])
        return True


class BurnMonitor:
    """``with BurnMonitor(): burn()`` then :meth:`measurements`; ``off`` says why nothing was read."""

    def __init__(self, interval_s: float = 0.1, nvml: Any = None):
        self._rounds = _Rounds(interval_s, nvml)
        self.off: str | None = None
        self._limits: dict[str, tuple[float | None, float | None]] = {}  # uuid → (max SM MHz, slowdown °C)

    def __enter__(self) -> "BurnMonitor":
        r = self._rounds
        r.start()
        if not r.enabled:
            self.off = r._off_reason or "NVML unavailable"
            return self
        for _, uuid, handle in r.gpus:
            self._limits[uuid] = (self._once(r.nvml, "nvmlDeviceGetMaxClockInfo", handle,
                                             getattr(r.nvml, "NVML_CLOCK_SM", _CLOCK_SM)),
                                  self._once(r.nvml, "nvmlDeviceGetTemperatureThreshold", handle,
                                             getattr(r.nvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
                                                     _THRESHOLD_SLOWDOWN)))
        return self

    def __exit__(self, *exc: object) -> None:
        r = self._rounds
        if r.enabled:
            r.put(("hw", 0, r.sample_once()))  # the burn's last moment, however short it was
            r.close()

    @staticmethod
    def _once(nvml: Any, fn: str, *args: Any) -> float | None:
        try:
            return float(getattr(nvml, fn)(*args))
        except Exception:  # noqa: BLE001 - not supported on this GPU or driver: that figure is absent
            return None

    def _series(self) -> dict[str, dict[str, list[float]]]:
        """uuid → metric → its samples, in time order."""
        series: dict[str, dict[str, list[float]]] = {}
        for rnd in self._rounds.kept:
            for uuid, _, metrics in rnd:
                per = series.setdefault(uuid, {})
                for name, value in metrics:
                    per.setdefault(name, []).append(value)
        return series

    def pcie_links(self) -> dict[str, PcieLink]:
        """Each GPU's PCIe link as sampled: the best seen while busy, against its maxima."""
        def top(per: dict[str, list[float]], metric: str) -> float | None:
            return max(per[metric]) if per.get(metric) else None

        return {uuid: PcieLink(top(per, "pcie_gen"), top(per, "pcie_width"), top(per, "pcie_gen_max"),
                               top(per, "pcie_width_max")) for uuid, per in self._series().items()}

    def measurements(self) -> list[Measurement]:
        """The burn's figures per GPU (``Level.GPU``); the PCIe links are :meth:`pcie_links`."""
        out = []
        for uuid, per in sorted(self._series().items()):
            subject = gpu_subject(uuid)
            max_mhz, slow_c = self._limits.get(uuid, (None, None))

            def add(metric: str, value: float, unit: str) -> None:
                out.append(Measurement(Level.GPU, metric, subject, float(value), unit))  # noqa: B023 - called in this iteration

            clocks = per.get("sm_clock_mhz", [])
            if clocks:
                add("burn_sm_clock_mhz", float(np.median(clocks)), "MHz")
                if max_mhz:
                    add("burn_clock_share", float(np.median(clocks)) / max_mhz, "of max")
            reasons = per.get("throttle_reasons", [])
            if reasons:
                add("burn_unthrottled_share", float(np.mean([not int(v) & SLOWDOWN for v in reasons])), "of samples")
            temps = per.get("temperature_c", [])
            if temps and slow_c:
                add("burn_temp_headroom_c", slow_c - max(temps), "°C")
            power = per.get("power_w", [])
            if power:
                add("burn_power_w", float(np.median(power)), "W")
        return out
