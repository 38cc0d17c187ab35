"""This node's GPUs, named as the rest of Argus names them, and the firmware they run.

A per-GPU figure is keyed by the GPU's UUID (``LocalGpu.subject``): it is what the ranks' HELLO
carries (``producer/runtime.py``: ``GPU-`` + CUDA's UUID) and what NVML reports, so a figure of
``--level gpu`` finds the rank that used the GPU (``argus verify``) and the sensors' figures of
the same GPU, whatever the CUDA enumeration order (``CUDA_VISIBLE_DEVICES``, ``FASTEST_FIRST``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from argus.healthcheck.model import LocalGpu, gpu_subject

__all__ = ["DRIVER_KEY", "local_gpus", "nvml_versions", "vbios_key"]

log = logging.getLogger("argus.healthcheck")

DRIVER_KEY = "nvidia_driver"  # the versions' key of the NVIDIA driver (``nvmlSystemGetDriverVersion``)


def vbios_key(uuid: str) -> str:
    """The versions' key of one GPU's VBIOS: scoped to the GPU (``baseline.changed_versions``)."""
    return f"vbios {gpu_subject(uuid)}"


def local_gpus(torch: Any) -> list[LocalGpu]:
    """Every CUDA device this process sees; none without CUDA."""
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(int(torch.cuda.device_count())):
        props = torch.cuda.get_device_properties(i)
        uuid = str(getattr(props, "uuid", "") or "")  # as the producer's HELLO writes it
        out.append(LocalGpu(i, f"GPU-{uuid}" if uuid else f"cuda:{i}", str(props.name)))
    return out


def nvml_versions(nvml: Any = None) -> dict[str, str]:
    """The NVIDIA driver's version and each GPU's VBIOS, from NVML (``nvml``: the ``pynvml``
    module, or a stand-in); empty where NVML is not there. Costs one NVML init (milliseconds)."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return {}
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no library: no versions to keep
        log.debug("no NVML versions: %s", exc)
        return {}
    try:
        out: dict[str, str] = {}
        driver = _text_of(nvml.nvmlSystemGetDriverVersion)
        if driver:
            out[DRIVER_KEY] = driver
        for i in range(int(_call(nvml.nvmlDeviceGetCount) or 0)):
            uuid, vbios = _gpu_firmware(nvml, i)
            if uuid and vbios:
                out[vbios_key(uuid)] = vbios
        return out
    finally:
        _call(nvml.nvmlShutdown)


def _gpu_firmware(nvml: Any, index: int) -> tuple[str, str]:
    """(UUID, VBIOS version) of the GPU NVML numbers ``index``; empty where not reported."""
    handle = _call(lambda: nvml.nvmlDeviceGetHandleByIndex(index))
    if handle is None:
        return "", ""
    return _text_of(lambda: nvml.nvmlDeviceGetUUID(handle)), _text_of(lambda: nvml.nvmlDeviceGetVbiosVersion(handle))


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - not supported by this GPU or driver: that figure is absent
        return None


def _text_of(fn: Callable[[], Any]) -> str:
    value = _call(fn)
    return value.decode() if isinstance(value, bytes) else str(value or "")
