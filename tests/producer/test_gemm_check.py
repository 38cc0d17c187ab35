"""The GEMM check: silent on healthy GEMMs of every dtype and shape, loud on a flipped bit, and
its re-run tells a transient upset from a device that computes wrong."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from argus.producer import api  # noqa: E402
from argus.producer.gemm_check import (RERUN_PASSED, RERUN_REPRODUCED, SENSOR_GEMM, check_linear,  # noqa: E402
                                       rerun)
from argus.wire import Msg  # noqa: E402
from argus.workloads.train_transformer import Stage  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 3, 5), (256, 64, 96), (64, 1024, 32), (3, 4096, 8)])
def test_a_healthy_gemm_never_breaks_the_bound(dtype, m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    for scale in (1e-3, 1.0, 300.0):  # magnitudes that stress the relative bound both ways
        x = (torch.randn(m, k, generator=g) * scale).to(dtype)
        w = torch.randn(n, k, generator=g).to(dtype)
        b = torch.randn(n, generator=g).to(dtype)
        for bias in (b, None):
            got = check_linear(x, w, bias, F.linear(x, w, bias))
            assert got.checked and got.violations == [] and got.nonfinite == 0, (dtype, m, k, n, scale)


@pytest.mark.parametrize("m,k,n", [(256, 64, 96), (64, 1024, 32), (128, 512, 512)])
def test_under_autocast_the_inputs_rounding_is_in_the_bound(m, k, n):
    """fp32 inputs, bf16 output: the GEMM ran on the inputs rounded to bf16 — the bound allows
    for it (a worst case, so a value merely zeroed can hide inside it), and a flipped exponent
    bit that makes a value huge still breaks it."""
    g = torch.Generator().manual_seed(k)
    x, w, b = torch.randn(m, k, generator=g) * 3, torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.linear(x, w, b)
    assert y.dtype == torch.bfloat16 and check_linear(x, w, b, y).violations == []
    small = int(torch.nonzero(y.reshape(-1).abs() < 1).flatten()[0])  # its top exponent bit is clear
    assert check_linear(x, w, b, _flip(y, small, 14)).violations == [small % n]


def _flip(y, index, bit):
    y = y.clone()
    y.view(-1).view(torch.int32 if y.element_size() == 4 else torch.int16)[index] ^= 1 << bit
    return y


def test_a_flipped_bit_breaks_its_column_and_a_nan_is_seen():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(32, 64, generator=g), torch.randn(16, 64, generator=g), torch.randn(16, generator=g)
    y = F.linear(x, w, b)
    bad = _flip(y, 5 * 16 + 3, 27)  # row 5, column 3: an exponent bit
    got = check_linear(x, w, b, bad)
    assert got.violations == [3]
    nan = y.clone()
    nan[2, 7] = float("nan")
    got = check_linear(x, w, b, nan)
    assert got.violations == [7] and got.nonfinite == 1
    x[0, 0] = float("inf")  # a non-finite input spreads legitimately: nothing to say
    assert not check_linear(x, w, b, F.linear(x, w, b)).checked


def test_the_rerun_tells_a_transient_upset_from_a_device_that_computes_wrong(monkeypatch):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(8, 32, generator=g), torch.randn(4, 32, generator=g), torch.randn(4, generator=g)
    y = F.linear(x, w, b)
    upset = _flip(y, 0, 27)
    assert rerun(x, w, b, upset, check_linear(x, w, b, upset)) == RERUN_PASSED
    real = F.linear

    def broken(inp, weight, bias=None):  # this "device" gets the same element wrong every time
        return _flip(real(inp, weight, bias), 0, 27)

    monkeypatch.setattr(F, "linear", broken)
    wrong = F.linear(x, w, b)
    assert rerun(x, w, b, wrong, check_linear(x, w, b, wrong)) == RERUN_REPRODUCED


def test_one_layer_a_due_step_in_turn_and_none_in_a_compiled_process(traced):
    rt = traced.rt
    rt.hooks.replicas.every = 2
    rt.hooks.gemms.layers = 1
    torch.manual_seed(0)
    model = Stage(64, 32, 2, 1, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        x = torch.randint(0, 64, (2, 16))
        F.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
        opt.step()
        opt.zero_grad()
    fp = traced.read().tables[Msg.CHECKS]
    gemm = fp[fp["sensor"] == SENSOR_GEMM]
    assert gemm["step"].tolist() == [0, 2, 4] and (gemm["violations"] == 0).all() and (gemm["tensors"] == 1).all()
    assert len(set(gemm["elements"].tolist())) > 1  # a different layer each time
    assert not any(m._forward_hooks for m in model.modules() if type(m) is torch.nn.Linear)  # one-shot hooks
    assert api.runtime().active
    rt.hooks.gemms.compiled = lambda: True  # as when dynamo has compiled anything in this process
    before = len(gemm)
    x = torch.randint(0, 64, (2, 16))
    F.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
    opt.step()  # step 5
    opt.zero_grad()
    F.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
    opt.step()  # step 6: due, but not ours to hook
    fp = traced.read().tables[Msg.CHECKS]
    assert (fp["sensor"] == SENSOR_GEMM).sum() == before
