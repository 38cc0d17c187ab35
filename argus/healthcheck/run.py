"""Run the chosen levels on this node and collect one :class:`HealthReport`."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from argus.healthcheck.burn import BurnMonitor
from argus.healthcheck.collectives import default_sizes, measure, net_measurements, to_measurements
from argus.healthcheck.model import HealthReport, Level, Measurement
from argus.healthcheck.probes import copy_gbs, gemm_gflops, p2p_gbs, train_tokens_per_s

__all__ = ["CheckConfig", "launched", "run_checks", "versions"]


@dataclass(frozen=True)
class CheckConfig:
    levels: tuple[Level, ...] = (Level.GPU, Level.NODE, Level.NET, Level.E2E)
    full: bool = False  # --full: larger sizes, longer burns; --quick (default) fits in ~1 minute
    nproc: int | None = None  # ranks for the net level (default: the GPUs, or 2 on a CPU)
    seconds: float | None = None  # per probe (default: 0.5 quick, 3 full)
    sizes: list[int] = field(default_factory=list)  # net message sizes (default: 8 B … 4 MiB / 1 GiB)
    nvml: Any = None  # the pynvml module for the burn's sensors (None: import it; tests pass a stand-in)

    @property
    def probe_s(self) -> float:
        return self.seconds if self.seconds is not None else (3.0 if self.full else 0.5)


def versions(torch: Any) -> dict[str, str]:
    out = {"torch": torch.__version__, "python": platform.python_version(), "kernel": platform.release()}
    if torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda)
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
    return out


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or "unknown")


def launched() -> tuple[int, int, int] | None:
    """(rank, world, local rank) where a launcher started this process as one rank of many
    (torchrun, srun with the usual variables), else None."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))
    return None


def run_checks(config: CheckConfig, progress: Callable[[str], None] | None = None) -> HealthReport | None:
    """This node's report; launched as one rank of many (``launched()``), the net level across
    all of them, reported by rank 0 (the others return None)."""
    import torch

    say = progress or (lambda _msg: None)
    cuda = torch.cuda.is_available()
    report = HealthReport(os.environ.get("ARGUS_HOST") or socket.gethostname(),
                          torch.cuda.get_device_name() if cuda else _cpu_name(), versions(torch), time.time())
    t0 = time.perf_counter()
    s = config.probe_s
    ms = report.measurements
    where = launched()
    if where is not None:
        rank, world, local = where
        doc = measure(rank, world, "env://", config.sizes or default_sizes(config.full), s / 4, 256,
                      local_rank=local)
        if doc is None:
            return None
        ms.extend(to_measurements(doc))
        report.device = f"{world} ranks on {len(set(doc['hosts']))} hosts ({doc['backend']})"
        report.rank_hosts = [str(h) for h in doc["hosts"]]
        report.seconds = time.perf_counter() - t0
        return report
    if Level.GPU in config.levels:
        n = (8192 if config.full else 4096) if cuda else (1024 if config.full else 512)
        dtypes = [("fp32", torch.float32), ("bf16", torch.bfloat16)] + ([("fp16", torch.float16)] if cuda else [])
        burn = BurnMonitor(nvml=config.nvml) if cuda else None
        with burn if burn is not None else contextlib.nullcontext():
            for label, dtype in dtypes:
                say(f"gpu: {label} matrix products ({n}×{n})")
                ms.append(Measurement(Level.GPU, f"gemm_{label}_gflops", "device", gemm_gflops(torch, n, dtype, s),
                                      "GFLOP/s", 0))
        if burn is not None:
            ms.extend(burn.measurements())
            if burn.off:
                report.skipped.append(("gpu: clocks, temperature, power and throttle reasons under load",
                                       f"skipped: {burn.off}"))
        nbytes = (1 << 30 if config.full else 256 << 20) if cuda else (512 << 20 if config.full else 64 << 20)
        say(f"gpu: memory copies ({nbytes >> 20} MiB)")
        ms.append(Measurement(Level.GPU, "copy_gbs", "device", copy_gbs(torch, nbytes, s), "GB/s", nbytes))
        if not cuda:
            report.skipped.append(("gpu: clocks, temperature, power and throttle reasons under load",
                                   "skipped: no CUDA device (measured the CPU's arithmetic and memory instead)"))
    if Level.NODE in config.levels:
        if not cuda:
            report.skipped.append(("node", "skipped: no CUDA device (host↔device and P2P bandwidth)"))
        else:
            nbytes = 256 << 20
            host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
            dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            for label, fn in (("h2d", lambda: dev.copy_(host, non_blocking=True)),
                              ("d2h", lambda: host.copy_(dev, non_blocking=True))):
                say(f"node: {label} copies")
                from argus.healthcheck.probes import _sync, _timed

                count, dt = _timed(fn, s, _sync(torch, dev.device))
                ms.append(Measurement(Level.NODE, f"{label}_gbs", f"gpu:{torch.cuda.current_device()}",
                                      nbytes * count / dt / 1e9, "GB/s", nbytes))
            if torch.cuda.device_count() < 2:
                report.skipped.append(("node: P2P matrix", "skipped: one GPU on this node"))
            else:
                say(f"node: P2P copies between {torch.cuda.device_count()} GPUs")
                p2p_bytes = 256 << 20
                for (i, j), gbs in sorted(p2p_gbs(torch, p2p_bytes, s / 4).items()):
                    ms.append(Measurement(Level.NODE, "p2p_gbs", f"gpu:{i}->gpu:{j}", gbs, "GB/s", p2p_bytes))
    if Level.NET in config.levels:
        nproc = config.nproc or (torch.cuda.device_count() if cuda and torch.cuda.device_count() > 1 else 2)
        sizes = config.sizes or default_sizes(config.full)
        say(f"net: collectives between {nproc} ranks, {len(sizes)} sizes")
        got, backend = net_measurements(nproc, sizes, s / 4)
        ms.extend(got)
        if backend == "gloo":
            report.skipped.append(("net: reduce_scatter, all_to_all", "skipped: gloo (no CUDA device) has neither"))
    if Level.E2E in config.levels:
        say("e2e: the bundled transformer's training throughput")
        ms.append(Measurement(Level.E2E, "train_tokens_per_s", "device", train_tokens_per_s(torch, 4 * s),
                              "tokens/s", 0))
    report.seconds = time.perf_counter() - t0
    return report
