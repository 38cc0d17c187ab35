"""The network level: collective bus bandwidth over message sizes, between real processes.

Bandwidths follow nccl-tests (``doc/PERFORMANCE.md`` there): the algorithm bandwidth of an
operation on ``S`` bytes that took ``t`` is ``S / t``; the bus bandwidth, comparable across
world sizes and with the link's speed, multiplies it by the share of the data each rank must
move — ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all,
1 for broadcast. Every size is timed as the slowest rank saw it (its time is all-reduced with
MAX), after a warm-up call, for as many iterations as fit its time budget — the same count on
every rank. Each rank also times a short matrix product, so that ranks can be compared with
their peers (one rank's CPU limited, one GPU throttled).

On a CPU-only machine the processes use gloo (all-reduce, all-gather, broadcast; gloo has no
reduce-scatter or all-to-all); with CUDA, NCCL and all five.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from argus import env as argus_env
from argus.healthcheck.model import Level, Measurement

__all__ = ["BUS_FACTOR", "busbw", "net_measurements", "default_sizes", "host_contrast"]

#: share of the data each rank moves, per operation (nccl-tests' bus-bandwidth factors)
BUS_FACTOR = {"all_reduce": lambda n: 2.0 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0}
GLOO_OPS = ("all_reduce", "all_gather", "broadcast")
#: each link measured in this many rounds (even: each end on each of two shared cores as often),
#: for ``PAIR_SECONDS`` × the per-size budget in all — a host's figure pools its links' rounds,
#: and a link throttled by a fifth must show beyond the rounds' noise
PAIR_ROUNDS = 10
PAIR_SECONDS = 3.0
#: a link whose every one of this many rounds took longer than its whole budget (20 Mbit/s moves
#: 1 MiB in 0.4 s) is measured no more: ten rounds of it took a six-host check from 19 s to 40 s
CRAWL_ROUNDS = 3
#: each collective and size measured in this many rounds, round-robin over them, in the same
#: time as one: a verdict compares the rounds' distributions (``baseline.deficit_bound``)
ROUNDS = 5
#: each rank's matrix products measured in this many rounds (on a CPU, one rank at a time,
#: interleaved): a neighbour's burst that hits two rounds of one rank cannot move its median
GEMM_ROUNDS = 5
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def busbw(op: str, nbytes: int, seconds: float, world: int) -> float:
    """Bus bandwidth in GB/s of one ``op`` on ``nbytes`` that took ``seconds``."""
    return nbytes / seconds * BUS_FACTOR[op](world) / 1e9


def default_sizes(full: bool) -> list[int]:
    """8 B to 4 MiB (quick) or to 1 GiB (full), ×8 apart."""
    top = 1 << 30 if full else 4 << 20
    out, s = [], 8
    while s <= top:
        out.append(s)
        s *= 8
    if out[-1] != top:
        out.append(top)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _timed_collective(fn, sync, group, device, seconds: float, warm_up: bool = True) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call of ``fn`` as the slowest member of ``group`` saw it, for as many calls
    as fit ``seconds`` — the same count on every member. ``warm_up``: one untimed call first
    (connections, buffers); a group measured again has them already.

    A call that takes half the budget or more is measured once: the probe call that sizes the
    loop is the figure. A link throttled to a crawl (1 MiB at 20 Mbit/s: 0.4 s) would otherwise
    take four calls, twice its budget, in every round."""
    import time

    import torch
    import torch.distributed as dist

    if warm_up:
        fn()
        sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = time.perf_counter() - t0
    probe = torch.tensor([float(min(200, int(seconds / max(once, 1e-6))))], device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MIN, group=group)
    iters = int(probe.item())
    if iters >= 2:
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        once = (time.perf_counter() - t0) / iters
    took = torch.tensor([once], device=device, dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
    return float(took.item())


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


@contextlib.contextmanager
def _on_cpu(cpus: list[int], round_: int) -> Iterator[None]:
    """This process — every thread of it: gloo runs its collectives on threads of its own, torch
    its matrix products on several — on core ``cpus[round_ % len(cpus)]`` for one round. Ranks
    sharing a machine's cores are compared like with like: on a shared VM one vCPU runs the same
    work up to 2× slower than another for seconds at a time, so a rank that happened to sit on
    the slower one was a slow rank (a net check's rank 0 failed its matrix products twice in a
    row, 1 run of 30). Where a thread may not move (a launcher bound it), it stays."""
    if len(cpus) < 2:
        yield
        return
    before: dict[int, set[int]] = {}
    for tid in _threads():
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {cpus[round_ % len(cpus)]})
        except OSError:
            before.pop(tid, None)
    try:
        yield
    finally:
        for tid, mask in before.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass


