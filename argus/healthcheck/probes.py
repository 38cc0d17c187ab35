"""Single-process probes: the device's arithmetic and memory, and the bundled model's throughput.

Each probe runs for a fixed time, not a fixed count, so a slow device is measured as long as a
fast one; the first iterations (allocation, kernel selection) are not timed. On a CUDA device
the work is synchronised before the clock is read; on a CPU-only machine the same probes run
on the CPU (torch's intra-op threads as configured), so every path runs everywhere. A probe
takes the device it measures (default: the current one) and the clock it reads (tests pass a
virtual one that stand-in kernels advance).
"""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["Clock", "gemm_gflops", "copy_gbs", "host_copy_gbs", "p2p_gbs", "train_tokens_per_s", "device_of"]

Clock = Callable[[], float]


def device_of(torch: Any) -> Any:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _timed(fn: Callable[[], object], seconds: float, sync: Callable[[], None], warmup: int = 2,
           clock: Clock = time.perf_counter) -> tuple[int, float]:
    for _ in range(warmup):
        fn()
    sync()
    n, t0 = 0, clock()
    while True:
        fn()
        n += 1
        if n % 4 == 0:
            sync()
            dt = clock() - t0
            if dt >= seconds:
                return n, dt


def _sync(torch: Any, device: Any) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def gemm_gflops(torch: Any, n: int, dtype: Any, seconds: float, device: Any = None,
                clock: Clock = time.perf_counter) -> float:
    """Square matrix products of size ``n``: 2n³ floating-point operations each."""
    device = device if device is not None else device_of(torch)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    count, dt = _timed(lambda: torch.matmul(a, b, out=out), seconds, _sync(torch, device), clock=clock)
    return 2.0 * n ** 3 * count / dt / 1e9


def copy_gbs(torch: Any, nbytes: int, seconds: float, device: Any = None, clock: Clock = time.perf_counter) -> float:
    """Device memory bandwidth from copies of ``nbytes`` (each reads and writes them)."""
    device = device if device is not None else device_of(torch)
    src = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    count, dt = _timed(lambda: dst.copy_(src), seconds, _sync(torch, device), clock=clock)
    return 2.0 * src.numel() * 4 * count / dt / 1e9


def host_copy_gbs(torch: Any, nbytes: int, seconds: float, device: Any,
                  clock: Clock = time.perf_counter) -> dict[str, float]:
    """Copies of ``nbytes`` between pinned host memory and ``device``, each way: ``{"h2d": GB/s,
    "d2h": GB/s}`` — the GPU's PCIe link (or its C2C link) as the data loader and the
    checkpoints use it. Pinned, so that the copy engine, not a staging copy, is timed."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for label, fn in (("h2d", lambda: dev.copy_(host, non_blocking=True)),
                      ("d2h", lambda: host.copy_(dev, non_blocking=True))):
        count, dt = _timed(fn, seconds, _sync(torch, device), clock=clock)
        out[label] = nbytes * count / dt / 1e9
    return out


def p2p_gbs(torch: Any, nbytes: int, seconds: float, clock: Clock = time.perf_counter) -> dict[tuple[int, int], float]:
    """Copy bandwidth from each local GPU to each other one, ``(src, dst) → GB/s``: NVLink (or
    PCIe through the host where peers cannot reach each other) — a pair far below the others is
    a link down or a GPU behind a slower switch. Both ends are synchronised before the clock is
    read; each pair is timed alone."""
    n = int(torch.cuda.device_count())
    out: dict[tuple[int, int], float] = {}
    for i in range(n):
        src = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", i))
        for j in range(n):
            if i == j:
                continue
            dst = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", j))

            def sync(i: int = i, j: int = j) -> None:
                torch.cuda.synchronize(i)
                torch.cuda.synchronize(j)

            def copy(dst: Any = dst) -> object:
                return dst.copy_(src, non_blocking=True)  # noqa: B023 - timed in this iteration

            count, dt = _timed(copy, seconds, sync, clock=clock)
            out[(i, j)] = nbytes * count / dt / 1e9
            del dst
    return out


def train_tokens_per_s(torch: Any, seconds: float, d_model: int = 128, seq: int = 128, batch: int = 8) -> float:
    """Training throughput of the bundled transformer (``argus.workloads.train_transformer``)."""
    import torch.nn.functional as F

    from argus.workloads.train_transformer import Stage

    device = device_of(torch)
    gen = torch.Generator().manual_seed(0)
    model = Stage(256, d_model, 4, 2, first=True, last=True).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randint(0, 256, (batch, seq), generator=gen).to(device)

    def step() -> None:
        loss = F.cross_entropy(model(x).view(-1, 256), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    count, dt = _timed(step, seconds, _sync(torch, device), warmup=1)
    return batch * seq * count / dt
