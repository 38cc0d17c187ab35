"""Small, real, deterministic training jobs over the PyTorch training stacks an observer must
not disturb, with injectable real faults (gloo, CPU, torchrun with 2 or 4 ranks).

Nothing here knows about Argus: it is a plain PyTorch script. Each stack is here because it
changes what a tracer sees or where it hooks in:

* ``ddp``: DistributedDataParallel + AdamW, gradient accumulation with ``no_sync()`` on all but
  the last microbatch: bucketed all-reduces fired from autograd hooks, skipped microbatches.
* ``fsdp2``: ``fully_shard`` per block and on the root (DTensor parameters, all-gather before
  forward/backward, reduce-scatter of gradients, ``set_requires_gradient_sync`` accumulation);
  works as is on gloo/CPU in torch 2.13.
* ``pipeline``: ``torch.distributed.pipelining`` (PipelineStage + Schedule1F1B/GPipe) over 2
  stages, stage = rank // dp, dp = world / 2, with an explicit per-stage DP all-reduce and an
  explicit ``isend``/``irecv``/``batch_isend_irecv`` exchange each step (the last stage sends
  its loss to the first); the returned objects' type names are recorded.
* ``compile``: ``torch.compile`` (inductor) on each rank's own copy, one loss all-reduce per step.
* ``compile_ddp``: ``torch.compile(DDP(model))`` (DDPOptimizer splits the graph at buckets).
* ``checkpoint``: non-reentrant activation checkpointing per block under DDP (recompute in
  backward).
* ``manual``: no torch.optim: per-parameter ``dist.all_reduce`` of gradients and an SGD update
  under ``torch.no_grad()`` (no optimizer hooks to lean on).
* ``dataloader``: DDP fed by a DataLoader (2 forked workers, DistributedSampler) over a
  map-style dataset whose tokens are a function of the sample index.

Faults (``--fault``, on ``--fault-rank`` from step ``--fault-start``; all real effects):
* ``hang``: time.sleep(3600) right before backward; the others wait in their collective until
  the process group timeout (``--pg-timeout``) fails them;
* ``gc``: a full CPython ``gc.collect()`` over a large heap of cyclic dicts (sized at start-up
  so one collection takes ~0.5 s) just before the forward of steps S, S+3, S+6;
* ``recompile`` (compile stacks): from step S that rank's sequence length is one never seen,
  so dynamo/inductor recompile on that rank only;
* ``slow_data`` (dataloader): from step S that rank's ``__getitem__`` sleeps per sample;
* ``gradual``: that rank's attention is computed 1 + k * ``--gradual-reps`` times, k = 1, 2, 3...
  one more level every 4 steps (result unchanged); default 16 extra repetitions per level,
  since one repetition of this tiny attention costs ~0.13 ms a step, below the noise;
* ``varlen``: not a fault: every rank's sequence length varies per step (16..64) from
  (seed, rank, step), healthy variance that nothing should flag;
* ``kill``: that rank SIGKILLs itself between its forward and its backward (a crash mid-step:
  no exit hook, no flush); the others then fail in their collective;
* work outside every phase a tracer records, on that rank only (the others wait for it at the
  next gradient all-reduce): ``save`` — after the optimizer of every ``--fault-every``-th step
  from S, a synchronous ``torch.save`` of ``--save-mb`` MB and an fsync; ``gil_thread`` — from
  step S a background Python thread that holds the GIL in pure-Python loops; ``after_optimizer``
  — from step S, ``--extra-ms`` of matrix products after ``optimizer.step()`` returns;
* ``flip_param`` / ``flip_grad`` / ``flip_gemm`` (test-only silent data corruption): one bit of
  one value on that rank at step S — in a parameter, in the all-reduced gradient the optimizer
  is about to apply, or in the first linear layer's output throughout step S.

``--save-every N`` saves each rank's ``state_dict`` after every N-th step (``DIR/ckpt-…``) and
says so on stdout, path included, as trainers do.

Every rank writes ``DIR/rank{R}.json`` (losses as float.hex, parameter checksum, step times,
dynamo counters...); two runs of one command give bit-identical losses. Example:
``torchrun --standalone --nproc_per_node=2 -m argus.workloads.stacks --stack ddp --out /tmp/r``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from argus.workloads.affinity import pin_threads
from argus.workloads.train_transformer import Block, SelfAttention

if TYPE_CHECKING:
    from typing import Callable

    from torch.distributed.fsdp import FSDPModule

STACKS = ["ddp", "fsdp2", "pipeline", "compile", "compile_ddp", "checkpoint", "manual", "dataloader"]
FAULTS = ["none", "hang", "gc", "recompile", "slow_data", "varlen", "gradual", "kill", "flip_grad", "flip_param",
          "flip_gemm", "save", "gil_thread", "after_optimizer"]
COMPILED = {"compile", "compile_ddp"}


class LM(nn.Module):
    """A tiny next-token model, or a contiguous slice of it (pipeline stages)."""

    def __init__(self, a: argparse.Namespace, layers: int, first: bool = True, last: bool = True):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.d_model) if first else None
        self.blocks = nn.ModuleList(Block(a.d_model, a.heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(a.d_model) if last else None
        self.head = nn.Linear(a.d_model, a.vocab) if last else None
        self.ckpt = False  # activation checkpointing of each block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            if self.ckpt:
                from torch.utils.checkpoint import checkpoint
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.head is None:
            return x
        assert self.ln_f is not None  # made with the head (last stage)
        # (B*T, V) from a 2-D matmul: not a view (FSDP2 warns about views returned by the root)
        return self.head(self.ln_f(x).reshape(-1, x.shape[-1]))


class Faults:
    """Where each fault acts: before the step (gc, gradual), before backward (hang); the data
    plan (varlen, recompile, slow_data) is :meth:`seq_len` and :meth:`slow`."""

    _linear: Callable[..., torch.Tensor]  # the real F.linear while flip_gemm's broken one stands in

    def __init__(self, a: argparse.Namespace, rank: int):
        self.a, self.rank = a, rank
        self.on = a.fault not in ("none", "varlen") and rank == a.fault_rank
        self.gc_pauses: list[float] = []
        self.heap: list[dict] = []
        if self.on and a.fault == "gc":
            self._build_heap()

    def active(self, step: int) -> bool:
        return self.on and step >= self.a.fault_start

    def seq_len(self, data_rank: int, step: int) -> int:
        if self.a.fault == "varlen":  # healthy: every rank, every step
            g = torch.Generator().manual_seed(_mix(self.a.seed, data_rank, step, 7))
            return int(torch.randint(16, 65, (1,), generator=g))
        if self.a.fault == "recompile" and self.active(step):
            return self.a.seq + 8  # a shape this rank has never run
        return self.a.seq

    def slow(self, step: int) -> bool:
        return self.a.fault == "slow_data" and self.active(step)

    def _build_heap(self) -> None:
        """Cyclic gc-tracked garbage kept alive: ``--gc-dicts`` small dicts in 2-cycles. The
        default (2.2 M) makes one full collection take ~0.5 s on a 2-core machine (tuned by
        hand: a timing taken at start-up, while the other ranks start too, is unreliable)."""
        gc.disable()
        for i in range(self.a.gc_dicts // 2):
            x: dict = {"i": i}
            x["peer"] = {"peer": x}
            self.heap.append(x)
        gc.enable()
        # the heap now moves to the oldest generation: young collections skip it
        pause = _timed(gc.collect)
        print(f"[rank {self.rank}] gc heap: {2 * len(self.heap)} dicts, first full collection "
              f"{pause:.3f} s", flush=True)

    def before_step(self, step: int, model: nn.Module) -> None:
        a = self.a
        if a.fault == "flip_gemm" and self.on and step in (a.fault_start, a.fault_start + 1):
            self._broken_gemm(model, step == a.fault_start)
        if a.fault == "gradual":
            level = 1 + (step - a.fault_start) // 4 if self.active(step) else 0
            reps = 1 + a.gradual_reps * level  # attention computed reps times, result unchanged
            for m in model.modules():
                if isinstance(m, SelfAttention):
                    m.slowdown = reps
        if a.fault == "recompile" and self.on and step == a.fault_start:
            # a real recompilation, not a hit in the FX-graph/AOT caches of an earlier run (the
            # compiled C++ kernels may still be reused from inductor's on-disk code cache)
            import torch._functorch.config
            import torch._inductor.config
            torch._inductor.config.fx_graph_cache = False
            torch._functorch.config.enable_autograd_cache = False
        if a.fault == "gc" and self.active(step) and (step - a.fault_start) in (0, 3, 6):
            t = time.perf_counter()
            gc.collect()  # a real full collection over the heap, just before the forward
            self.gc_pauses.append(time.perf_counter() - t)
            print(f"[rank {self.rank}] step {step}: gc.collect() paused "
                  f"{self.gc_pauses[-1]:.3f} s", flush=True)

    def _broken_gemm(self, model: nn.Module, on: bool) -> None:
        """Silent data corruption, test-only: for one step this rank's "device" computes the
        first linear layer's output wrong — bit 27 (an exponent bit) of its first element, every
        time it is asked, as a defective unit would — and then computes right again."""
        if not on:
            F.linear = self._linear  # type: ignore[assignment]
            return
        target = next(m for m in model.modules() if type(m) is nn.Linear).weight
        real = self._linear = F.linear

        def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            y = real(x, weight, bias)
            if weight is target:
                with torch.no_grad():
                    y.view(-1).view(torch.int32)[0] ^= 1 << 27
            return y

        F.linear = linear  # type: ignore[assignment]
        print(f"[rank {self.rank}] step {self.a.fault_start}: linear layer {tuple(target.shape)} computes "
              f"element 0 wrong this step", flush=True)

    def before_optimizer(self, step: int, model: nn.Module) -> None:
        """Silent data corruption, test-only: one bit of one value flipped on this rank at
        ``--fault-start``, in the all-reduced gradient the optimizer is about to apply
        (``flip_grad``) or in a parameter (``flip_param``) — no error, the job goes on."""
        if self.a.fault not in ("flip_grad", "flip_param") or not self.on or step != self.a.fault_start:
            return
        p = next(p for p in model.parameters() if p.grad is not None)
        target = p.grad if self.a.fault == "flip_grad" else p.data
        assert target is not None  # p was picked for its gradient
        with torch.no_grad():
            target.view(-1).view(torch.int32)[0] ^= 1 << 20
        print(f"[rank {self.rank}] step {step}: flipped bit 20 of {self.a.fault[5:]} {tuple(p.shape)}[0]", flush=True)

    @staticmethod
    def _save_checkpoint(path: str, mb: float) -> None:
        """A checkpoint as jobs write one, in a function of its own: the fsync (a C call, no Python
        frame of its own) is sampled inside it, as a real job's save_checkpoint's is — inline in
        ``after_step``, a slow disk's fsync samples named nothing and outweighed torch.save's."""
        torch.save(torch.ones(int(mb * (1 << 20)) // 4), path)
        with open(path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.remove(path)

    def after_step(self, step: int) -> None:
        """Work outside the recorded phases, after the optimizer (``save``, ``after_optimizer``),
        and the busy thread's start (``gil_thread``)."""
        a = self.a
        if not self.active(step):
            return
        if a.fault == "save" and (step - a.fault_start) % max(a.fault_every, 1) == 0:
            t = time.perf_counter()
            self._save_checkpoint(os.path.join(a.out, f"extra-save-rank{self.rank}.pt"), a.save_mb)
            print(f"[rank {self.rank}] step {step}: saved {a.save_mb:.0f} MB and fsynced in "
                  f"{time.perf_counter() - t:.3f} s", flush=True)
        if a.fault == "after_optimizer":
            t = time.perf_counter()
            x = torch.ones(96, 96)
            while time.perf_counter() - t < a.extra_ms / 1000.0:
                x = torch.mm(x, x) / 96.0
        if a.fault == "gil_thread" and step == a.fault_start:
            import threading

            def spin() -> None:  # pure Python: holds the GIL but for the interpreter's switch interval
                n = 0
                while True:
                    n = (n * 31 + 7) % 1000003

            threading.Thread(target=spin, name="argus-test-gil-spinner", daemon=True).start()
            print(f"[rank {self.rank}] step {step}: a GIL-holding thread started", flush=True)

    def before_backward(self, step: int) -> None:
        if self.a.fault == "hang" and self.active(step):
            print(f"[rank {self.rank}] step {step}: hanging before backward", flush=True)
            time.sleep(3600)
        if self.a.fault == "kill" and self.active(step):
            print(f"[rank {self.rank}] step {step}: SIGKILL before backward", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _mix(*xs: int) -> int:
    h = 1469598103934665603
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 1099511628211) % (1 << 61)
    return h


