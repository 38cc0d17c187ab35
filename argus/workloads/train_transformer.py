"""A small transformer trained with torch.distributed (gloo, CPU), with injectable faults.

This is real training — real processes, real collectives — used by ``argus demo`` and the
end-to-end tests. Nothing in it knows about Argus: run it under ``argus run`` to trace it.

Modes: ``ddp`` (data parallel, DistributedDataParallel with gradient accumulation over
microbatches) and ``pipeline`` (two stages exchanging activations and gradients with
send/recv per microbatch, data parallel across pipelines through per-stage groups).

Faults (on ``--fault-rank``, from ``--fault-start``):
* ``compute``: the attention of that rank repeats its matmuls ``--slowdown`` times (a slow GPU);
* ``stall``: a host-side stall of ``--stall-ms`` inside one microbatch's backward, every
  third step: with ``--stall-kind jit`` (default) the host really compiles — TorchScript
  functions never seen before, until the time is up (production case 4: runtime compilation
  while the device idles); with ``sleep`` it just sleeps (a cause no stack can name);
* ``none``: healthy. (Link faults are made outside, by throttling the rank's network.)

Launch with torchrun, or one process per rank with RANK/WORLD_SIZE/MASTER_ADDR set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import cast

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from argus.workloads.affinity import pin_threads


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, slowdown: int = 1):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.heads = heads
        self.slowdown = slowdown

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        for _ in range(self.slowdown - 1):  # a slow device: the same work again (result unchanged)
            y = y + 0.0 * F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Stage(nn.Module):
    """A contiguous slice of the model (the whole model when there is one stage)."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, first: bool, last: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, d) if first else None
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


def _compile_for(ms: float) -> None:
    """Compile fresh TorchScript functions for ``ms``: real JIT work, each one new (no cache),
    its garbage collected before returning (else the steps after a stall run slow too)."""
    import gc
    import linecache
    import sys
    import types

    start = time.perf_counter()
    # the stall lasts ``ms`` in all: keep back what the collection at its end took last time
    deadline = start + ms / 1000.0 - getattr(_compile_for, "gc_s", 0.0)
    while time.perf_counter() < deadline:
        count = getattr(_compile_for, "count", 0) + 1
        setattr(_compile_for, "count", count)  # a function attribute: the names stay new across stalls
        name = f"argus_jit_{os.getpid()}_{count}"
        src = ("import torch\n" f"def fused_{count}(x: torch.Tensor) -> torch.Tensor:\n"
               + "".join(f"    x = x * {j + 1} + torch.relu(x)\n" for j in range(40)) + "    return x\n")
        filename = f"<{name}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        module = types.ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module
        exec(compile(src, filename, "exec"), module.__dict__)
        torch.jit.script(module.__dict__[f"fused_{count}"])  # compiled, not run: no device work
        del sys.modules[name], linecache.cache[filename]  # the source is needed only while compiling
    t = time.perf_counter()
    gc.collect()  # the compiler's garbage is collected inside the stall, not in the steps after it
    setattr(_compile_for, "gc_s", time.perf_counter() - t)


def _stall_hook(ms: float, kind: str = "jit"):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        if kind == "jit":
            _compile_for(ms)  # the host compiles while the device waits
        else:
            time.sleep(ms / 1000.0)
        return grad
    return hook


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["ddp", "pipeline"], default="ddp")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--fault", choices=["none", "compute", "stall"], default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-start", type=int, default=8)
    p.add_argument("--slowdown", type=int, default=4)
    p.add_argument("--stall-ms", type=float, default=400.0)
    p.add_argument("--stall-kind", choices=["jit", "sleep"], default="jit",
                   help="what the host does during a stall: compile TorchScript, or sleep")
    p.add_argument("--stage-layers", default="",
                   help="pipeline: layers of each stage, e.g. '1,4' (default: --layers on each); an uneven "
                        "partition is a long stage")
    p.add_argument("--seq-jitter", type=float, default=0.0,
                   help="each microbatch's sequence length × exp(N(0, σ)), drawn from (step, microbatch, "
                        "replica): uneven inputs on every worker, the same on both stages of a pipeline line")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--progress", action="store_true", help='rank 0 prints {"step": n} after each step')
    p.add_argument("--stats", help="directory: each rank writes rank<r>.json with its step times and RSS")
    p.add_argument("--profile", action="store_true", help="keep torch.profiler (CPU activities) on all run")
    p.add_argument("--pin-cpu", type=int, default=None,
                   help="once the process group is up, run all of this process's threads on this CPU (the "
                        "imports ran on every core): ranks that share it share its speed in every step")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    if args.pin_cpu is not None:
        pin_threads(args.pin_cpu)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)
    stats = _Stats(args, rank)
    args.on_step = stats.on_step
    profiler = None
    if args.profile:  # the comparison point: a profiler kept on, as users would to catch a fault
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        profiler.__enter__()
    if args.mode == "pipeline":
        if world % 2:
            raise SystemExit("pipeline mode needs an even number of ranks (2 stages)")
        _pipeline(args, rank, world)
    else:
        _ddp(args, rank, world)
    stats.write()
    dist.barrier()
    if rank == 0:
        print(json.dumps({"done": True, "steps": args.steps, "world": world}), flush=True)
    os._exit(0)  # gloo can abort at interpreter exit (ENVIRONMENT.md)


