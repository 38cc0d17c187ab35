"""The algebraic check of a sampled GEMM: a linear layer's output against its inputs.

For ``y = x Wᵀ + b`` the column sums of the output are fixed by the inputs: ``1ᵀy = (1ᵀx) Wᵀ
+ M·b``. The right side costs O(MK + KN) instead of the GEMM's O(MNK) and is computed in
float64, so a wrong output value shows as a column whose sums differ — by more than the GEMM's
own rounding may explain. That bound is rigorous, not tuned: each output element of a length-K
reduction is within ``γ_K·(|x||W|ᵀ)`` of the exact value (``γ_K = K·u/(1 − K·u)``, ``u`` the unit
round-off of the accumulation: fp32 for fp32/bf16/fp16 inputs, TF32's where CUDA allows it),
plus the inputs' rounding where autocast cast them to a narrower output dtype, plus the
output's own rounding. A healthy GEMM never breaks it; a flipped bit in a
significant place does.

A column that breaks it is checked again at once, deterministically: the same GEMM re-run on the
same device (correct this time: a transient upset; the same wrong bits: the device computes it
wrong), and in the latter case those columns computed exactly in float64 on the host — the
healthy reference — which must disagree with the device for the finding to stand.

One layer's forward is checked per due step (``sdc_gemms`` layers: -1 every one), armed from the
root module's first forward of the step with a one-shot hook. Never where anything is compiled:
a hook added inside a compiled model would change its graphs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["GemmCheck", "check_linear", "GemmSensor", "SENSOR_GEMM", "RERUN_NONE", "RERUN_PASSED",
           "RERUN_REPRODUCED", "RERUN_REFERENCE_AGREES"]

log = logging.getLogger("argus.producer")
SENSOR_GEMM = 2  # code of ``argus.wire.SENSORS``
RERUN_NONE, RERUN_PASSED, RERUN_REPRODUCED, RERUN_REFERENCE_AGREES = 0, 1, 2, 3  # ``argus.wire.RERUNS``
_BLOCK = 1 << 22  # float64 elements of a weight block converted at once (32 MiB)
_REFERENCE_COLUMNS = 8  # columns recomputed on the host after a reproduced violation


@dataclass(frozen=True, slots=True)
class GemmCheck:
    elements: int  # output elements covered
    nonfinite: int  # NaN/Inf in the output (with finite inputs)
    violations: list[int]  # output columns whose sums broke the bound
    checked: bool  # False: the bound says nothing here (a reduction too long for the dtype, non-finite inputs)


def _gamma(k: int, acc: float, out: float, cast: bool) -> float:
    """The relative bound on a length-``k`` dot product's error: accumulation, plus the inputs'
    rounding to the output's dtype where they were cast to it first (autocast: fp32 ``x`` and
    ``W`` in, bf16 ``y`` out — each product then off by up to 2 units of the output's round-off)."""
    return k * acc / (1 - k * acc) + (2 * out + out * out if cast else 0.0)


def _cast(x: Any, weight: Any, y: Any) -> bool:
    return x.dtype != y.dtype or weight.dtype != y.dtype


def _unit_roundoff(x: Any, y: Any) -> tuple[float, float]:
    """(accumulation, output) unit round-off of a GEMM of ``x`` giving ``y``."""
    import torch

    if y.dtype == torch.float64:
        return 2.0 ** -53, 2.0 ** -53
    acc = 2.0 ** -24  # fp32 accumulation, also for bf16/fp16 inputs
    if y.is_cuda:
        mm = torch.backends.cuda.matmul
        if y.dtype == torch.float32 and mm.allow_tf32:
            acc = 2.0 ** -11
        if y.dtype == torch.float16 and mm.allow_fp16_reduced_precision_reduction:
            acc = 2.0 ** -11
        if y.dtype == torch.bfloat16 and mm.allow_bf16_reduced_precision_reduction:
            acc = 2.0 ** -8
    return acc, float(torch.finfo(y.dtype).eps) / 2


