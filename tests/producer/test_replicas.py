"""The correctness sensors on a real model and optimizer in this process."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from argus.producer import api  # noqa: E402
from argus.producer.gemm_check import SENSOR_GEMM  # noqa: E402
from argus.producer.replicas import SENSOR_GRADS, SENSOR_PARAMS, digest  # noqa: E402
from argus.wire import Msg  # noqa: E402
from argus.workloads.train_transformer import Stage  # noqa: E402


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return Stage(64, 32, 2, 1, first=True, last=True)


def test_the_digest_is_the_bits_and_only_the_bits():
    a = [torch.randn(16, 8), torch.randn(5, dtype=torch.bfloat16), torch.arange(6)]
    same = [t.clone() for t in a]
    assert digest(a) == digest(same)
    assert digest(a)[:2] == (3, 16 * 8 + 5 + 6) and digest(a)[3] == 0
    flipped = [t.clone() for t in a]
    flipped[0].view(-1).view(torch.int32)[37] ^= 1 << 3  # one low mantissa bit: a value barely changed
    assert digest(flipped)[2] != digest(a)[2]
    assert digest(list(reversed(a)))[2] == digest(a)[2]  # a sum of words: where a bit sits is not its concern
    big = [torch.randn(3, 5), torch.randn(7)]  # odd byte counts are padded, not dropped
    moved = [t.clone() for t in big]
    moved[1].view(torch.int32)[-1] ^= 1 << 30
    assert digest(moved)[2] != digest(big)[2]
    bad = [t.clone() for t in a]
    bad[0][1, 1], bad[0][2, 2] = float("nan"), float("inf")
    assert digest(bad)[3] == 2
    assert digest([a[0].t()])[:2] == (1, 128)  # a strided view is read, not refused


def test_a_sharded_tensor_is_left_out():
    class Shard:
        def is_replicate(self):
            return False

    class Replicate:
        def is_replicate(self):
            return True

    class FakeDTensor:
        def __init__(self, t, placement):
            self.t, self.placements = t, (placement,)

        def to_local(self):
            return self.t

    t = torch.randn(4)
    assert digest([FakeDTensor(t, Shard())])[0] == 0
    assert digest([FakeDTensor(t, Replicate())]) == digest([t])


def _train(model, opt, steps):
    for _ in range(steps):
        x = torch.randint(0, 64, (2, 16))
        F.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
        opt.step()
        opt.zero_grad()


def test_gradients_before_and_parameters_after_each_due_step(traced):
    traced.rt.hooks.replicas.every = 2
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    _train(model, opt, steps=5)
    fp = traced.read().tables[Msg.CHECKS]
    fp = fp[fp["sensor"] != SENSOR_GEMM]  # (the GEMM checks of the same steps: tests/producer/test_gemm_check.py)
    got = sorted((int(r["step"]), int(r["sensor"])) for r in fp)
    assert got == [(s, k) for s in (0, 2, 4) for k in (SENSOR_GRADS, SENSOR_PARAMS)]
    n = len(list(model.parameters()))
    assert set(fp["tensors"].tolist()) == {n} and (fp["nonfinite"] == 0).all()
    # the parameters' digest after step 4 is the model's as it stands
    last = fp[(fp["step"] == 4) & (fp["sensor"] == SENSOR_PARAMS)]
    assert int(last["digest"][0]) == digest(list(model.parameters()))[2]
    # a replica trained on the same data holds the same bits: the same digests
    traced.rt.hooks.replicas.every = 1
    twin, other = _model(), _model()
    for m in (twin, other):
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(7)
        _train(m, o, steps=1)
    assert digest(list(twin.parameters())) == digest(list(other.parameters()))


def test_off_means_no_record_and_a_failing_read_stops_only_the_sensor(traced, caplog):
    sensor = traced.rt.hooks.replicas
    sensor.every = 0
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(model, opt, steps=2)
    assert not len(traced.read().tables[Msg.CHECKS])
    sensor.every = 1

    class Broken:
        param_groups = [{"params": [object()]}]

    sensor.params(0, Broken())
    assert sensor.every == 0 and "correctness sensor off" in caplog.text
    assert api.runtime().active  # tracing goes on
