"""The GPUs' sensors under the burn, with a stand-in for NVML (no GPU here): a GPU held back by a
thermal slowdown, at a lower clock and with less headroom than its peers, fails against them."""

from __future__ import annotations

import time

import pytest

from argus.healthcheck.baseline import judge
from argus.healthcheck.burn import BurnMonitor
from argus.healthcheck.model import HealthReport, Status

pynvml = pytest.importorskip("pynvml")

from tests.processor.test_hardware import FakeNvml  # noqa: E402


class BurningNvml(FakeNvml):
    """Four busy GPUs; GPU-ddd hot and thermally slowed, the others at their power cap (normal)."""

    def __init__(self):
        super().__init__()
        base = dict(gen=4, gen_max=4, width=16, width_max=16, ecc=(0, 0))
        self.gpus = [dict(base, uuid=f"GPU-{c * 3}", sm=1980, temp=62, power_mw=690_000, reasons=0x4) for c in "abc"]
        self.gpus.append(dict(base, uuid="GPU-ddd", sm=1410, temp=88, power_mw=520_000, reasons=0x4 | 0x20 | 0x40))
        self.xids = []

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTemperatureThreshold(self, h, kind):
        assert kind == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return 90

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._gpu(h, "reasons")["reasons"]


def test_a_thermally_slowed_gpu_fails_against_its_peers_under_the_same_burn():
    with BurnMonitor(interval_s=0.01, nvml=BurningNvml()) as burn:
        time.sleep(0.1)  # the burn
    assert burn.off is None
    got = {(m.subject, m.metric): m.value for m in burn.measurements()}
    assert got[("gpu:GPU-aaa", "burn_clock_share")] == 1.0 and got[("gpu:GPU-ddd", "burn_clock_share")] < 0.72
    assert got[("gpu:GPU-aaa", "burn_unthrottled_share")] == 1.0  # the power cap of a burn is no slowdown
    assert got[("gpu:GPU-ddd", "burn_unthrottled_share")] == 0.0
    assert (got[("gpu:GPU-aaa", "burn_temp_headroom_c")], got[("gpu:GPU-ddd", "burn_temp_headroom_c")]) == (28, 2)
    assert got[("gpu:GPU-ddd", "burn_power_w")] == 520.0
    report = HealthReport("node-1", "H200", {}, 0.0, measurements=burn.measurements())
    failed = {(v.measurement.subject, v.measurement.metric) for v in judge(report, None) if v.status == Status.FAIL}
    assert {s for s, _ in failed} == {"gpu:GPU-ddd"}
    assert {m for _, m in failed} >= {"burn_clock_share", "burn_unthrottled_share", "burn_temp_headroom_c"}


def test_without_nvml_the_burn_says_why_and_measures_nothing():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    with BurnMonitor(nvml=Broken()) as burn:
        pass
    assert burn.off and "NVML unavailable" in burn.off and burn.measurements() == []


class _Cuda:
    def __init__(self, n):
        self.n = n

    def device_count(self):
        return self.n

    def synchronize(self, device=None):
        pass


class _Tensor:
    def __init__(self, torch, nbytes, device):
        self.torch, self.nbytes, self.device = torch, nbytes, device

    def copy_(self, src, non_blocking=False):
        self.torch.now += self.nbytes / self.torch.bandwidth(src.device[1], self.device[1])
        return self


class FakeP2PTorch:
    """Four GPUs whose copies take the time a link of the pair's bandwidth would: GPU 2's links at
    a tenth of the others' (an NVLink down, its copies through the host). The time is the fake's
    own clock (``clock``), advanced by each copy: slept for real, a 0.1 ms copy took several
    under a loaded CI and a healthy pair read as slow."""

    uint8 = "uint8"

    def __init__(self):
        self.cuda = _Cuda(4)
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def device(self, kind, index):
        return (kind, index)

    def empty(self, nbytes, dtype=None, device=None):
        return _Tensor(self, nbytes, device)

    @staticmethod
    def bandwidth(i, j):
        return 2e10 if 2 in (i, j) else 2e11  # bytes/s


def test_the_p2p_matrix_names_the_pairs_of_a_gpu_whose_links_are_slow():
    from argus.healthcheck.model import Level, Measurement
    from argus.healthcheck.probes import p2p_gbs

    fake = FakeP2PTorch()
    got = p2p_gbs(fake, 20_000_000, 0.02, clock=fake.clock)
    assert got[(0, 1)] == pytest.approx(200.0) and got[(2, 0)] == pytest.approx(20.0)  # GB/s, as the links give
    assert set(got) == {(i, j) for i in range(4) for j in range(4) if i != j}
    slow = {k for k, v in got.items() if v < 0.3 * max(got.values())}
    assert slow == {k for k in got if 2 in k}
    report = HealthReport("node-1", "H200", {}, 0.0, measurements=[
        Measurement(Level.NODE, "p2p_gbs", f"gpu:{i}->gpu:{j}", v, "GB/s", 20_000_000) for (i, j), v in got.items()])
    failed = {v.measurement.subject for v in judge(report, None) if v.status == Status.FAIL}
    assert failed == {f"gpu:{i}->gpu:{j}" for i, j in slow}
