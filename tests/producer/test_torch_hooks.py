"""The semantic and CPU-op channels on a real model in this process (world of one, gloo)."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from argus.producer import api  # noqa: E402
from argus.workloads.train_transformer import Stage  # noqa: E402


@pytest.fixture()
def traced(monkeypatch):
    """Argus on, pointed at no processor, never flushing (so the buffers can be inspected)."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "ARGUS_LAYOUT"):
        monkeypatch.delenv(var, raising=False)
    sock = os.path.join(tempfile.mkdtemp(prefix="argus-h-"), "none.sock")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert api.init(socket_path=sock, flush_interval_s=3600.0, kernels="cpu_ops", op_sample_every=2)
    yield api.runtime()
    api.shutdown()


def _names(rec):
    return {v: k for k, v in rec.names.items()}


def _train(model, opt, steps, microbatches, ddp=None):
    net = ddp or model
    for _ in range(steps):
        for mb in range(microbatches):
            x = torch.randint(0, 64, (2, 16))
            loss = F.cross_entropy(net(x).view(-1, 64), x.view(-1))
            loss.backward()
        opt.step()
        opt.zero_grad()


def test_steps_microbatches_and_module_phases(traced):
    model = Stage(64, 32, 2, 2, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, steps=4, microbatches=3)
    rec, names = traced.recorder, _names(traced.recorder)
    assert [s for s, _, _ in rec.steps] == [0, 1, 2, 3]
    assert all(end > start for _, start, end in rec.steps)
    rows = [(r[0], names[r[4]], r[3]) for r in rec.phases]
    per = Counter((n, mb) for s, n, mb in rows if s == 2)
    for mb in range(3):
        assert per[("forward-compute", mb)] == 1 and per[("backward-compute", mb)] == 1
        assert per[("self_attention", mb)] == 2 and per[("mlp", mb)] == 2  # two blocks
    assert per[("optimizer", -1)] == 1
    # phases nest inside their step and are never negative
    bounds = {s: (a, b) for s, a, b in rec.steps}
    for step, start, dur, *_, wait in rec.phases:
        assert dur >= 0 and bounds[step][0] <= start <= bounds[step][1]
    # compute phases carry measured waiting (run-queue delay here), never more than their duration
    compute = [r for r in rec.phases if r[5] == 0]
    assert all(0 <= r[7] <= r[2] for r in compute)


def test_cpu_ops_are_sampled_one_step_in_n(traced):
    model = Stage(64, 32, 2, 1, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, steps=4, microbatches=1)
    names = _names(traced.recorder)
    ops = list(traced.recorder.kernels)
    steps = {r[0] for r in ops}
    assert steps == {0, 2}  # op_sample_every=2
    assert {r[6] for r in ops} == {3}  # labelled cpu_op
    assert any("addmm" in names[r[3]] for r in ops)
    assert all(r[2] >= 0 for r in ops)


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
    names = _names(traced.recorder)
    comm = Counter(names[r[4]] for r in traced.recorder.phases if r[5] == 1)
    assert comm["dp-allreduce"] >= 2 + 2  # DDP buckets of two steps + our two calls
    assert comm["dp-barrier"] == 1
    assert {r[6] for r in traced.recorder.phases if r[5] == 1} == {4}  # group kind dp


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
    names = _names(traced.recorder)
    got = [(names[r[4]], r[5]) for r in traced.recorder.phases]
    assert ("data-prep", 2) in got and ("eval", 0) in got
    assert [s for s, _, _ in traced.recorder.steps] == [0, 1]


def test_a_failing_hook_disables_argus_not_training(traced, caplog):
    model = Stage(64, 32, 2, 1, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    traced.recorder.phase = None  # any record now raises inside a hook
    _train(model, opt, steps=2, microbatches=1)  # must not raise
    assert not traced.active and "disabled" in caplog.text


def test_bad_layout_warns_once_and_training_continues(monkeypatch):
    monkeypatch.setenv("ARGUS_LAYOUT", "pp=3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.warns(RuntimeWarning, match="tracing disabled") as record:
        assert api.init() is False
    assert len(record) == 1
    model = Stage(64, 32, 2, 1, first=True, last=True)
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=1, microbatches=1)
    api.shutdown()
