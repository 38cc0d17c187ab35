"""Run the chosen levels on this node and collect one :class:`HealthReport`.

Where there are GPUs, every local GPU is measured and named by its UUID (``gpu:GPU-…``), so the
GPUs of a node are compared with each other: the matrix products burn all of them at once (as
training loads a node: its power and cooling under full load, each GPU's clocks under it), the
memory and host↔device copies run one GPU at a time (a GPU's own memory and link, not the
host's shared bandwidth).
"""

from __future__ import annotations

import os
import platform
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from argus import env as argus_env
from argus.healthcheck.burn import BurnMonitor, PcieLink, merge_links, pcie_measurements
from argus.healthcheck.collectives import ROUNDS, default_sizes, measure, net_measurements, to_measurements
from argus.healthcheck.gpus import local_gpus, nvml_versions
from argus.healthcheck.model import HealthReport, Level, LocalGpu, Measurement, gpu_subject
from argus.healthcheck.probes import (Clock, copy_gbs, gemm_gflops, host_copy_gbs, p2p_gbs,
                                      train_tokens_per_s)

__all__ = ["AGAIN_PAUSES_S", "CheckConfig", "launched", "measure_again", "run_checks", "versions"]

_SENSORS = "gpu: clocks, temperature, power and throttle reasons under load"


@dataclass(frozen=True)
class CheckConfig:
    levels: tuple[Level, ...] = (Level.GPU, Level.NODE, Level.NET, Level.E2E)
    full: bool = False  # --full: larger sizes, longer burns; --quick (default) fits in ~1 minute
    nproc: int | None = None  # ranks for the net level (default: the GPUs, or 2 on a CPU)
    seconds: float | None = None  # per probe (default: 0.5 quick, 3 full)
    sizes: list[int] = field(default_factory=list)  # net message sizes (default: 8 B … 4 MiB / 1 GiB)
    runs: int = 1  # launched across ranks: the net level this many times in one process group (a baseline)
    #: launched across ranks: whether a report fails (rank 0 decides, every rank measures again)
    recheck: Callable[[HealthReport], bool] | None = None
    nvml: Any = None  # the pynvml module for the burn's sensors (None: import it; tests pass a stand-in)
    torch: Any = None  # the torch module (None: import it; tests pass a stand-in with CUDA devices)
    clock: Clock = time.perf_counter  # what probes time with (tests: a virtual one their kernels advance)

    @property
    def probe_s(self) -> float:
        return self.seconds if self.seconds is not None else (3.0 if self.full else 0.5)


def versions(torch: Any, nvml: Any = None) -> dict[str, str]:
    """The software and firmware a run measured on, kept with its baseline: torch, Python, the
    kernel; with CUDA, CUDA and NCCL, and from NVML the driver and each GPU's VBIOS."""
    out = {"torch": torch.__version__, "python": platform.python_version(), "kernel": platform.release()}
    if torch.cuda.is_available():
        out["cuda"] = str(torch.version.cuda)
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            pass
        out.update(nvml_versions(nvml))
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


@dataclass
class _Run:
    """What every level of one run shares."""

    torch: Any
    config: CheckConfig
    gpus: list[LocalGpu]
    report: HealthReport
    say: Callable[[str], None]

    def add(self, *ms: Measurement) -> None:
        self.report.measurements.extend(ms)

    def skip(self, check: str, reason: str) -> None:
        self.report.skipped.append((check, reason))

    def cuda(self, gpu: LocalGpu) -> Any:
        return self.torch.device("cuda", gpu.index)


