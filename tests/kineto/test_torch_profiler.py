"""A real multi-rank torch.profiler run (CPU, gloo, 4 processes) exported with
``export_chrome_trace`` and imported: ranks, steps and phases must come out right."""

import os
import socket
from collections import Counter

import pytest

from argus.cli.main import main
from argus.store import Store

torch = pytest.importorskip("torch")

WORLD = 4
STEPS = 5  # the schedule below records ProfilerStep#2..#4
PHASES = ("forward", "backward", "dp-allreduce", "optimizer")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def ready(prof) -> None:
        prof.export_chrome_trace(os.path.join(out, f"trace_rank{rank}.json"))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=ready) as prof:
        for _ in range(STEPS):
            x = torch.randn(16, 32)
            with record_function("forward"):
                loss = model(x).pow(2).mean()
            with record_function("backward"):
                loss.backward()
            with record_function("dp-allreduce"):
                dist.all_reduce(torch.ones(4))
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
    dist.barrier()
    os._exit(0)  # gloo sometimes aborts at interpreter exit (ENVIRONMENT.md)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("torch_traces")
    mp.spawn(_worker, args=(WORLD, _free_port(), str(out)), nprocs=WORLD, join=True)
    return out


def test_torch_profiler_traces_import_with_ranks_steps_and_phases(traces, tmp_path, capsys):
    assert sorted(p.name for p in traces.iterdir()) == [f"trace_rank{r}.json" for r in range(WORLD)]
    store = tmp_path / "S"
    # dp is left out: it comes from distributedInfo.world_size (4 = tp 2 × dp 2)
    assert main(["ingest", "kineto", str(traces), "--out", str(store), "--layout", "tp=2"]) == 0
    attempt = Store.open(store).attempt()
    assert str(attempt.layout) == "tp=2,cp=1,ep=1,dp=2,pp=1"
    topo = attempt.topology()
    assert len(set(topo.hosts.tolist())) == 1 and all(u.startswith("cpu-") for u in topo.gpu_uuids)  # host_name

    steps = attempt.read("steps").to_pylist()
    assert sorted((r["rank"], r["step"]) for r in steps) == [(r, s) for r in range(WORLD) for s in (2, 3, 4)]
    assert all(r["end_ns"] > r["start_ns"] for r in steps)

    phases = attempt.read("phases").to_pylist()
    per_rank_step = Counter((r["rank"], r["step"], r["name"]) for r in phases if r["name"] in PHASES)
    assert per_rank_step == Counter({(r, s, n): 1 for r in range(WORLD) for s in (2, 3, 4) for n in PHASES})
    kinds = {(r["name"], r["category"], r["group_kind"]) for r in phases}
    assert {("forward", "compute", ""), ("backward", "compute", ""), ("optimizer", "compute", ""),
            ("dp-allreduce", "comm", "dp")} <= kinds
    # DDP's gradient all-reduce runs in the default group: all 4 ranks = the world under tp=2,dp=2
    assert ("gloo:all_reduce", "comm", "world") in kinds
    assert all(r["dur_ns"] > 0 and r["microbatch"] == -1 for r in phases)
    step_span = {(r["rank"], r["step"]): (r["start_ns"], r["end_ns"]) for r in steps}
    for r in phases:
        lo, hi = step_span[(r["rank"], r["step"])]
        assert lo <= r["start_ns"] < hi
