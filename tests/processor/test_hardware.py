"""The hardware channel: NVML samples → ``hw`` rows of the rank using each GPU.

No GPU here: NVML itself is replaced by a small object with the pynvml functions (the one
boundary this machine cannot provide). Everything after it is real: the samplers' queue,
the window assembler, the store, and the analysis that reads the rows back.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

from argus.analysis.signals import load_hw_signals
from argus.wire import Msg, ProcessorClient
from argus.processor.assembler import RankInfo, WindowAssembler
from argus.processor.host_counters import HOST_METRICS, port_metric
from argus.processor.hardware import HardwareSampler
from argus.wire.protocol import DTYPES
from argus.processor.samplers import Samplers
from argus.store import WindowWriter
from argus.store import Store
from argus.topology import RunIdentity, parse_layout
from tests.shortdir import short_dir

pynvml = pytest.importorskip("pynvml")  # nvidia-ml-py: its error classes are what NVML raises


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


class FakeNvml:
    """The pynvml functions the channel calls, for three GPUs (no newer event-reasons call)."""

    def __init__(self):
        self.gpus = [
            dict(uuid="GPU-aaa", gen=3, gen_max=4, width=16, width_max=16, sm=1980, temp=85, power_mw=350_000,
                 reasons=0x40 | 0x2, ecc=(2, 7)),  # hot, thermally slowed, link down to gen 3
            dict(uuid="GPU-bbb", gen=1, gen_max=4, width=16, width_max=16, sm=210, temp=40, power_mw=None,
                 reasons=0x1, ecc=None),  # idle (gen 1 to save power), no ECC, power read fails
            dict(uuid="GPU-ccc", gen=4, gen_max=4, width=16, width_max=16, sm=1980, temp=50, power_mw=300_000,
                 reasons=0, ecc=(0, 0)),  # used by no rank of this host
        ]
        self.calls: Counter = Counter()
        self.xids = [(0, 79)]
        self.shut = self.freed = False

    def _gpu(self, handle, call):
        self.calls[(call, handle)] += 1
        return self.gpus[handle]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h]["uuid"]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._gpu(h, "gen")["gen"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._gpu(h, "width")["width"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._gpu(h, "gen_max")["gen_max"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._gpu(h, "width_max")["width_max"]

    def nvmlDeviceGetClockInfo(self, h, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return self._gpu(h, "sm")["sm"]

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h, "temp")["temp"]

    def nvmlDeviceGetPowerUsage(self, h):
        mw = self._gpu(h, "power")["power_mw"]
        if mw is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return mw

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._gpu(h, "reasons")["reasons"]

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        assert counter == pynvml.NVML_VOLATILE_ECC
        ecc = self._gpu(h, "ecc")["ecc"]
        if ecc is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return ecc[0] if kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else ecc[1]

    def nvmlEventSetCreate(self):
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, kind, events):
        assert kind == pynvml.nvmlEventTypeXidCriticalError and events == "event-set"

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        assert timeout_ms == 0  # polled, never blocking
        if not self.xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        device, xid = self.xids.pop(0)
        return type("Event", (), {"device": device, "eventData": xid,
                                  "eventType": pynvml.nvmlEventTypeXidCriticalError})()

    def nvmlEventSetFree(self, events):
        self.freed = True


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_nvml_samples_become_hw_rows_of_the_rank_using_each_gpu(tmp_path):
    nvml = FakeNvml()
    hw = HardwareSampler(interval_s=3600, nvml=nvml)
    samplers = Samplers([hw])
    ranks = {3: RankInfo(rank=3, gpu_uuid="GPU-aaa", names=["forward-compute"]),  # said its GPU (local rank 1!)
             5: RankInfo(rank=5, gpu_uuid=""),  # did not: its local rank is the device index
             6: RankInfo(rank=6, gpu_uuid="cpu-node-0-2")}  # a CPU-only rank gets no GPU's rows
    for r, local in ((3, 1), (5, 1), (6, 2)):
        samplers.rank_joined(r, ranks[r], ("job", "0"), {"local_rank": local, "pid": None})
    t0 = time.time_ns()
    assembler = WindowAssembler(window_steps=2)
    for info in ranks.values():
        steps = np.zeros(2, DTYPES[Msg.STEPS])
        steps["step"], steps["start_ns"], steps["end_ns"] = [0, 1], [t0 - 2 * 10**9, t0 - 10**9], [t0 - 10**9, -1]
        assembler.add(info, Msg.STEPS, steps)

    samplers.start()  # the thread takes its first round at once
    _wait_for(lambda: samplers.queue.qsize() > 0)
    outputs = samplers.collect(time.time_ns())
    for handle, msg, records in outputs:
        assembler.add(handle.info, msg, records)
    assert {h.rank for h, _, _ in outputs} == {3, 5} and hw.unmapped == 1
    assert ranks[5].gpu_uuid == "GPU-bbb" and ranks[3].names[0] == "forward-compute"

    data, _ = assembler.take(0)
    rows = {(r["rank"], r["gpu_uuid"], r["metric"]): r["value"] for r in data.hw.to_pylist()}
    assert {r["step"] for r in data.steps.to_pylist()} == {0, 1}
    assert rows == {
        (3, "GPU-aaa", "pcie_gen"): 3, (3, "GPU-aaa", "pcie_width"): 16, (3, "GPU-aaa", "pcie_gen_max"): 4,
        (3, "GPU-aaa", "pcie_width_max"): 16, (3, "GPU-aaa", "sm_clock_mhz"): 1980, (3, "GPU-aaa", "temperature_c"): 85,
        (3, "GPU-aaa", "power_w"): 350.0, (3, "GPU-aaa", "throttle_reasons"): 0x40, (3, "GPU-aaa", "ecc_errors"): 2,
        (3, "GPU-aaa", "ecc_corrected"): 7, (3, "GPU-aaa", "xid"): 79,
        # idle: no current link reading; no ECC, no power (the read failed); idle is not a throttle
        (5, "GPU-bbb", "pcie_gen_max"): 4, (5, "GPU-bbb", "pcie_width_max"): 16, (5, "GPU-bbb", "sm_clock_mhz"): 210,
        (5, "GPU-bbb", "temperature_c"): 40, (5, "GPU-bbb", "throttle_reasons"): 0,
    }

    hw.sample_once()  # a second round: unsupported ECC is not asked again, a failed read is
    assert nvml.calls[("ecc", 1)] == 2 and nvml.calls[("ecc", 0)] == 4  # (uncorrected + corrected) per round
    assert nvml.calls[("power", 1)] == 2
    assert hw.status()["unsupported"] == ["0:nvmlDeviceGetCurrentClocksEventReasons", "1:ecc_corrected", "1:ecc_errors",
                                          "1:nvmlDeviceGetCurrentClocksEventReasons",
                                          "2:nvmlDeviceGetCurrentClocksEventReasons"]  # an older driver's pynvml
    samplers.close(time.time_ns())
    assert nvml.shut and nvml.freed and not hw.enabled

    store = Store.create(tmp_path / "store")
    attempt = store.open_or_create_attempt(RunIdentity("job", "0"), parse_layout("dp=8", world_size=8),
                                           source="processor")
    WindowWriter(attempt, "node-0000", durable=False).write(data)
    signals = load_hw_signals(attempt)
    assert signals.pcie_degraded == {3: (3.0, 16.0)}  # not rank 5: its idle gen 1 was never recorded
    assert signals.thermal == {3: 85.0}


@pytest.mark.skipif(_nvml_works(), reason="NVML is present on this machine")
def test_without_nvml_the_channel_is_off_with_one_line(caplog):
    hw = HardwareSampler()
    with caplog.at_level(logging.DEBUG, logger="argus.processor"):
        hw.start()
        hw.close()
    assert [r.getMessage() for r in caplog.records] == [
        "hardware telemetry off: NVML unavailable (NVMLError_LibraryNotFound: NVML Shared Library Not Found)"]
    assert not hw.enabled and hw._thread is None


@pytest.mark.skipif(_nvml_works(), reason="NVML is present on this machine")
def test_a_processor_without_nvml_writes_no_gpu_rows(tmp_path):
    sock = short_dir("argus-t-") / "p.sock"
    store, log = tmp_path / "store", tmp_path / "processor.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(store), "--socket",
                                 str(sock), "--host", "node-0000", "--no-fsync", "--no-stacks", "--hw-interval", "0.1"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: sock.exists() or proc.poll() is not None, timeout=20)
        client = ProcessorClient(sock, {"run_id": "job", "attempt_id": "0", "rank": 0, "world_size": 1,
                                        "local_rank": 0, "gpu_uuid": "", "layout": "dp=1"}).connect(retries=50,
                                                                                                    delay_s=0.02)
        steps = np.zeros(3, DTYPES[Msg.STEPS])
        now = time.time_ns()
        steps["step"], steps["start_ns"], steps["end_ns"] = [0, 1, 2], now - 3000, now - 1000
        client.send(Msg.STEPS, steps)
        client.flush(1)
        client.wait_for_ack(lambda a: a.get("seq") == 1, timeout_s=30)
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in log.read_text().splitlines() if "hardware telemetry" in ln]
    assert len(lines) == 1 and "off" in lines[0], log.read_text()
    attempt = Store.open(store).attempt()
    assert attempt.read("steps").num_rows == 3
    metrics = {port_metric(m)[0] for m in attempt.read("hw").column("metric").to_pylist()}
    assert metrics <= HOST_METRICS  # the host's counters only (per port, where this machine has ports)


class FakeNvlinkNvml(FakeNvml):
    """GPU 0 with four NVLinks (the rest answer INVALID_ARGUMENT), GPU 1 without NVLink."""

    def __init__(self):
        super().__init__()
        self.active = {0, 1, 2, 3}
        self.errors = 5  # replay count of link 1, as the driver keeps it since boot

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 4:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in self.active else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        return self.errors if (link, counter) == (1, 0) else 0


def test_nvlink_errors_are_counted_per_interval_and_a_link_that_went_down_is_said():
    nvml = FakeNvlinkNvml()
    hw = HardwareSampler(interval_s=3600, nvml=nvml)
    hw.start()
    hw.close()  # the thread's first round is done or not: rounds below are ours
    hw.nvml, hw.enabled = nvml, True

    def nvlink(round_):
        return {m: v for uuid, _, metrics in round_ if uuid == "GPU-aaa" for m, v in metrics if m.startswith("nvlink")}

    first = hw.sample_once()
    assert nvlink(first)["nvlink_down"] == 0  # errors since boot are no interval's
    assert not any(m.startswith("nvlink") for uuid, _, ms in first if uuid == "GPU-bbb" for m, _ in ms)
    nvml.errors += 12
    nvml.active.discard(2)
    # the GPU's sum, and which link: link 1's errors, link 2 down
    assert nvlink(hw.sample_once()) == {"nvlink_down": 1.0, "nvlink_errors": 12.0, "nvlink_errors:1": 12.0,
                                        "nvlink_down:2": 1.0}
    assert nvlink(hw.sample_once()) == {"nvlink_down": 1.0, "nvlink_errors": 0.0, "nvlink_down:2": 1.0}
    nvml.active.add(2)  # back up: no per-link row, nothing rose
    assert nvlink(hw.sample_once()) == {"nvlink_down": 0.0, "nvlink_errors": 0.0}


class FakeNvlinkCounters(FakeNvlinkNvml):
    """Each of GPU 0's four links with its own counters (replay and CRC), as the driver keeps them."""

    def __init__(self):
        super().__init__()
        self.counts = {(link, c): 100 * link for link in range(4) for c in (0, 2)}

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        if (link, counter) not in self.counts:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.counts[(link, counter)]


def test_nvlink_errors_per_link_add_up_to_the_gpus_and_a_reset_link_counts_from_zero():
    nvml = FakeNvlinkCounters()
    hw = HardwareSampler(interval_s=3600, nvml=nvml)
    hw.gpus, hw.nvml, hw.enabled = [(0, "GPU-aaa", 0), (1, "GPU-bbb", 1)], nvml, True

    def nvlink():
        (metrics,) = [ms for uuid, _, ms in hw.sample_once() if uuid == "GPU-aaa"]
        return {m: v for m, v in metrics if m.startswith("nvlink")}

    assert nvlink() == {"nvlink_down": 0.0}  # counts since boot: no interval's
    nvml.counts[(0, 0)] += 3
    nvml.counts[(3, 2)] += 4
    nvml.counts[(2, 0)], nvml.counts[(2, 2)] = 5, 0  # link 2's counters were reset (400 → 5): 5 since
    got = nvlink()
    assert got == {"nvlink_down": 0.0, "nvlink_errors": 12.0, "nvlink_errors:0": 3.0, "nvlink_errors:2": 5.0,
                   "nvlink_errors:3": 4.0}
    assert got["nvlink_errors"] == sum(v for m, v in got.items() if m.startswith("nvlink_errors:"))