def _seq_len(args: argparse.Namespace, step: int, mb: int, replica: int) -> int:
    """This microbatch's sequence length: ``--seq``, or with ``--seq-jitter`` a draw from
    (step, microbatch, replica) that every stage of the replica's pipeline line makes alike."""
    if args.seq_jitter <= 0:
        return args.seq
    g = torch.Generator().manual_seed(1_000_003 * step + 1009 * mb + replica + 17)
    factor = float(torch.exp(torch.randn((), generator=g) * args.seq_jitter))
    return int(min(max(round(args.seq * factor), 8), 4 * args.seq))


def _stage_layers(args: argparse.Namespace, stage: int) -> int:
    if not args.stage_layers:
        return args.layers
    parts = [int(x) for x in args.stage_layers.split(",")]
    return parts[stage] if stage < len(parts) else parts[-1]


def _faulty(args: argparse.Namespace, rank: int, step: int) -> bool:
    return args.fault != "none" and rank == args.fault_rank and step >= args.fault_start


def _ddp(args: argparse.Namespace, rank: int, world: int) -> None:
    model = Stage(args.vocab, args.d_model, args.heads, args.layers, first=True, last=True)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for step in range(args.steps):
        slow = args.slowdown if args.fault == "compute" and _faulty(args, rank, step) else 1
        for block in model.blocks:
            cast(Block, block).attn.slowdown = slow
        for mb in range(args.microbatches):
            x = torch.randint(0, args.vocab, (args.batch, _seq_len(args, step, mb, rank)))
            last = mb == args.microbatches - 1
            ctx = ddp.no_sync() if not last else _Null()
            with ctx:
                logits = ddp(x)
                if args.fault == "stall" and _faulty(args, rank, step) and step % 3 == 0 and mb == 1:
                    logits.register_hook(_stall_hook(args.stall_ms, args.stall_kind))
                loss = F.cross_entropy(logits.view(-1, args.vocab), x.view(-1)) / args.microbatches
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _report(args, rank, step)


def _report(args: argparse.Namespace, rank: int, step: int) -> None:
    args.on_step(step)
    if args.progress and rank == 0:
        print(json.dumps({"step": step + 1, "of": args.steps}), flush=True)


class _Stats:
    """Step wall times and resident memory, measured by the job itself (for ``bench overhead``)."""

    def __init__(self, args: argparse.Namespace, rank: int):
        self.dir = args.stats
        self.rank = rank
        self.steps = args.steps
        self.step_s: list[float] = []
        self.rss_mb: list[tuple[int, float]] = []
        self.last = time.perf_counter()

    def on_step(self, step: int) -> None:
        if not self.dir:
            return
        now = time.perf_counter()
        self.step_s.append(now - self.last)
        self.last = now
        if (step + 1) % max(self.steps // 20, 1) == 0:
            self.rss_mb.append((step + 1, _rss_mb()))

    def write(self) -> None:
        if self.dir:
            import resource

            usage = resource.getrusage(resource.RUSAGE_SELF)
            doc = {"rank": self.rank, "step_s": self.step_s, "rss_mb": self.rss_mb,
                   "peak_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}
            with open(os.path.join(self.dir, f"rank{self.rank}.json"), "w") as fh:
                json.dump(doc, fh)


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def _pipeline(args: argparse.Namespace, rank: int, world: int) -> None:
    """Two stages; stage = rank // (world/2); data parallel within each stage."""
    half = world // 2
    stage, dp_index = rank // half, rank % half
    peer = rank + half if stage == 0 else rank - half
    groups = [dist.new_group(list(range(s * half, (s + 1) * half))) for s in (0, 1)]
    model = Stage(args.vocab, args.d_model, args.heads, _stage_layers(args, stage), first=stage == 0, last=stage == 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        slow = args.slowdown if args.fault == "compute" and _faulty(args, rank, step) else 1
        for block in model.blocks:
            cast(Block, block).attn.slowdown = slow
        for mb in range(args.microbatches):
            seq = _seq_len(args, step, mb, dp_index)
            shape = (args.batch, seq, args.d_model)
            tokens = torch.randint(0, args.vocab, (args.batch, seq), generator=torch.Generator().manual_seed(
                step * 1000 + mb * 10 + dp_index))
            if stage == 0:
                act = model(tokens)
                dist.send(act.detach(), peer)
                grad = torch.empty(shape)
                dist.recv(grad, peer)
                if args.fault == "stall" and _faulty(args, rank, step) and step % 3 == 0 and mb == 1:
                    act.register_hook(_stall_hook(args.stall_ms, args.stall_kind))
                act.backward(grad)
            else:
                inp = torch.empty(shape)
                dist.recv(inp, peer)
                inp.requires_grad_(True)
                logits = model(inp)
                if args.fault == "stall" and _faulty(args, rank, step) and step % 3 == 0 and mb == 1:
                    logits.register_hook(_stall_hook(args.stall_ms, args.stall_kind))
                loss = F.cross_entropy(logits.view(-1, args.vocab), tokens.view(-1)) / args.microbatches
                loss.backward()
                assert inp.grad is not None  # inp requires grad and the loss was computed from it
                dist.send(inp.grad, peer)
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, group=groups[stage])
                param.grad /= half
        opt.step()
        opt.zero_grad(set_to_none=True)
        _report(args, rank, step)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
