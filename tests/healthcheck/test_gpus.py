"""Every local GPU measured and named by its UUID, with stand-ins for CUDA and NVML (no GPU here):
the GPUs of a node compared with each other, each PCIe link against its maximum, the driver and
VBIOS kept with the baseline, and a baseline that follows each GPU by UUID, not by index.

The stand-in kernels take the time a GPU of the given speed would, on a virtual clock of their
own (one per thread: each GPU's stream), so the figures are exact and nothing sleeps."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from argus.healthcheck.baseline import judge
from argus.healthcheck.burn import BurnMonitor, PcieLink, pcie_measurements
from argus.healthcheck.model import HealthReport, Level, Measurement, Status
from argus.healthcheck.run import CheckConfig, run_checks

pytest.importorskip("pynvml")

from tests.healthcheck.test_burn import BurningNvml


class VirtualClock:
    """Per-thread virtual seconds, advanced by the stand-in kernels."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        return getattr(self._local, "t", 0.0)

    def advance(self, seconds: float) -> None:
        self._local.t = self() + seconds


@dataclass(frozen=True)
class FakeGpu:
    uuid: str  # as CUDA's device properties give it (without ``GPU-``)
    tflops: float = 700.0
    hbm_gbs: float = 3000.0
    pcie_gbs: float = 25.0
    name: str = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class _Device:
    type: str
    index: int | None = None


class _Tensor:
    def __init__(self, torch: "FakeCudaTorch", shape: tuple[int, ...], itemsize: int, device: _Device):
        self.torch, self.shape, self.device = torch, shape, device
        self.nbytes = itemsize
        for n in shape:
            self.nbytes *= n

    def to(self, dtype: str) -> "_Tensor":
        return self

    def pin_memory(self) -> "_Tensor":
        return self

    def numel(self) -> int:
        return self.nbytes // 4

    def copy_(self, src: "_Tensor", non_blocking: bool = False) -> "_Tensor":
        self.torch.copy(src, self)
        return self


