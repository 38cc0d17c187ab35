"""The hardware channel: per-GPU telemetry from NVML, stored as ``hw`` rows of the ranks using them.

Every ``interval_s`` (default 5 s) one thread reads, per local GPU:

====================  ==================================================================
metric                NVML call (unit)
====================  ==================================================================
``pcie_gen``          ``nvmlDeviceGetCurrPcieLinkGeneration``; not while the GPU is idle
``pcie_width``        ``nvmlDeviceGetCurrPcieLinkWidth`` (lanes); not while idle
``pcie_gen_max``      ``nvmlDeviceGetMaxPcieLinkGeneration`` (device and system)
``pcie_width_max``    ``nvmlDeviceGetMaxPcieLinkWidth``
``sm_clock_mhz``      ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``
``throttle_reasons``  ``nvmlDeviceGetCurrentClocksEventReasons`` (or the older
                      ``…ThrottleReasons``) bit mask, without the bits that are not a
                      slowdown (GPU idle, application clocks, display clock: ``BENIGN``)
``temperature_c``     ``nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)``
``power_w``           ``nvmlDeviceGetPowerUsage`` (mW → W)
``ecc_errors``        ``nvmlDeviceGetTotalEccErrors``: volatile *uncorrected* count
``ecc_corrected``     the volatile corrected count
``xid``               one row per XID critical-error event, value = the XID code
``nvlink_errors``     increase over the interval of ``nvmlDeviceGetNvLinkErrorCounter``
                      (DL replay, recovery, CRC flit and data) summed over the GPU's links
``nvlink_down``       links of the GPU that were active earlier in this run and are not
                      (``nvmlDeviceGetNvLinkState``)
====================  ==================================================================

Per NVLink ``L`` as well: ``nvlink_errors:L`` (that link's increase) and ``nvlink_down:L`` (1
while it is down), written only in rounds where they are not zero: 18 links of 8 GPUs would
otherwise be 288 rows a round to say nothing.

An idle GPU lowers its PCIe link generation to save power, which would read as a degraded
link (``argus/analysis/signals.py`` compares the minimum generation with the maximum), so the
current generation and width are only recorded when the idle bit is clear. XIDs come from an
NVML event set registered for ``nvmlEventTypeXidCriticalError`` and polled with a 0 ms
timeout each round (never blocks; ``NVML_ERROR_TIMEOUT`` just means no event).

Every NVML call is guarded: a metric the GPU does not support (``NVML_ERROR_NOT_SUPPORTED``)
is skipped from then on, any other error skips it for that round. Without NVML (no driver,
no ``nvidia-ml-py``) the channel is off with one log line. The samples reach the daemon's
loop through the samplers' queue and are given to the local rank whose HELLO ``gpu_uuid``
is the GPU's UUID, else (UUID not said) to the rank whose ``local_rank`` is the device index.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable


from argus.processor.samplers import Output, RankHandle, Sampler, hw_output

__all__ = ["BENIGN", "HardwareSampler"]

log = logging.getLogger("argus.processor")

#: Throttle/event-reason bits that are not a slowdown: GpuIdle, ApplicationsClocksSetting, DisplayClockSetting.
BENIGN = 0x1 | 0x2 | 0x100
_IDLE = 0x1
_NOT_SUPPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
_MAX_XID_PER_ROUND = 64

# (metric, pynvml function, (constant name, default) arguments after the handle, scale)
_SIMPLE = (
    ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", (), 1.0),
    ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", (), 1.0),
    ("sm_clock_mhz", "nvmlDeviceGetClockInfo", (("NVML_CLOCK_SM", 1),), 1.0),
    ("temperature_c", "nvmlDeviceGetTemperature", (("NVML_TEMPERATURE_GPU", 0),), 1.0),
    ("power_w", "nvmlDeviceGetPowerUsage", (), 1e-3),
    ("ecc_errors", "nvmlDeviceGetTotalEccErrors",
     (("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), ("NVML_VOLATILE_ECC", 0)), 1.0),
    ("ecc_corrected", "nvmlDeviceGetTotalEccErrors",
     (("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), ("NVML_VOLATILE_ECC", 0)), 1.0),
)
_LINK = (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"), ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"))
_REASONS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
_NVLINK_COUNTERS = (0, 1, 2, 3)  # NVML_NVLINK_ERROR_DL_REPLAY, _DL_RECOVERY, _DL_CRC_FLIT, _DL_CRC_DATA


class HardwareSampler(Sampler):
    """NVML telemetry of this host's GPUs. ``nvml`` is the ``pynvml`` module (tests pass a stand-in)."""

    name = "hardware"

    def __init__(self, *, interval_s: float = 5.0, nvml: Any = None):
        super().__init__()
        self.interval_s = interval_s
        self.nvml = nvml
        self.enabled = False
        self.gpus: list[tuple[int, str, Any]] = []  # (index, uuid, handle)
        self._events: Any = None
        self._unsupported: set[tuple[int, str]] = set()
        self._logged: set[tuple[int, str, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = self.errors = self.dropped = self.unmapped = 0
        self._off_reason = ""
        self._nvlinks: dict[int, list[int]] = {}  # GPU index → its links (found on the first round)
        self._nvlink_up: dict[int, set[int]] = {}  # … the links seen active
        self._nvlink_errors: dict[tuple[int, int], int] = {}  # (GPU index, link) → its error counters' last sum

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        nvml = self.nvml
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]  # the real library where no fake was given
            except ImportError:
                self._off("nvidia-ml-py is not installed")
                return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._off(f"NVML unavailable ({type(exc).__name__}: {exc})")
            return
        self.nvml = nvml
        try:
            for index in range(int(nvml.nvmlDeviceGetCount())):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                self.gpus.append((index, _text(nvml.nvmlDeviceGetUUID(handle)), handle))
        except Exception as exc:  # noqa: BLE001 - NVML raises its own error classes: any failure is logged, sampling goes on
            self._shutdown_nvml()
            self._off(f"cannot enumerate GPUs through NVML ({exc})")
            return
        if not self.gpus:
            self._shutdown_nvml()
            self._off("NVML sees no GPU")
            return
        self._register_xid()
        self.enabled = True
        log.info("hardware telemetry on: %d GPUs every %g s", len(self.gpus), self.interval_s)
        self._thread = threading.Thread(target=self._loop, name="argus-hardware", daemon=True)
        self._thread.start()

    def _off(self, why: str) -> None:
        self._off_reason = why
        log.info("hardware telemetry off: %s", why)

    def _register_xid(self) -> None:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except Exception as exc:  # noqa: BLE001 - NVML raises its own error classes: any failure is logged, sampling goes on
            log.debug("no XID events: %s", exc)
            return
        kind = getattr(nvml, "nvmlEventTypeXidCriticalError", 8)
        registered = 0
        for index, _, handle in self.gpus:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, kind, events)
                registered += 1
            except Exception as exc:  # noqa: BLE001 - not supported on this GPU, or not permitted
                log.debug("no XID events for GPU %d: %s", index, exc)
        if registered:
            self._events = events
        else:
            self._guard(lambda: nvml.nvmlEventSetFree(events))

    def close(self) -> list[Output]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        if self.enabled:
            self.enabled = False
            if self._events is not None:
                self._guard(lambda: self.nvml.nvmlEventSetFree(self._events))
                self._events = None
            self._shutdown_nvml()
        return []

    def _shutdown_nvml(self) -> None:
        self._guard(self.nvml.nvmlShutdown)

    @staticmethod
    def _guard(fn) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - teardown of a library we are done with: nothing to do about it
            pass

    def _loop(self) -> None:
        while True:
            ts = time.time_ns()
            if not self.put(("hw", ts, self.sample_once())):
                self.dropped += 1
            if self._stop.wait(self.interval_s):
                return

    # -- sampling (thread) -------------------------------------------------------------------
    def sample_once(self) -> list[tuple[str, int, list[tuple[str, float]]]]:
        """One round over every GPU: ``[(uuid, index, [(metric, value), …]), …]``."""
        self.rounds += 1
        nvml = self.nvml
        out = []
        for index, uuid, handle in self.gpus:
            metrics: list[tuple[str, float]] = []
            for metric, fn, args, scale in _SIMPLE:
                value = self._call(index, metric, fn, handle, *(getattr(nvml, c, d) for c, d in args))
                if value is not None:
                    metrics.append((metric, float(value) * scale))
            reasons = None
            for fn in _REASONS:  # the newer name first; an old driver lacks it (FUNCTION_NOT_FOUND)
                reasons = self._call(index, fn, fn, handle)
                if reasons is not None:
                    break
            if reasons is not None:
                metrics.append(("throttle_reasons", float(int(reasons) & ~BENIGN)))
            if reasons is None or not int(reasons) & _IDLE:
                for metric, fn in _LINK:
                    value = self._call(index, metric, fn, handle)
                    if value is not None:
                        metrics.append((metric, float(value)))
            metrics += self._nvlink(index, handle)
            out.append((uuid, index, metrics))
        by_uuid = {uuid: metrics for uuid, _, metrics in out}
        for uuid, xid in self._poll_xid():
            if uuid in by_uuid:
                by_uuid[uuid].append(("xid", float(xid)))
        return out

    def _nvlink(self, index: int, handle: Any) -> list[tuple[str, float]]:
        """The GPU's NVLink errors since the last round and its links gone down. The links are
        found once: a GPU without NVLink answers NOT_SUPPORTED, one past its last link
        INVALID_ARGUMENT, and neither is asked again."""
        nvml = self.nvml
        if index not in self._nvlinks:
            links = []
            for link in range(_NVLINK_MAX_LINKS):
                try:
                    nvml.nvmlDeviceGetNvLinkState(handle, link)
                    links.append(link)
                except Exception:  # noqa: BLE001 - absent link, no NVLink, old NVML: not this GPU's
                    continue
            self._nvlinks[index] = links
        links = self._nvlinks[index]
        if not links:
            return []
        active: set[int] = set()
        grew: dict[int, int] = {}  # link → its errors since the last round (links read before only)
        for link in links:
            try:
                if int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == 1:  # NVML_FEATURE_ENABLED
                    active.add(link)
            except Exception:  # noqa: BLE001 - a link that stops answering is not active
                pass
            total, read = 0, False
            for counter in _NVLINK_COUNTERS:
                try:
                    total += int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter))
                    read = True
                except Exception:  # noqa: BLE001 - a counter this GPU does not keep
                    continue
            if read:
                prev = self._nvlink_errors.get((index, link))
                self._nvlink_errors[(index, link)] = total
                if prev is not None:
                    grew[link] = total - prev if total >= prev else total  # a reset counts from 0
        seen = self._nvlink_up.setdefault(index, set())
        seen |= active
        down = sorted(seen - active)
        out = [("nvlink_down", float(len(down)))]
        if grew:
            out.append(("nvlink_errors", float(sum(grew.values()))))
        out += [(f"nvlink_errors:{link}", float(n)) for link, n in sorted(grew.items()) if n]
        return out + [(f"nvlink_down:{link}", 1.0) for link in down]

    def _call(self, index: int, metric: str, fn: str, *args: Any) -> Any:
        if (index, metric) in self._unsupported:
            return None
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception as exc:  # noqa: BLE001 - NVML raises its own error classes: any failure is logged, sampling goes on
            if getattr(exc, "value", None) in _NOT_SUPPORTED or isinstance(exc, AttributeError):
                self._unsupported.add((index, metric))
                log.debug("GPU %d does not report %s (%s)", index, metric, exc)
            else:
                self.errors += 1
                key = (index, metric, type(exc).__name__)
                if key not in self._logged and len(self._logged) < 256:
                    self._logged.add(key)
                    log.warning("NVML %s failed on GPU %d: %s", fn, index, exc)
            return None

    def _poll_xid(self) -> list[tuple[str, int]]:
        if self._events is None:
            return []
        nvml = self.nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or getattr(nvml, "nvmlEventSetWait", None)
        if wait is None:
            return []
        found = []
        for _ in range(_MAX_XID_PER_ROUND):
            try:
                event = wait(self._events, 0)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: nothing pending (or the set broke: same answer)
                break
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            except Exception:  # noqa: BLE001 - NVML raises its own error classes: any failure is logged, sampling goes on
                continue
            found.append((uuid, int(event.eventData)))
        return found

    # -- to rows (main thread) -----------------------------------------------------------------
    def receive(self, payload: Any, ranks: Iterable[RankHandle]) -> list[Output]:
        _, ts, gpus = payload
        ranks = list(ranks)
        out: list[Output] = []
        for uuid, index, metrics in gpus:
            if not metrics:
                continue
            users = [h for h in ranks if h.info.gpu_uuid and h.info.gpu_uuid.lower() == uuid.lower()]
            if not users:
                users = [h for h in ranks if not h.info.gpu_uuid and h.local_rank == index]
                for h in users:  # the rank did not say its GPU: now the hw rows can
                    h.info.gpu_uuid = uuid
            if not users:
                self.unmapped += 1
                continue
            out += [hw_output(h, ts, metrics) for h in users]
        return out

    def status(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "off_reason": self._off_reason, "interval_s": self.interval_s,
                "gpus": [{"index": i, "uuid": u} for i, u, _ in self.gpus], "rounds": self.rounds,
                "errors": self.errors, "dropped": self.dropped, "unmapped": self.unmapped,
                "unsupported": sorted(f"{i}:{m}" for i, m in self._unsupported)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
