"""The semantic and CPU-op channels on a real model in this process (world of one, gloo)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from argus.producer import api  # noqa: E402
from argus.workloads.train_transformer import Stage  # noqa: E402


def _train(model, opt, steps, microbatches, ddp=None):
    net = ddp or model
    for _ in range(steps):
        for _mb in range(microbatches):
            x = torch.randint(0, 64, (2, 16))
            loss = F.cross_entropy(net(x).view(-1, 64), x.view(-1))
            loss.backward()
        opt.step()
        opt.zero_grad()


def test_steps_microbatches_and_module_phases(traced):
    model = Stage(64, 32, 2, 2, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, steps=4, microbatches=3)
    steps, ph, names = traced.steps, traced.phases, traced.phase_names()
    assert steps["step"].tolist() == [0, 1, 2, 3]
    assert (steps["end_ns"] > steps["start_ns"]).all()
    per = Counter((n, int(mb)) for n, s, mb in zip(names, ph["step"], ph["microbatch"]) if s == 2)
    for mb in range(3):
        assert per[("forward-compute", mb)] == 1 and per[("backward-compute", mb)] == 1
        assert per[("self_attention", mb)] == 2 and per[("mlp", mb)] == 2  # two blocks
    assert per[("optimizer", -1)] == 1
    # phases nest inside their step and are never negative
    bounds = {int(s): (a, b) for s, a, b in zip(steps["step"], steps["start_ns"], steps["end_ns"])}
    host = np.array([n in ("gc", "compile") for n in names])
    for step, start, dur in zip(ph["step"][~host], ph["start_ns"][~host], ph["dur_ns"][~host]):
        assert dur >= 0 and bounds[int(step)][0] <= start <= bounds[int(step)][1]
    # compute phases carry measured waiting (run-queue delay here), never more than their duration
    compute = ph[ph["category"] == 0]
    assert ((compute["wait_ns"] >= 0) & (compute["wait_ns"] <= compute["dur_ns"])).all()


def test_cpu_ops_are_sampled_one_step_in_n(traced):
    model = Stage(64, 32, 2, 1, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, steps=5, microbatches=1)
    ops = traced.kernels
    assert set(ops["step"].tolist()) == {2, 4}  # op_sample_every=2; step 0 (warm-up) never
    assert set(ops["kind"].tolist()) == {3}  # labelled cpu_op
    names = {traced.names[i] for i in ops["name"]}
    assert "aten::addmm" in names and "aten::linear" not in names  # ops doing the work, not wrappers
    assert (ops["dur_ns"] >= 0).all()
    step2 = traced.steps[traced.steps["step"] == 2][0]
    in2 = ops[ops["step"] == 2]
    assert (in2["start_ns"] >= step2["start_ns"] - 1_000_000).all()  # on the producer's clock
    assert (in2["start_ns"] <= step2["end_ns"] + 1_000_000).all()


def test_collectives_and_ddp_gradient_allreduce_are_timed(traced, tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model = Stage(64, 32, 2, 1, first=True, last=True)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        _train(model, opt, steps=2, microbatches=1, ddp=ddp)
        t = torch.ones(4)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    ph = traced.phases
    comm = Counter(n for n, c in zip(traced.phase_names(), ph["category"]) if c == 1)
    assert comm["dp-allreduce"] >= 2 + 2  # DDP buckets of two steps + our two calls
    assert comm["dp-barrier"] == 1
    assert set(ph["group_kind"][ph["category"] == 1].tolist()) == {4}  # group kind dp
    state = traced.reader.inflight.read()
    assert len(state.groups) == 1 and state.groups[0].issued == state.groups[0].completed >= 5


def test_user_phase_and_explicit_steps(traced):
    import argus

    with argus.phase("data-prep", category="host"):
        sum(range(1000))

    @argus.phase("eval")
    def evaluate():
        return 1

    evaluate()
    argus.step()
    argus.step()
    got = list(zip(traced.phase_names(), traced.phases["category"].tolist()))
    assert ("data-prep", 2) in got and ("eval", 0) in got
    assert traced.steps["step"].tolist() == [0, 1]


def test_a_failing_hook_disables_argus_not_training(traced, caplog):
    model = Stage(64, 32, 2, 1, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    traced.rt.recorder.phase = None  # any record now raises inside a hook
    _train(model, opt, steps=2, microbatches=1)  # must not raise
    assert not traced.rt.active and "disabled" in caplog.text


def test_bad_layout_warns_once_and_training_continues(monkeypatch, no_launcher_env):
    monkeypatch.setenv("ARGUS_LAYOUT", "pp=3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.warns(RuntimeWarning, match="tracing disabled") as record:
        assert api.init() is False
    assert len(record) == 1
    model = Stage(64, 32, 2, 1, first=True, last=True)
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=1, microbatches=1)
    api.shutdown()


def _manual_loop(steps: int) -> torch.nn.Module:
    """A loop without an optimizer (all-reduced gradients, SGD by hand), as the e2e ``manual``
    stack runs it."""
    model = Stage(64, 32, 2, 1, first=True, last=True)
    for _ in range(steps):
        x = torch.randint(0, 64, (2, 16))
        F.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
                p.grad = None
    return model


@pytest.mark.parametrize("collected", [False, True], ids=["model-alive", "model-collected"])
def test_a_loop_without_optimizer_ends_its_last_step_at_the_closing_barrier(traced, tmp_path, collected):
    import gc

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model = _manual_loop(steps=3)
        if collected:  # the function that held the model returned; the collector freed it
            del model
            gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    assert traced.steps["step"].tolist() == [0, 1, 2]