def _nbytes(size: int, world: int) -> int:
    n = max(size // 4, world)
    return 4 * (n - n % world)


def _collective(op: str, n: int, world: int, cuda: bool, device):  # type: ignore[no-untyped-def]
    """One call of ``op`` on ``n`` float32 elements a rank."""
    import torch
    import torch.distributed as dist

    x = torch.ones(n, device=device)
    if op == "all_gather":
        if cuda:
            out = torch.empty(n * world, device=device)
            return lambda: dist.all_gather_into_tensor(out, x)
        outs = [torch.empty_like(x) for _ in range(world)]
        return lambda: dist.all_gather(outs, x)
    if op == "reduce_scatter":
        out = torch.empty(n // world, device=device)
        return lambda: dist.reduce_scatter_tensor(out, x)
    if op == "all_to_all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    if op == "broadcast":
        return lambda: dist.broadcast(x, 0)
    return lambda: dist.all_reduce(x)


def measure(rank: int, world: int, init_method: str, sizes: list[int], seconds: float, gemm_n: int,
            pair_bytes: int = 1 << 20, local_rank: int | None = None, runs: int = 1,
            again: Callable[[list[dict]], bool] | None = None) -> list[dict] | None:
    """One rank's part of the net level, ``runs`` times in one process group (a baseline is
    several runs: their spread is the node's run-to-run noise); rank 0 returns the job's
    documents, one a run, the others None. ``again`` (given on every rank, called on rank 0):
    whether the documents fail; if so every rank measures once more, and the last document,
    marked ``"again": true``, is that measurement — a figure fails only if it fails twice.

    Where the ranks sit on several hosts (``ARGUS_HOST``, else the host name), each pair of
    hosts is also measured alone — an all-reduce of ``pair_bytes`` between their first ranks,
    one pair at a time, in ``PAIR_ROUNDS`` round-robin rounds — so that a slow link is named by
    its hosts, not averaged into the job."""
    import torch
    import torch.distributed as dist

    local = rank if local_rank is None else local_rank
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > local
    if cuda:
        torch.cuda.set_device(local)
    else:  # the ranks share the node's cores, as a job's would: no rank oversubscribes them
        per_host = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(per_host, 1)))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank, world_size=world)
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    docs = [_measure_once(rank, world, sizes, seconds, gemm_n, pair_bytes, cuda, device, first_run=i == 0)
            for i in range(max(1, runs))]
    if again is not None:
        decided = [bool(again(docs)) if rank == 0 else False]
        dist.broadcast_object_list(decided, src=0)
        if decided[0]:
            docs.append({**_measure_once(rank, world, sizes, seconds, gemm_n, pair_bytes, cuda, device,
                                         first_run=False), "again": True})
    dist.barrier()
    dist.destroy_process_group()
    return docs if rank == 0 else None


