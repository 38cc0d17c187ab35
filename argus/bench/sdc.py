"""``argus bench sdc``: what the correctness sensors cost the training thread, measured.

The bench model of ``argus bench overhead`` (``train_transformer``'s stage, ``base`` size) trains
in this process; every step its training CPU time (``thread_time``: forward, backward, AdamW)
is measured, and beside it, on the same step, the CPU time of each sensor as the producer runs
it: the digest of the gradients before the optimizer step, of the parameters after it, and the
GEMM check of one linear layer's forward (in turn, as ``sdc_gemms=1`` does) — and of every layer
(``sdc_gemms=-1``, the e2e tests' setting). Step-time ratios on a shared 2-core machine would
bury a cost this size in noise; CPU seconds spent where they are spent do not.

Figures: each sensor's CPU as a share of a step's training CPU, per checked step, and the total
at the default period (``sdc_every``) — the share of the training CPU the defaults cost.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

__all__ = ["run", "add_arguments", "run_args"]

MODELS = {"base": dict(d=192, layers=4, seq=128, batch=4), "tiny": dict(d=128, layers=2, seq=64, batch=4)}


def run(steps: int = 40, model: str = "base", every: int | None = None) -> dict[str, Any]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from argus.producer.config import ProducerConfig
    from argus.producer.gemm_check import check_linear
    from argus.producer.replicas import digest
    from argus.workloads.train_transformer import Stage

    cfg = ProducerConfig()
    every = cfg.sdc_every if every is None else every
    size = MODELS[model]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = Stage(256, size["d"], 4, size["layers"], first=True, last=True)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    params = list(net.parameters())
    linears = [m for m in net.modules() if type(m) is nn.Linear]
    seen: dict[int, tuple[Any, Any]] = {}

    def keep(mod: Any, args: Any, out: Any) -> None:
        seen[id(mod)] = (args[0].detach(), out.detach())

    handles = [m.register_forward_hook(keep) for m in linears]
    train, grads, parms, one, every_layer = [], [], [], [], []
    for step in range(steps):
        x = torch.randint(0, 256, (size["batch"], size["seq"]))
        t0 = time.thread_time()
        loss = F.cross_entropy(net(x).view(-1, 256), x.view(-1))
        tf = time.thread_time()
        costs = []  # as the producer's hook does: right after the layer's forward, before anything changes
        with torch.no_grad():
            for m in linears:
                a, y = seen[id(m)]
                c0 = time.thread_time()
                if check_linear(a, m.weight, m.bias, y).violations:
                    raise RuntimeError(f"a healthy GEMM broke the bound: {m}")
                costs.append(time.thread_time() - c0)
        tb = time.thread_time()
        loss.backward()
        t1 = time.thread_time()
        with torch.no_grad():
            digest(p.grad for p in params if p.grad is not None)
        t2 = time.thread_time()
        opt.step()
        t3 = time.thread_time()
        with torch.no_grad():
            digest(params)
        t4 = time.thread_time()
        opt.zero_grad(set_to_none=True)
        if step < max(steps // 10, 1):  # warm-up
            continue
        train.append((tf - t0) + (t1 - tb) + (t3 - t2))
        grads.append(t2 - t1)
        parms.append(t4 - t3)
        one.append(costs[step % len(costs)])
        every_layer.append(sum(costs))
    for h in handles:
        h.remove()
    step_cpu = float(np.mean(train))

    def pct(xs: list[float]) -> float:
        return round(100 * float(np.mean(xs)) / step_cpu, 3)

    per_check = pct(grads) + pct(parms) + pct(one)
    return {"bench": "sdc", "model": model, "steps": steps, "params": sum(p.numel() for p in params),
            "linear_layers": len(linears), "train_step_cpu_ms": round(step_cpu * 1e3, 3),
            "grads_digest_pct": pct(grads), "params_digest_pct": pct(parms), "gemm_check_one_layer_pct": pct(one),
            "gemm_check_all_layers_pct": pct(every_layer), "per_checked_step_pct": round(per_check, 3),
            "sdc_every": every, "default_total_pct": round(per_check / max(every, 1), 3) if every else 0.0,
            "every_step_all_layers_pct": round(pct(grads) + pct(parms) + pct(every_layer), 3)}


def add_arguments(p: Any) -> None:
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--model", choices=sorted(MODELS), default="base")
    p.add_argument("--every", type=int, default=None, help="the sensors' period (default: the producer's)")


def run_args(args: Any) -> int:
    if args.steps < 2 or (args.every is not None and args.every < 0):
        print("argus bench sdc: --steps must be ≥ 2 and --every ≥ 0", file=sys.stderr)
        return 2
    print(json.dumps(run(args.steps, args.model, args.every)))
    return 0