def _bound_terms(x2: Any, weight: Any, bias: Any) -> tuple[Any, Any]:
    """(1ᵀx)Wᵀ + M·b and (1ᵀ|x|)|W|ᵀ + M·|b|, in float64, a block of W's rows at a time."""
    import torch

    m, k = x2.shape
    xs = x2.sum(0, dtype=torch.float64)
    xa = x2.abs().sum(0, dtype=torch.float64)
    n = weight.shape[0]
    expect = torch.empty(n, dtype=torch.float64, device=x2.device)
    scale = torch.empty(n, dtype=torch.float64, device=x2.device)
    rows = max(1, _BLOCK // max(k, 1))
    for lo in range(0, n, rows):
        w = weight[lo:lo + rows].to(torch.float64)
        expect[lo:lo + rows] = w @ xs
        scale[lo:lo + rows] = w.abs() @ xa
    if bias is not None:
        b = bias.to(torch.float64)
        expect += m * b
        scale += m * b.abs()
    return expect, scale


def check_linear(x: Any, weight: Any, bias: Any, y: Any) -> GemmCheck:
    """Whether ``y`` can be ``F.linear(x, weight, bias)`` up to the GEMM's rounding."""
    import torch

    k, n = weight.shape[1], weight.shape[0]
    x2, y2 = x.reshape(-1, k), y.reshape(-1, n)
    m = x2.shape[0]
    acc, out = _unit_roundoff(x2, y2)
    if k * acc >= 0.5 or not bool(torch.isfinite(x2).all()):
        return GemmCheck(m * n, 0, [], False)
    expect, scale = _bound_terms(x2, weight, bias)
    ys = y2.sum(0, dtype=torch.float64)
    ya = y2.abs().sum(0, dtype=torch.float64)
    gamma = _gamma(k, acc, out, _cast(x2, weight, y2))
    # the GEMM's rounding, the output's, and float64's own in these sums; twice over for margin
    bound = 2 * (gamma * scale + out * ya + (m + k) * 2.0 ** -52 * (scale + ya)) + 1e-300
    bad = ~((ys - expect).abs() <= bound)  # NaN counts as broken
    nonfinite = int(y2.numel() - torch.isfinite(y2).sum().item())
    return GemmCheck(m * n, nonfinite, torch.nonzero(bad).flatten().tolist(), True)


def rerun(x: Any, weight: Any, bias: Any, y: Any, first: GemmCheck) -> int:
    """The re-run's verdict on a check that failed (``RERUN_*``)."""
    import torch
    import torch.nn.functional as F

    again = F.linear(x, weight, bias)
    if not torch.equal(_bits(again), _bits(y)) and not check_linear(x, weight, bias, again).violations:
        return RERUN_PASSED
    # wrong again: the host computes the broken columns exactly, and must disagree with the device
    k, n = weight.shape[1], weight.shape[0]
    cols = torch.tensor(first.violations[:_REFERENCE_COLUMNS], dtype=torch.long)
    x2 = x.reshape(-1, k).detach().to("cpu", torch.float64)
    w = weight.detach()[cols.to(weight.device)].to("cpu", torch.float64)
    ref = x2 @ w.T
    if bias is not None:
        ref += bias.detach()[cols.to(bias.device)].to("cpu", torch.float64)
    got = y.reshape(-1, n)[:, cols.to(y.device)].to("cpu", torch.float64)
    acc, out = _unit_roundoff(x, y)
    gamma = _gamma(k, acc, out, _cast(x, weight, y))
    tol = 2 * (gamma * (x2.abs() @ w.abs().T) + out * got.abs()) + 1e-300
    wrong = ~((got - ref).abs() <= tol)
    return RERUN_REPRODUCED if bool(wrong.any()) else RERUN_REFERENCE_AGREES


def _bits(t: Any) -> Any:
    """A tensor's bits as integers (NaN equals NaN of the same bits)."""
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.detach().contiguous().view(ints[t.element_size()])


def _eager_linears(root: Any) -> list[Any]:
    """The ``nn.Linear`` layers of ``root`` that run eagerly: none under a module that is
    compiled (``torch.compile(m)``, ``m.compile()``) — its first compilation may still be to
    come, and a hook there would be traced into its graphs."""
    import torch.nn as nn

    from argus.producer.modules import _compiled

    out, stack = [], [root]
    while stack:
        m = stack.pop()
        if _compiled(m):
            continue
        if type(m) is nn.Linear:
            out.append(m)
        stack.extend(reversed(list(m.children())))
    return out


class GemmSensor:
    """Arms a one-shot check on ``layers`` linear layers of a root module's first forward of each
    due step, rotating through them from step to step."""

    def __init__(self, record: Callable[..., None], due: Callable[[int], bool], layers: int,
                 compiled: Callable[[], bool]):
        self.record = record  # (step, sensor, tensors, elements, digest, nonfinite, violations, rerun)
        self.due = due
        self.layers = layers
        self.compiled = compiled
        self.armed_step = -1
        self.turn = 0

    def on_forward(self, root: Any, step: int) -> None:
        if self.layers == 0 or self.armed_step == step or not self.due(step):
            return
        self.armed_step = step
        if self.compiled():  # hooks inside a compiled model change its graphs: not ours to touch
            return
        linears = _eager_linears(root)
        if not linears:
            return
        chosen = linears if self.layers < 0 else [linears[(self.turn + i) % len(linears)]
                                                  for i in range(min(self.layers, len(linears)))]
        self.turn += 1
        for m in chosen:
            self._arm(m, step)

    def _arm(self, module: Any, step: int) -> None:
        handle: Any = None

        def hook(mod: Any, args: Any, output: Any) -> None:
            handle.remove()
            try:
                self._check(mod, args, output, step)
            except Exception as exc:  # noqa: BLE001 - never into the model; this sensor stops
                log.warning("argus: GEMM check off (%s: %s)", type(exc).__name__, exc)
                self.layers = 0

        handle = module.register_forward_hook(hook)

    def _check(self, mod: Any, args: Any, output: Any, step: int) -> None:
        import torch

        if not args or not isinstance(output, torch.Tensor) or getattr(mod.weight, "placements", None) is not None:
            return
        x = args[0]
        with torch.no_grad():
            got = check_linear(x, mod.weight, mod.bias, output)
            if not got.checked:
                return
            again = rerun(x, mod.weight, mod.bias, output, got) if got.violations else RERUN_NONE
        self.record(step, SENSOR_GEMM, 1, got.elements, 0, got.nonfinite, len(got.violations), again)