class FakeCudaTorch:
    """The torch calls the gpu and node levels make, for the GPUs given."""

    float32, bfloat16, float16, uint8 = "float32", "bfloat16", "float16", "uint8"
    __version__ = "2.13.0+fake"
    version = SimpleNamespace(cuda="12.8")

    def __init__(self, gpus: list[FakeGpu], clock: VirtualClock):
        self.gpus, self.clock = gpus, clock
        self.cuda = SimpleNamespace(
            is_available=lambda: True, device_count=lambda: len(gpus), current_device=lambda: 0,
            synchronize=lambda device=None: None, nccl=SimpleNamespace(version=lambda: (2, 27, 3)),
            get_device_properties=lambda i: SimpleNamespace(uuid=gpus[i].uuid, name=gpus[i].name))

    def device(self, kind: str, index: int | None = None) -> _Device:
        return _Device(kind, index)

    def _on(self, device: _Device | str | None) -> _Device:
        return device if isinstance(device, _Device) else _Device("cpu")

    def empty(self, *shape: int, dtype: str = "float32", device: _Device | None = None) -> _Tensor:
        return _Tensor(self, shape, 1 if dtype == "uint8" else 4, self._on(device))

    def randn(self, *shape: int, device: _Device | None = None) -> _Tensor:
        return self.empty(*shape, device=device)

    def ones(self, n: int, device: _Device | None = None, dtype: str = "float32") -> _Tensor:
        return self.empty(n, device=device, dtype=dtype)

    def empty_like(self, t: _Tensor) -> _Tensor:
        return _Tensor(self, t.shape, t.nbytes // max(1, _count(t.shape)), t.device)

    def matmul(self, a: _Tensor, b: _Tensor, out: _Tensor) -> _Tensor:
        n = a.shape[0]
        self.clock.advance(2.0 * n ** 3 / (self.gpus[a.device.index].tflops * 1e12))
        return out

    def copy(self, src: _Tensor, dst: _Tensor) -> None:
        if src.device.type == dst.device.type == "cuda" and src.device.index == dst.device.index:
            gbs = self.gpus[src.device.index].hbm_gbs / 2  # a device copy reads and writes
        elif src.device.type == dst.device.type == "cuda":
            gbs = 300.0
        else:
            gbs = self.gpus[(src.device if src.device.type == "cuda" else dst.device).index].pcie_gbs
        self.clock.advance(dst.nbytes / (gbs * 1e9))


def _count(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


class NodeNvml(BurningNvml):
    """The four GPUs' sensors: GPU-ccc hot and thermally slowed, GPU-bbb's link trained down to
    Gen3 on a Gen4 slot; the driver and each GPU's VBIOS."""

    def __init__(self, vbios: str = "96.00.89.00.01"):
        super().__init__()
        base = dict(gen=4, gen_max=4, width=16, width_max=16, ecc=(0, 0), sm=1980, temp=62, power_mw=690_000,
                    reasons=0x4)
        self.gpus = [dict(base, uuid="GPU-aaa"), dict(base, uuid="GPU-bbb", gen=3),
                     dict(base, uuid="GPU-ccc", sm=1410, temp=88, reasons=0x4 | 0x20 | 0x40), dict(base, uuid="GPU-ddd")]
        self.vbios = vbios

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlDeviceGetVbiosVersion(self, h):
        return self.vbios


NODE = [FakeGpu("aaa"), FakeGpu("bbb", pcie_gbs=12.0), FakeGpu("ccc", tflops=420.0, hbm_gbs=2400.0), FakeGpu("ddd")]


def _check(gpus: list[FakeGpu], nvml: NodeNvml | None = None, levels=(Level.GPU, Level.NODE)) -> HealthReport:
    clock = VirtualClock()
    report = run_checks(CheckConfig(levels=levels, seconds=0.01, torch=FakeCudaTorch(gpus, clock),
                                    nvml=nvml or NodeNvml(), clock=clock))
    assert report is not None
    return report


def test_every_gpu_is_measured_by_its_uuid_and_the_slow_one_and_the_trained_down_link_fail():
    report = _check(NODE)
    got = {(m.metric, m.subject): m for m in report.measurements}
    subjects = [f"gpu:GPU-{c * 3}" for c in "abcd"]
    for metric in ("gemm_fp32_gflops", "gemm_bf16_gflops", "gemm_fp16_gflops", "copy_gbs", "h2d_gbs", "d2h_gbs",
                   "burn_clock_share", "pcie_gen", "pcie_width"):
        assert [s for m, s in got if m == metric] == subjects, metric
    assert got[("gemm_fp32_gflops", "gpu:GPU-aaa")].value == pytest.approx(700_000.0)  # GFLOP/s
    assert got[("gemm_fp32_gflops", "gpu:GPU-ccc")].value == pytest.approx(420_000.0)
    assert got[("copy_gbs", "gpu:GPU-aaa")].value == pytest.approx(3000.0)
    assert got[("h2d_gbs", "gpu:GPU-bbb")].value == pytest.approx(12.0)
    assert (got[("pcie_gen", "gpu:GPU-bbb")].value, got[("pcie_gen", "gpu:GPU-bbb")].expected) == (3, 4)
    assert got[("pcie_width", "gpu:GPU-aaa")].expected == 16
    p2p = sorted(m.subject for m in report.measurements if m.metric == "p2p_gbs")
    assert len(p2p) == 12 and p2p[0] == "gpu:GPU-aaa->gpu:GPU-bbb"
    assert [(g.index, g.uuid) for g in report.gpus] == list(enumerate(f"GPU-{c * 3}" for c in "abcd"))
    assert report.device == "4 × NVIDIA H100 80GB HBM3"
    assert report.versions["nvidia_driver"] == "570.124.06"
    assert report.versions["vbios gpu:GPU-ccc"] == "96.00.89.00.01" and report.versions["cuda"] == "12.8"
    assert report.skipped == []

    failed = {(v.measurement.subject, v.measurement.metric) for v in judge(report, None) if v.status == Status.FAIL}
    assert {m for s, m in failed if s == "gpu:GPU-ccc"} >= {"gemm_fp32_gflops", "gemm_bf16_gflops", "copy_gbs",
                                                          "burn_clock_share", "burn_unthrottled_share"}
    assert {m for s, m in failed if s == "gpu:GPU-bbb"} == {"pcie_gen", "h2d_gbs", "d2h_gbs"}
    assert {s for s, _ in failed} == {"gpu:GPU-bbb", "gpu:GPU-ccc"}
    again = HealthReport.from_json(report.to_json())  # the per-GPU keys and the links' maxima round-trip
    assert (again.measurements, again.gpus, again.versions) == (report.measurements, report.gpus, report.versions)


def test_a_link_trained_down_on_every_gpu_alike_still_fails_against_its_maximum():
    links = {f"GPU-{i}": PcieLink(gen=3, width=16, gen_max=4, width_max=16) for i in range(4)}
    report = HealthReport("node-1", "H100", {}, 0.0, measurements=pcie_measurements(links))
    verdicts = {(v.measurement.metric, v.status) for v in judge(report, None)}
    assert verdicts == {("pcie_gen", Status.FAIL), ("pcie_width", Status.PASS)}  # no peer is better: the max says
    v = next(v for v in judge(report, None) if v.measurement.metric == "pcie_gen")
    assert "below the hardware's maximum (3 of 4 gen)" in v.why and v.deficit == pytest.approx(0.25)


def test_the_burn_keeps_each_links_best_generation_while_busy_and_none_for_an_idle_gpu():
    nvml = NodeNvml()
    nvml.gpus[3]["reasons"] = 0x1  # idle all along: NVML's current generation is its power-saving one
    with BurnMonitor(interval_s=0.01, nvml=nvml) as burn:
        pass
    links = burn.pcie_links()
    assert links["GPU-bbb"] == PcieLink(gen=3, width=16, gen_max=4, width_max=16)
    assert links["GPU-ddd"].gen is None and links["GPU-ddd"].gen_max == 4
    assert [m.subject for m in pcie_measurements(links) if m.metric == "pcie_gen"] == [
        "gpu:GPU-aaa", "gpu:GPU-bbb", "gpu:GPU-ccc"]
    assert not any(m.metric.startswith("pcie") for m in burn.measurements())  # the node level's figures


def test_a_node_level_that_never_saw_a_gpu_busy_says_so():
    nvml = NodeNvml()
    nvml.gpus[3]["reasons"] = 0x1
    report = _check(NODE, nvml, levels=(Level.NODE,))
    assert not any(m.subject == "gpu:GPU-ddd" and m.metric == "pcie_gen" for m in report.measurements)
    assert any("gpu:GPU-ddd" in check and "never sampled busy" in why for check, why in report.skipped)


def test_a_baseline_follows_each_gpu_by_uuid_not_by_index():
    """Saved on a healthy node; then GPU-aaa is replaced (GPU-eee, a slower part) and the others
    enumerate in another order: each GPU is judged against its own earlier figures, the new one
    against its peers only, and a changed VBIOS is said on that GPU's failures alone."""
    healthy = [FakeGpu("aaa"), FakeGpu("bbb"), FakeGpu("ccc"), FakeGpu("ddd")]
    base = _check(healthy, levels=(Level.GPU,))
    now = _check([FakeGpu("ddd", tflops=560.0), FakeGpu("ccc"), FakeGpu("bbb"), FakeGpu("eee", tflops=560.0)],
                 NodeNvml(), levels=(Level.GPU,))
    now.measurements = [m for m in now.measurements if m.metric == "gemm_fp32_gflops"]
    now.versions = {**now.versions, "vbios gpu:GPU-ddd": "96.00.99.00.01"}
    v = {x.measurement.subject: x for x in judge(now, base)}
    assert v["gpu:GPU-eee"].baseline is None and v["gpu:GPU-eee"].peers is not None
    assert v["gpu:GPU-ddd"].baseline == pytest.approx(700_000.0) and v["gpu:GPU-ddd"].status == Status.FAIL
    assert "20% below this node's baseline" in v["gpu:GPU-ddd"].why
    assert "the baseline was taken with other vbios" in v["gpu:GPU-ddd"].why
    assert v["gpu:GPU-ccc"].status == Status.PASS and v["gpu:GPU-ccc"].baseline == pytest.approx(700_000.0)
    assert "vbios" not in v["gpu:GPU-eee"].why


def test_on_a_cpu_the_gpu_only_figures_say_no_cuda_device():
    report = run_checks(CheckConfig(levels=(Level.GPU, Level.NODE), seconds=0.02))
    assert report is not None and report.gpus == []
    assert {m.subject for m in report.measurements} == {"device"}
    skipped = dict(report.skipped)
    assert skipped["node"].startswith("skipped: no CUDA device") and "PCIe" in skipped["node"]
    assert any(why.startswith("skipped: no CUDA device") for check, why in report.skipped if check.startswith("gpu"))
    assert "nvidia_driver" not in report.versions


def test_a_measurement_without_an_expected_value_keeps_its_document_as_before():
    m = Measurement(Level.GPU, "copy_gbs", "device", 10.0, "GB/s")
    assert "expected" not in m.to_json() and Measurement.from_json(m.to_json()) == m
    linked = replace(m, metric="pcie_gen", expected=4.0)
    assert Measurement.from_json(linked.to_json()) == linked