def _measure_once(rank: int, world: int, sizes: list[int], seconds: float, gemm_n: int, pair_bytes: int,
                  cuda: bool, device, first_run: bool) -> dict:  # type: ignore[no-untyped-def]
    import socket as _socket

    import torch
    import torch.distributed as dist

    from argus.healthcheck.probes import gemm_gflops

    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    ops = NCCL_OPS if cuda else GLOO_OPS
    cases = [(op, size) for op in ops for size in sizes]
    per_case: list[list[float]] = [[] for _ in cases]
    for round_ in range(ROUNDS):  # round-robin: a moment's slowdown of the machine hits one round of each
        for i, (op, size) in enumerate(cases):
            n = max(size // 4, world)  # float32 elements, divisible work for every rank
            n -= n % world
            fn = _collective(op, n, world, cuda, device)
            per_case[i].append(_timed_collective(fn, sync, None, device, seconds / ROUNDS,
                                                 warm_up=first_run and round_ == 0))
    rows = [(op, _nbytes(size, world), float(np.median(t)), t) for (op, size), t in zip(cases, per_case)]
    hosts: list = [None] * world
    dist.all_gather_object(hosts, os.environ.get(argus_env.HOST) or _socket.gethostname())
    first: dict[str, int] = {}
    for r, h in enumerate(hosts):
        first.setdefault(str(h), r)
    names = sorted(first, key=first.__getitem__)
    links = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    groups = [dist.new_group([first[a], first[b]]) for a, b in links]  # every rank takes part in creating each
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    rounds: dict[tuple[str, str], list[float]] = {}
    budget = seconds * PAIR_SECONDS  # a link's, over its rounds
    for round_ in range(PAIR_ROUNDS):  # round-robin: a moment's slowdown of one host (a busy neighbour,
        # a slow vCPU) hits one round of each of its links; each round starts at another link, so
        # that no host's links always come first after the barrier (the first host's did)
        turn = round_ % max(len(links), 1)
        for (a, b), group in zip(links[turn:] + links[:turn], groups[turn:] + groups[:turn]):
            done = rounds.get((a, b), [])
            if len(done) >= CRAWL_ROUNDS and min(done) > budget:
                pass  # a crawl: every call took longer than its whole budget; both ends see the same times
            elif rank in (first[a], first[b]):
                x = torch.ones(pair_bytes // 4, device=device)
                # the pair's two ends on the machine's cores in turn (hosts that share a machine's
                # cores: namespaces), so that no host's links are all measured on the slower core
                with contextlib.nullcontext() if cuda else _on_cpu(cpus, round_ + (rank == first[b])):
                    took = _timed_collective(lambda: dist.all_reduce(x, group=group), sync, group,  # noqa: B023
                                             device, budget / PAIR_ROUNDS,
                                             warm_up=first_run and round_ == 0)
                rounds.setdefault((a, b), []).append(took)
            dist.barrier()  # one pair at a time: nothing else on the wire
    # (a, b, median seconds, spread: 1 − best/worst, the link's own noise in this run, rounds).
    # The median, not the best: a link that is slow a third of the time is slow (and a best-of
    # would let any duty-cycled limit — a CPU quota, a throttling clock — look healthy)
    pairs = [(a, b, float(np.median(t)), 1.0 - min(t) / max(t), t) for (a, b), t in rounds.items()]
    every_pair: list = [None] * world
    dist.all_gather_object(every_pair, pairs)
    mine: list[float] = []
    for round_ in range(GEMM_ROUNDS):  # rounds: their median, and their spread as this rank's noise
        if cuda:  # each rank its own device: all at once
            mine.append(gemm_gflops(torch, gemm_n, torch.float32, seconds / GEMM_ROUNDS))
        else:  # ranks share the machine's cores (more ranks than cores, network namespaces): one at a time,
            for r in range(world):  # each round on the same core for every rank that may use it
                if r == rank:
                    with _on_cpu(cpus, round_):
                        mine.append(gemm_gflops(torch, gemm_n, torch.float32, seconds / GEMM_ROUNDS))
                dist.barrier()
    gflops = torch.tensor([float(np.median(mine)), 1.0 - min(mine) / max(mine), *mine], device=device,
                          dtype=torch.float64)
    every = [torch.zeros_like(gflops) for _ in range(world)]
    dist.all_gather(every, gflops)
    return {"world": world, "backend": "nccl" if cuda else "gloo", "rows": rows, "hosts": [str(h) for h in hosts],
            "pairs": [v for _, v in sorted({(x[0], x[1]): list(x) for got in every_pair for x in got}.items())],
            # both members measured a pair: one figure
            "pair_bytes": pair_bytes, "gemm": [float(g[0].item()) for g in every],
            "gemm_noise": [float(g[1].item()) for g in every], "gemm_samples": [g[2:].tolist() for g in every]}


def _rank_main(rank: int, world: int, port: int, sizes: list[int], seconds: float, gemm_n: int, out: str) -> None:
    docs = measure(rank, world, f"tcp://127.0.0.1:{port}", sizes, seconds, gemm_n)
    if docs is not None:
        Path(out).write_text(json.dumps(docs[0]))


def host_contrast(links: list[tuple[str, str, list[float]]]) -> dict[str, tuple[float, ...]]:
    """Per host, round by round: the geometric mean of its links' figures over that of the links
    between the other hosts in the same round (1.0: like its peers). Where the machine ran slow in
    a round, every link did, and the ratio does not move; a host whose every link is throttled by a
    fifth reads ~0.8 in every round, a healthy host that shares one link with it slightly above 1.
    Needs three hosts (a link that does not touch the host); a round counts the links measured in it."""
    hosts = sorted({h for a, b, _ in links for h in (a, b)})
    if len(hosts) < 3:
        return {}
    logs = {(a, b): np.log(np.maximum(np.asarray(r, dtype=np.float64), 1e-12)) for a, b, r in links}
    out: dict[str, tuple[float, ...]] = {}
    for h in hosts:
        ratios = []
        for r in range(max((len(v) for v in logs.values()), default=0)):  # a crawl's later rounds: not measured
            mine = [v[r] for k, v in logs.items() if h in k and len(v) > r]
            rest = [v[r] for k, v in logs.items() if h not in k and len(v) > r]
            if mine and rest:
                ratios.append(float(np.exp(np.mean(mine) - np.mean(rest))))
        if ratios:
            out[h] = tuple(ratios)
    return out


def to_measurements(doc: dict) -> list[Measurement]:
    """The net level's figures: bus bandwidth per operation and size (the whole job), per link
    and per host (the median of its links, their rounds pooled: a slow host's links are all slow,
    a healthy host shares one slow link with it), and each rank's matrix products."""
    import numpy as np

    from argus.healthcheck.baseline import LATENCY_BYTES

    world = int(doc["world"])
    ms = []
    for row in doc["rows"]:
        op, size, t = row[0], int(row[1]), float(row[2])
        rounds = [float(x) for x in row[3]] if len(row) > 3 else []
        subject = f"ranks:0-{world - 1}"
        if size < LATENCY_BYTES:  # latency-bound: judged as the time of one call
            ms.append(Measurement(Level.NET, f"{op}_latency_us", subject, t * 1e6, "µs", size,
                                  samples=tuple(x * 1e6 for x in rounds), higher_is_better=False))
        else:
            ms.append(Measurement(Level.NET, f"{op}_busbw_gbs", subject, busbw(op, size, t, world), "GB/s", size,
                                  samples=tuple(busbw(op, size, x, world) for x in rounds)))
    size = int(doc.get("pair_bytes", 0))
    per_host: dict[str, list[float]] = {}
    host_rounds: dict[str, list[float]] = {}
    host_noise: dict[str, list[float]] = {}
    pairs = [tuple(p) + (0.0, [])[len(p) - 3:] if len(p) < 5 else tuple(p) for p in doc.get("pairs", [])]
    for a, b, t, spread, rounds in pairs:
        value = busbw("all_reduce", size, t, 2)
        samples = tuple(busbw("all_reduce", size, x, 2) for x in rounds)
        ms.append(Measurement(Level.NET, "link_busbw_gbs", f"link:{a}~{b}", value, "GB/s", size, float(spread),
                              samples=samples))
        for h in (a, b):
            per_host.setdefault(h, []).append(value)
            host_rounds.setdefault(h, []).extend(samples)
            host_noise.setdefault(h, []).append(float(spread))
    # a host's rounds pooled over its links (against its baseline), and round by round over the
    # links between the other hosts (against its peers): a throttled host's links are all low, a
    # healthy host's only the one that reaches the throttled host
    paired = host_contrast([(a, b, [busbw("all_reduce", size, x, 2) for x in rounds]) for a, b, _, _, rounds in pairs])
    ms += [Measurement(Level.NET, "host_links_busbw_gbs", f"host:{h}", float(np.median(v)), "GB/s", size,
                       float(np.median(host_noise[h])), samples=tuple(host_rounds[h]), paired=paired.get(h, ()))
           for h, v in per_host.items()]
    spread = doc.get("gemm_noise") or [0.0] * len(doc["gemm"])
    rounds_of = doc.get("gemm_samples") or [[] for _ in doc["gemm"]]
    ms += [Measurement(Level.NET, "gemm_fp32_gflops", f"rank:{r}", g, "GFLOP/s", 0, float(n), samples=tuple(k))
           for r, (g, n, k) in enumerate(zip(doc["gemm"], spread, rounds_of))]
    return ms


def net_measurements(nproc: int, sizes: list[int], seconds_per_size: float, gemm_n: int = 256,
                     timeout_s: float = 600.0) -> tuple[list[Measurement], str]:
    """Run ``nproc`` local ranks (processes of their own); returns the measurements and the
    backend used. A rank that fails or outlives ``timeout_s`` is an :class:`ArgusError` with
    its last words."""
    import subprocess
    import sys

    from argus.errors import ArgusError

    with tempfile.TemporaryDirectory(prefix="argus-health-") as tmp:
        out = os.path.join(tmp, "net.json")
        port = _free_port()
        spec = json.dumps({"world": nproc, "port": port, "sizes": sizes, "seconds": seconds_per_size,
                           "gemm_n": gemm_n, "out": out})
        procs = [subprocess.Popen([sys.executable, "-m", "argus.healthcheck.collectives", str(r), spec],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for r in range(nproc)]
        errors = []
        for r, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise ArgusError(f"healthcheck: rank {r} of the net level did not finish in {timeout_s:.0f} s") \
                    from None
            if proc.returncode != 0:
                errors.append(f"rank {r} exited {proc.returncode}: {err.strip()[-600:]}")
        if errors or not os.path.exists(out):
            raise ArgusError("healthcheck: the net level failed: " + ("; ".join(errors) or "no result"))
        doc = json.loads(Path(out).read_text())
    return to_measurements(doc), str(doc["backend"])


if __name__ == "__main__":  # one rank of the net level (started by net_measurements)
    import sys as _sys

    _spec = json.loads(_sys.argv[2])
    _rank_main(int(_sys.argv[1]), int(_spec["world"]), int(_spec["port"]), list(_spec["sizes"]),
               float(_spec["seconds"]), int(_spec["gemm_n"]), str(_spec["out"]))