def run_checks(config: CheckConfig, progress: Callable[[str], None] | None = None) -> HealthReport | None:
    """This node's report; launched as one rank of many (``launched()``), the net level across
    all of them, reported by rank 0 (the others return None)."""
    torch = config.torch
    if torch is None:
        import torch
    gpus = local_gpus(torch)
    report = HealthReport(os.environ.get(argus_env.HOST) or socket.gethostname(), _device_name(gpus),
                          versions(torch, config.nvml), time.time(), gpus=gpus)
    t0 = time.perf_counter()
    where = launched()
    if where is not None:
        rank, world, local = where
        def of(got: list[dict]) -> HealthReport:
            one = HealthReport(report.host, report.device, report.versions, report.started_s,
                               measurements=to_measurements(got[0]))
            if len(got) > 1:  # a baseline of several runs in one process group
                one.with_runs([HealthReport(report.host, report.device, report.versions, report.started_s,
                                            measurements=to_measurements(d)) for d in got[1:]])
            return one

        recheck = config.recheck
        docs = measure(rank, world, "env://", config.sizes or default_sizes(config.full), config.probe_s / 4, 256,
                       local_rank=local, runs=config.runs,
                       again=None if recheck is None else (lambda got: recheck(of(got))))
        if docs is None:
            return None
        second = [d for d in docs if d.get("again")]
        doc = docs[0]
        report.measurements.extend(of([d for d in docs if not d.get("again")]).measurements)
        if second:
            report.again = HealthReport(report.host, report.device, report.versions, report.started_s,
                                        measurements=to_measurements(second[0]))
        report.device = f"{world} ranks on {len(set(doc['hosts']))} hosts ({doc['backend']})"
        report.rank_hosts = [str(h) for h in doc["hosts"]]
        report.seconds = time.perf_counter() - t0
        return report
    run = _Run(torch, config, gpus, report, progress or (lambda _msg: None))
    links: dict[str, PcieLink] = {}
    if Level.GPU in config.levels:
        links = _gpu_level(run) if gpus else _cpu_level(run)
    if Level.NODE in config.levels:
        _node_level(run, links)
    if Level.NET in config.levels:
        _net_level(run)
    if Level.E2E in config.levels:
        run.say("e2e: the bundled transformer's training throughput")
        def train(t: float) -> float:
            return train_tokens_per_s(torch, t)

        run.add(*_in_rounds(Level.E2E, "train_tokens_per_s", "device", "tokens/s", 0, [train], 4 * config.probe_s))
    report.seconds = time.perf_counter() - t0
    return report


#: A figure that failed is measured again after each of these pauses (s) until it passes: it
#: fails only if it failed every time. A shared machine's figures drift for tens of seconds at a
#: time — this VM's memory copies swung between 25 and 58 GB/s in phases of 10–30 s, its matrix
#: products within 5% — so a second measurement a moment after the first shares its slow phase
#: (2 of 30 healthy quick checks failed so, 25–38% below a baseline its slower phases never
#: reached). A node whose hardware is degraded fails every time; one waiting on its neighbours
#: reaches its figure once they pause.
AGAIN_PAUSES_S = (0.0, 5.0, 10.0)


def measure_again(measure: Callable[[], HealthReport | None], fails: Callable[[HealthReport], bool],
                  pauses_s: tuple[float, ...] | None = None,
                  sleep: Callable[[float], None] = time.sleep) -> tuple[HealthReport | None, int]:
    """The failing figures measured again (``measure``: a run of their levels) after each pause
    until a run in which they pass (``fails`` false); else the last run. Returns it and how many
    runs were made. Each run is judged whole: its figures were measured together, so a GPU is
    still compared with its peers of the same moment. ``pauses_s``: default ``AGAIN_PAUSES_S``."""
    report, spent, n = None, 0.0, 0
    for pause in AGAIN_PAUSES_S if pauses_s is None else pauses_s:
        if pause > 0:
            sleep(pause)
        got = measure()
        if got is None:
            return None, n
        n += 1
        spent += pause + got.seconds
        report = got
        if not fails(got):
            break
    if report is not None:
        report.seconds = spent
    return report, n


def _device_name(gpus: list[LocalGpu]) -> str:
    if not gpus:
        return _cpu_name()
    names = sorted({g.name for g in gpus})
    return f"{len(gpus)} × {names[0]}" if len(names) == 1 else ", ".join(g.name for g in gpus)


def _dtypes(torch: Any, cuda: bool) -> list[tuple[str, Any]]:
    return [("fp32", torch.float32), ("bf16", torch.bfloat16)] + ([("fp16", torch.float16)] if cuda else [])