def _tokens(a: argparse.Namespace, key: int, batch: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(key)
    return torch.randint(0, a.vocab, (batch, seq + 1), generator=g)


def _batch(a: argparse.Namespace, f: Faults, data_rank: int, step: int, mb: int, batch: int):
    x = _tokens(a, _mix(a.seed, data_rank, step, mb), batch, f.seq_len(data_rank, step))
    return x[:, :-1], x[:, 1:].reshape(-1)


class TokenDataset(torch.utils.data.Dataset):
    """Map-style: sample ``i`` is tokens drawn from (seed, i). ``plan`` gives this rank's sample
    its length and whether to stall (set before the workers fork, so they inherit it)."""

    def __init__(self, a: argparse.Namespace, n: int):
        self.a, self.n = a, n
        self.plan: dict[int, tuple[int, bool]] = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        seq, slow = self.plan.get(i, (self.a.seq, False))
        if slow:
            time.sleep(self.a.slow_data_ms / 1000.0)
        info = torch.utils.data.get_worker_info()
        x = _tokens(self.a, _mix(self.a.seed, 1 << 20, i), 1, seq)[0]
        return {"tokens": x, "worker": -1 if info is None else info.id, "pid": os.getpid()}


def _accumulate(a, f, step, forward, sync_ctx, batches) -> torch.Tensor:
    """Gradient accumulation over microbatches; ``sync_ctx(last)`` skips/enables grad sync."""
    total = torch.zeros(())
    for mb, (x, y) in enumerate(batches):
        with sync_ctx(mb == a.microbatches - 1):
            loss = F.cross_entropy(forward(x), y) / a.microbatches
            if mb == 0:
                f.before_backward(step)
            loss.backward()
        total += loss.detach()
    return total


def run_stack(a: argparse.Namespace, rank: int, world: int, f: Faults, res: dict) -> None:
    """Builds the stack, then trains ``a.steps`` steps, appending to ``res`` as it goes."""
    torch.manual_seed(a.seed)  # identical initialisation on every rank
    null = lambda last: contextlib.nullcontext()  # noqa: E731
    local_batches = lambda step: [  # noqa: E731
        _batch(a, f, rank, step, mb, a.batch) for mb in range(a.microbatches)]
    after = None  # extra work after the optimizer step (compile: the loss all-reduce)

    if a.stack == "pipeline":
        step_fn, model = _pipeline(a, rank, world, f, res)
    else:
        model = LM(a, a.layers)
        model.ckpt = a.stack == "checkpoint"
        params = list(model.parameters())  # (manual only: fully_shard swaps in DTensors)
        if a.stack in ("ddp", "checkpoint", "dataloader", "compile_ddp"):
            ddp = nn.parallel.DistributedDataParallel(model)
            forward = torch.compile(ddp) if a.stack == "compile_ddp" else ddp
            sync: Callable[[bool], contextlib.AbstractContextManager] = (  # noqa: E731
                lambda last: contextlib.nullcontext() if last else ddp.no_sync())
        elif a.stack == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            forward = model

            def sync(last: bool) -> contextlib.AbstractContextManager:
                cast("FSDPModule", model).set_requires_gradient_sync(last)  # reduce-scatter only on the last one
                return contextlib.nullcontext()
            res["fsdp_param_type"] = type(next(model.parameters())).__name__
        elif a.stack == "compile":
            forward, sync = torch.compile(model), null
            after = lambda loss: dist.all_reduce(loss.clone())  # noqa: E731
        else:  # manual
            forward, sync = model, null
        opt = None if a.stack == "manual" else torch.optim.AdamW(model.parameters(), lr=a.lr)
        batches = local_batches
        if a.stack == "dataloader":
            batches = _loader_batches(a, rank, world, f, res)

        def step_fn(step: int) -> torch.Tensor:
            loss = _accumulate(a, f, step, forward, sync, batches(step))
            if opt is not None:
                f.before_optimizer(step, model)
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:  # manual: explicit gradient averaging and SGD, no optimizer
                for p in params:
                    assert p.grad is not None  # after backward every parameter has one
                    dist.all_reduce(p.grad)
                    p.grad /= world
                with torch.no_grad():
                    for p in params:
                        assert p.grad is not None
                        # in place: p stays the Parameter (torch's stubs say __isub__ gives a Tensor)
                        p -= a.lr_sgd * p.grad  # type: ignore[misc]
                        p.grad = None
            if after is not None:
                after(loss)
            return loss

    for step in range(a.steps):
        if step == 1 and a.pin_cpu is not None:
            pin_threads(a.pin_cpu)
        t = time.perf_counter()
        f.before_step(step, model)
        loss = step_fn(step)
        res["step_times_s"].append(time.perf_counter() - t)
        res["losses"].append(float(loss).hex())
        res["seq_lens"].append(f.seq_len(rank if a.stack != "pipeline" else rank % (world // 2), step))
        res["steps_done"] = step + 1
        f.after_step(step)
        if a.save_every and (step + 1) % a.save_every == 0:
            _save(a, model, rank, step)
    res["param_checksum_hex"] = _checksum(model).hex()


def _save(a: argparse.Namespace, model: nn.Module, rank: int, step: int) -> None:
    """A checkpoint of this rank's state after ``step``, and the line trainers print for it."""
    path = os.path.join(a.out, f"ckpt-step{step:06d}-rank{rank}.pt")
    torch.save(model.state_dict(), path)
    sys.stdout.flush()  # one write of the whole line: ranks share the pipe, and print's pieces interleave
    os.write(sys.stdout.fileno(), f"[rank {rank}] saved checkpoint to {path}\n".encode())


def _checksum(model: nn.Module) -> float:
    parts = [(p.to_local() if hasattr(p, "to_local") else p).detach().double().sum()
             for p in model.parameters()]
    return float(torch.stack(parts).sum())


def _loader_batches(a, rank, world, f, res):
    """A DataLoader (2 forked workers, DistributedSampler); yields each step's microbatches."""
    from torch.utils.data import DataLoader, DistributedSampler
    per_step = a.microbatches * a.batch
    ds = TokenDataset(a, a.steps * per_step * world)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=a.seed,
                                 drop_last=True)
    for pos, i in enumerate(sampler):  # this rank's samples, in the order it will get them
        step = pos // per_step
        ds.plan[i] = (f.seq_len(rank, step), f.slow(step))
    loader = DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.num_workers,
                        prefetch_factor=a.prefetch if a.num_workers else None)
    it = iter(loader)
    pids: set[int] = set()
    res["dataloader"] = {"num_workers": a.num_workers, "main_pid": os.getpid(), "worker_pids": []}

    def batches(step: int) -> list:
        out = []
        for _ in range(a.microbatches):
            b = next(it)
            pids.update(int(p) for p in b["pid"])
            res["dataloader"]["worker_pids"] = sorted(pids)
            out.append((b["tokens"][:, :-1], b["tokens"][:, 1:].reshape(-1)))
        return out
    return batches


def _pipeline(a, rank, world, f, res):
    """pp=2 outermost (stage = rank // dp), dp = world // 2; PipelineStage + a schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    dp = world // 2
    stage, di = rank // dp, rank % dp
    peer = rank + dp if stage == 0 else rank - dp
    # new_group does not inherit init_process_group's timeout (it defaults to 30 min): pass it
    tmo = timedelta(seconds=a.pg_timeout)
    pp_groups = [dist.new_group([d, d + dp], timeout=tmo) for d in range(dp)]
    dp_groups = [dist.new_group(list(range(s * dp, (s + 1) * dp)), timeout=tmo) for s in range(2)]
    half = max(a.layers // 2, 1)
    mods = [LM(a, half, first=True, last=False), LM(a, half, first=False, last=True)]
    model = mods[stage]
    pstage = PipelineStage(model, stage, 2, torch.device("cpu"), group=pp_groups[di])
    loss_fn = lambda out, y: F.cross_entropy(out, y.reshape(-1))  # noqa: E731
    cls = Schedule1F1B if a.pp_schedule == "1f1b" else ScheduleGPipe
    sched = cls(pstage, n_microbatches=a.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    types = res["p2p_return_types"]
    res["pipeline"] = {"stage": stage, "dp": dp, "dp_index": di, "peer": peer,
                       "schedule": cls.__name__,
                       "loss_source": "local" if stage == 1 else "received from last stage (irecv)"}

    def step_fn(step: int) -> torch.Tensor:
        x, y = _batch(a, f, di, step, 0, a.batch * a.microbatches)  # split by the schedule
        f.before_backward(step)  # hang: before this rank's pipeline step (its fwd+bwd)
        if stage == 0:
            sched.step(x)
        else:
            losses: list[torch.Tensor] = []
            sched.step(target=y.view(x.shape), losses=losses)
        if dp > 1:  # data parallel across pipelines: explicit all-reduce per stage group
            for p in model.parameters():
                dist.all_reduce(p.grad, group=dp_groups[stage])
                p.grad /= dp
        opt.step()
        opt.zero_grad(set_to_none=True)
        # explicit point-to-point: the last stage sends its loss to the first stage...
        loss = torch.stack(losses).mean().detach().reshape(1) if stage == 1 else torch.zeros(1)
        work = dist.isend(loss, peer) if stage == 1 else dist.irecv(loss, peer)
        types.setdefault("isend" if stage == 1 else "irecv", type(work).__name__)
        assert work is not None  # None only for a rank outside the group
        work.wait()
        # ...and both exchange a step tag with batch_isend_irecv
        mine, theirs = torch.tensor([step, rank], dtype=torch.float32), torch.zeros(2)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer),
                                       dist.P2POp(dist.irecv, theirs, peer)])
        types.setdefault("batch_isend_irecv", type(reqs).__name__)
        types.setdefault("batch_isend_irecv[]", [type(r).__name__ for r in reqs])
        for r in reqs:
            r.wait()
        assert theirs.tolist() == [step, peer], theirs
        return loss[0]

    return step_fn, model


def _frame_codes() -> list[str]:
    """The code objects dynamo was asked to convert (``file:function``), sorted — less dynamo's own.

    Dynamo records every frame that reaches its callback, its own skipped ones too, and one of its
    own runs at a moment set by the garbage collector: the weakref callback that forgets a dead code
    object (``convert_frame.py:<lambda>``). Whether a collection falls inside a compiled region
    depends on every allocation in the process, so that frame comes and goes between identical
    runs, with Argus or without (CI saw it in a plain compile_ddp run and not in the traced one)."""
    try:
        import torch._dynamo
        from torch._dynamo.convert_frame import input_codes
        codes = [ref() for ref in input_codes.seen]
        own = os.path.dirname(torch._dynamo.__file__) + os.sep
    except Exception:  # noqa: BLE001 - another torch version
        return []
    return sorted(f"{os.path.basename(c.co_filename)}:{c.co_name}" for c in codes
                  if c is not None and not c.co_filename.startswith(own))


def _dynamo() -> dict | None:
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters, get_compilation_metrics
    metrics = get_compilation_metrics()
    reasons = [m.recompile_reason for m in metrics if m.recompile_reason]
    return {
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "graph_break_reasons": sorted(counters["graph_break"])[:5],
        "frames_total": counters["frames"]["total"], "frames_ok": counters["frames"]["ok"],
        "recompiles": len(reasons),  # torch 2.13 keeps no recompile counter: from the metrics
        "recompile_reasons": [r[:200] for r in reasons],
        "compilations": len(metrics),
        "frame_codes": _frame_codes(),
        "compile_time_s": sum(m.entire_frame_compile_time_s or 0.0 for m in metrics),
        "counters": {k: dict(counters[k]) for k in ("stats", "frames", "aot_autograd", "recompiles")
                     if k in counters},
    }


def _write(a: argparse.Namespace, res: dict, t0: float) -> None:
    res["final_loss_hex"] = res["losses"][-1] if res["losses"] else None
    res["dynamo"] = _dynamo()
    res["wall_s"] = time.perf_counter() - t0
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"rank{res['rank']}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(res, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", choices=STACKS, required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", required=True, help="directory for rank{R}.json")
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--lr-sgd", type=float, default=0.05, help="manual stack's SGD learning rate")
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-start", type=int, default=4)
    p.add_argument("--slow-data-ms", type=float, default=30.0, help="slow_data: sleep per sample")
    p.add_argument("--gradual-reps", type=int, default=16,
                   help="gradual: extra attention repetitions added every 4 steps")
    p.add_argument("--gc-dicts", type=int, default=2_200_000, help="gc: size of the cyclic heap")
    p.add_argument("--fault-every", type=int, default=3, help="save: every N-th step from --fault-start")
    p.add_argument("--save-mb", type=float, default=200.0, help="save: MB written and fsynced")
    p.add_argument("--extra-ms", type=float, default=15.0, help="after_optimizer: ms of matrix products")
    p.add_argument("--num-workers", type=int, default=2, help="dataloader stack's workers")
    p.add_argument("--prefetch", type=int, default=2, help="dataloader: batches each worker keeps ready")
    p.add_argument("--pp-schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.add_argument("--pg-timeout", type=float, default=1800.0, help="process group timeout, s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0, help="save a checkpoint after every N-th step (0: never)")
    p.add_argument("--pin-cpu", type=int, default=None,
                   help="after the first step (warm-up, compilation on every core) run all of this process's "
                        "threads on this CPU: ranks that share it share its speed in the steps compared")
    a = p.parse_args(argv)
    if a.fault == "recompile" and a.stack not in COMPILED:
        p.error("--fault recompile needs --stack compile or compile_ddp")
    if a.fault == "slow_data" and a.stack != "dataloader":
        p.error("--fault slow_data needs --stack dataloader")
    if a.fault == "gradual" and a.stack in COMPILED:
        p.error("--fault gradual changes a Python int the compiled graph is guarded on: "
                "it would recompile at each change; use a non-compile stack")
    if a.stack == "pipeline" and a.fault == "varlen":
        p.error("pipeline: PipelineStage infers its p2p buffer shapes at the first step and "
                "keeps them, so a new sequence length fails (torch 2.13: 'Expected input "
                "batch_size (192) to match target batch_size (172)')")
    if a.batch % a.microbatches and a.stack == "pipeline":
        p.error("pipeline: --batch must be divisible by --microbatches")

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=a.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.stack == "pipeline" and world % 2:
        p.error("pipeline needs an even number of ranks (2 stages)")
    res: dict = {"rank": rank, "world_size": world, "stack": a.stack, "fault": a.fault,
                 "fault_rank": a.fault_rank, "fault_start": a.fault_start, "seed": a.seed,
                 "steps_done": 0, "losses": [], "step_times_s": [], "seq_lens": [],
                 "p2p_return_types": {}, "torch": torch.__version__,
                 "threads": torch.get_num_threads()}
    f = Faults(a, rank)
    try:
        run_stack(a, rank, world, f, res)
    except BaseException as exc:  # noqa: BLE001 - hang: the waiting ranks time out here; keep what they did
        res["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        res["gc_pauses_s"] = f.gc_pauses
        _write(a, res, t0)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    res["gc_pauses_s"] = f.gc_pauses
    _write(a, res, t0)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"done": True, "stack": a.stack, "fault": a.fault, "world": world,
                          "final_loss_hex": res["final_loss_hex"],
                          "wall_s": round(res["wall_s"], 2)}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # gloo can abort in destroy_process_group at exit


if __name__ == "__main__":
    main()