def _in_rounds(level: Level, metric: str, subject: str, unit: str, size: int,
               probes: list[Callable[[float], float]], seconds: float) -> list[Measurement]:
    """Each probe measured in ``ROUNDS`` rounds of ``seconds / ROUNDS``, round-robin over the
    probes (a moment's slowdown hits one round of each); per probe, the median, the spread
    (1 − worst/best) and the rounds themselves."""
    took: list[list[float]] = [[] for _ in probes]
    for _ in range(ROUNDS):
        for i, probe in enumerate(probes):
            took[i].append(probe(seconds / ROUNDS))
    return [Measurement(level, metric, subject, float(sorted(t)[len(t) // 2]), unit, size,
                        1.0 - min(t) / max(t) if max(t) > 0 else 0.0, samples=tuple(t)) for t in took]


def _cpu_level(run: _Run) -> dict[str, PcieLink]:
    """The gpu level without a GPU: the CPU's matrix products and memory, as subject ``device``."""
    torch, cfg, s = run.torch, run.config, run.config.probe_s
    n = 1024 if cfg.full else 512
    for label, dtype in _dtypes(torch, cuda=False):
        run.say(f"gpu: {label} matrix products ({n}×{n})")
        def gemm(t: float, dtype: Any = dtype) -> float:
            return gemm_gflops(torch, n, dtype, t, clock=cfg.clock)

        run.add(*_in_rounds(Level.GPU, f"gemm_{label}_gflops", "device", "GFLOP/s", 0, [gemm], s))
    nbytes = 512 << 20 if cfg.full else 64 << 20
    run.say(f"gpu: memory copies ({nbytes >> 20} MiB)")
    def copy(t: float) -> float:
        return copy_gbs(torch, nbytes, t, clock=cfg.clock)

    run.add(*_in_rounds(Level.GPU, "copy_gbs", "device", "GB/s", nbytes, [copy], s))
    run.skip(_SENSORS, "skipped: no CUDA device (measured the CPU's arithmetic and memory instead)")
    return {}


def _gpu_level(run: _Run) -> dict[str, PcieLink]:
    """Every GPU's matrix products (all at once, under the sensors' watch) and memory copies
    (one at a time); returns the PCIe links the burn saw, for the node level."""
    torch, cfg, s = run.torch, run.config, run.config.probe_s
    n = 8192 if cfg.full else 4096
    burn = BurnMonitor(nvml=cfg.nvml)
    with burn, ThreadPoolExecutor(max_workers=len(run.gpus), thread_name_prefix="argus-burn") as pool:
        for label, dtype in _dtypes(torch, cuda=True):
            run.say(f"gpu: {label} matrix products ({n}×{n}) on {len(run.gpus)} GPU(s) at once")
            rates = pool.map(lambda g: gemm_gflops(torch, n, dtype, s, device=run.cuda(g), clock=cfg.clock),  # noqa: B023
                             run.gpus)
            run.add(*(Measurement(Level.GPU, f"gemm_{label}_gflops", g.subject, r, "GFLOP/s", 0)
                      for g, r in zip(run.gpus, rates)))
    run.add(*burn.measurements())
    if burn.off:
        run.skip(_SENSORS, f"skipped: {burn.off}")
    nbytes = 1 << 30 if cfg.full else 256 << 20
    for g in run.gpus:
        run.say(f"gpu: memory copies ({nbytes >> 20} MiB) on {g.subject}")
        run.add(Measurement(Level.GPU, "copy_gbs", g.subject, copy_gbs(torch, nbytes, s, device=run.cuda(g),
                                                                       clock=cfg.clock), "GB/s", nbytes))
    return burn.pcie_links()


def _node_level(run: _Run, sampled: dict[str, PcieLink]) -> None:
    """Each GPU's host↔device copies and PCIe link against its maximum; the P2P matrix."""
    if not run.gpus:
        run.skip("node", "skipped: no CUDA device (host↔device and P2P bandwidth, PCIe links)")
        return
    torch, cfg, s = run.torch, run.config, run.config.probe_s
    nbytes = 256 << 20
    burn = BurnMonitor(nvml=cfg.nvml)  # the copies keep each GPU's link busy: its trained speed is read then
    with burn:
        for g in run.gpus:
            run.say(f"node: host↔device copies on {g.subject}")
            for label, gbs in host_copy_gbs(torch, nbytes, s, run.cuda(g), clock=cfg.clock).items():
                run.add(Measurement(Level.NODE, f"{label}_gbs", g.subject, gbs, "GB/s", nbytes))
    links = merge_links(sampled, burn.pcie_links())
    run.add(*pcie_measurements(links))
    if burn.off:
        run.skip("node: PCIe generation and width", f"skipped: {burn.off}")
    unseen = [g.subject for g in run.gpus if links.get(g.uuid, PcieLink(None, None, None, None)).gen is None]
    if unseen and not burn.off:
        run.skip(f"node: PCIe link of {', '.join(unseen)}", "skipped: never sampled busy (NVML reports no link "
                 "generation for an idle GPU)")
    if len(run.gpus) < 2:
        run.skip("node: P2P matrix", "skipped: one GPU on this node")
        return
    run.say(f"node: P2P copies between {len(run.gpus)} GPUs")
    uuid = {g.index: g.uuid for g in run.gpus}
    for (i, j), gbs in sorted(p2p_gbs(torch, nbytes, s / 4, clock=cfg.clock).items()):
        run.add(Measurement(Level.NODE, "p2p_gbs", f"{gpu_subject(uuid[i])}->{gpu_subject(uuid[j])}", gbs, "GB/s",
                            nbytes))


def _net_level(run: _Run) -> None:
    cfg, n_gpus = run.config, len(run.gpus)
    nproc = cfg.nproc or (n_gpus if n_gpus > 1 else 2)
    sizes = cfg.sizes or default_sizes(cfg.full)
    run.say(f"net: collectives between {nproc} ranks, {len(sizes)} sizes")
    got, backend = net_measurements(nproc, sizes, cfg.probe_s / 4)
    run.add(*got)
    if backend == "gloo":
        run.skip("net: reduce_scatter, all_to_all", "skipped: gloo (no CUDA device) has neither")
