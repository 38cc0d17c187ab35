"""CuptiSource against a fake of cupti-python's module: activity records → kernel rows."""

from __future__ import annotations

import enum
import types

import numpy as np
import pytest

from argus.producer import cupti as cupti_mod
from argus.producer.cupti import CuptiSource, demangle
from argus.producer.recorder import KIND
from argus.wire import DTYPES, Msg

FILL = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
FILL_DEMANGLED = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                  "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")
NCCL = "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LLP14ncclDevKernArg"


class ActivityKind(enum.IntEnum):  # values as in cupti-python's enum
    MEMCPY = 1
    MEMSET = 2
    KERNEL = 3
    DRIVER = 4
    CONCURRENT_KERNEL = 10


class ActivityMemcpyKind(enum.IntEnum):
    UNKNOWN = 0
    HTOD = 1
    DTOH = 2
    DTOD = 8


class FakeCupti:
    ActivityKind = ActivityKind
    ActivityMemcpyKind = ActivityMemcpyKind

    def __init__(self, timestamp: int = 1_000_000):
        self.timestamp = timestamp
        self.enabled: list = []
        self.disabled: list = []
        self.flushes: list[int] = []
        self.callbacks = None

    def activity_enable(self, kind):
        self.enabled.append(kind)

    def activity_disable(self, kind):
        self.disabled.append(kind)

    def activity_register_callbacks(self, requested, completed):
        self.callbacks = (requested, completed)

    def get_timestamp(self) -> int:
        return self.timestamp

    def activity_flush_all(self, flag: int):
        self.flushes.append(flag)


class FakeRecorder:
    def __init__(self):
        self.names: list[str] = []
        self.batches: list[np.ndarray] = []

    def name_id(self, name: str) -> int:
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def kernels(self, records: np.ndarray) -> None:
        self.batches.append(records)


def rec(kind, start, end, stream=7, device=0, **kw):
    return types.SimpleNamespace(kind=kind, start=start, end=end, stream_id=stream, device_id=device, **kw)


@pytest.fixture()
def source(monkeypatch):
    monkeypatch.setattr(cupti_mod, "now_ns", lambda: 5_000_000_000)
    fake, recorder = FakeCupti(timestamp=1_000_000), FakeRecorder()
    src = CuptiSource(recorder, cupti_module=fake, other_profiler=lambda: False)
    src.start()
    yield src, fake, recorder
    src.stop()  # gives torch.profiler's _prepare_trace back


def test_demangle():
    assert demangle("_Z3fooi") == "foo(int)"
    assert demangle(FILL) == FILL_DEMANGLED
    assert demangle(NCCL) == "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernArg*)"
    assert demangle("ampere_sgemm_128x64_tn") == "ampere_sgemm_128x64_tn"  # not mangled
    assert demangle("_Zinvalid") == "_Zinvalid"  # not a valid mangling: as is
    assert demangle("") == ""


def test_start_enables_kernels_memcpy_memset_and_aligns_the_clock(source):
    src, fake, _ = source
    assert fake.enabled == [ActivityKind.CONCURRENT_KERNEL, ActivityKind.MEMCPY, ActivityKind.MEMSET]
    requested, completed = fake.callbacks
    assert requested() == (CuptiSource.BUFFER_BYTES, 0)
    assert src.offset == 5_000_000_000 - 1_000_000


def test_records_become_kernel_rows(source):
    src, fake, recorder = source
    off = src.offset
    _, completed = fake.callbacks
    completed([
        rec(ActivityKind.CONCURRENT_KERNEL, 2_000, 2_500, name=FILL, stream=13),
        rec(ActivityKind.KERNEL, 3_000, 4_000, name=NCCL, stream=21, device=1),
        rec(ActivityKind.MEMCPY, 5_000, 5_300, copy_kind=int(ActivityMemcpyKind.HTOD)),
        rec(ActivityKind.MEMSET, 6_000, 6_010),
        rec(ActivityKind.DRIVER, 7_000, 7_100),  # not ours: skipped
        rec(ActivityKind.CONCURRENT_KERNEL, 8_000, 8_040, name="ampere_sgemm_128x64_tn"),
    ])
    (rows,) = recorder.batches
    assert rows.dtype == DTYPES[Msg.KERNELS] and len(rows) == 5
    names = [recorder.names[i] for i in rows["name"]]
    assert names == [FILL_DEMANGLED, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernArg*)", "Memcpy HTOD",
                     "Memset", "ampere_sgemm_128x64_tn"]
    assert rows["kind"].tolist() == [KIND["kernel"], KIND["kernel"], KIND["memcpy"], KIND["memset"], KIND["kernel"]]
    assert rows["start_ns"].tolist() == [2_000 + off, 3_000 + off, 5_000 + off, 6_000 + off, 8_000 + off]
    assert rows["dur_ns"].tolist() == [500, 1_000, 300, 10, 40]
    assert rows["stream"].tolist() == [13, 21, 7, 7, 7] and rows["device"].tolist() == [0, 1, 0, 0, 0]
    assert (rows["step"] == -1).all()  # the processor places them in steps by time


def test_flush_realigns_and_stop_disables(source, monkeypatch):
    src, fake, recorder = source
    fake.timestamp = 3_000_000
    monkeypatch.setattr(cupti_mod, "now_ns", lambda: 9_000_000_000)
    src.flush()
    assert fake.flushes == [0] and src.offset == 9_000_000_000 - 3_000_000
    _, completed = fake.callbacks
    completed([rec(ActivityKind.MEMSET, 10, 20)])
    assert recorder.batches[-1]["start_ns"][0] == 10 + src.offset
    src.stop()
    assert fake.flushes == [0, 1] and fake.disabled == fake.enabled


def test_a_foreign_record_without_our_fields_does_not_cost_the_buffer(source):
    """Another subscriber's kinds (a marker with no stream or device) are skipped, ours kept."""
    src, fake, recorder = source
    _, completed = fake.callbacks
    completed([rec(ActivityKind.CONCURRENT_KERNEL, 1_000, 1_200, name="k1"),
               types.SimpleNamespace(kind=ActivityKind.DRIVER, start=1, end=2),  # no stream_id
               rec(ActivityKind.MEMSET, 2_000, 2_050)])
    (rows,) = recorder.batches
    assert [recorder.names[i] for i in rows["name"]] == ["k1", "Memset"]
    assert rows["dur_ns"].tolist() == [200, 50]


def test_names_are_resolved_once_per_distinct_name_not_per_record(source, monkeypatch):
    """Issue 22 item 11: the buffer is parsed on CUPTI's thread under the GIL. A buffer of
    10⁴ records of a few kernels costs one name lookup per kernel, not per record."""
    src, fake, recorder = source
    lookups = []
    real = recorder.name_id
    recorder.name_id = lambda name: (lookups.append(name), real(name))[1]
    _, completed = fake.callbacks
    mix = [FILL, NCCL, "ampere_sgemm_128x64_tn"]
    batch = [rec(ActivityKind.CONCURRENT_KERNEL, 10 * i, 10 * i + 7, name=mix[i % 3], stream=i % 4)
             for i in range(10_000)]
    batch += [rec(ActivityKind.MEMCPY, 200_000 + i, 200_005 + i, copy_kind=int(ActivityMemcpyKind.DTOH))
              for i in range(100)]
    completed(batch)
    completed(batch[:30])
    assert sorted(lookups) == sorted([FILL_DEMANGLED, demangle(NCCL), "ampere_sgemm_128x64_tn", "Memcpy DTOH"])
    first, second = recorder.batches
    assert len(first) == 10_100 and len(second) == 30
    names = np.array(recorder.names, dtype=object)[first["name"]]
    assert names[:3].tolist() == [FILL_DEMANGLED, demangle(NCCL), "ampere_sgemm_128x64_tn"]
    assert (names[10_000:] == "Memcpy DTOH").all() and (first["kind"][10_000:] == KIND["memcpy"]).all()
    assert first["stream"][:8].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert (first["dur_ns"] == np.r_[np.full(10_000, 7), np.full(100, 5)]).all()
    assert (second["name"] == first["name"][:30]).all()


def test_empty_or_broken_buffers_never_raise(source):
    src, fake, recorder = source
    _, completed = fake.callbacks
    completed([])
    completed([types.SimpleNamespace(kind=ActivityKind.CONCURRENT_KERNEL)])  # no fields
    completed(None)
    assert recorder.batches == []
    fake.activity_flush_all = None  # flush and stop swallow CUPTI errors too
    src.flush()
    src.stop()


def test_a_user_profiler_takes_cupti_and_the_kernel_channel_resumes_after_it(monkeypatch):
    """One set of CUPTI callbacks per process: a user's profiler session replaces Argus's and
    disables the activity kinds when it stops. Argus flushes and steps aside while it runs,
    counts the steps it missed, and subscribes again at the first step boundary after."""
    monkeypatch.setattr(cupti_mod, "now_ns", lambda: 5_000_000_000)
    fake, recorder, other = FakeCupti(), FakeRecorder(), [False]
    src = CuptiSource(recorder, cupti_module=fake, other_profiler=lambda: other[0])
    src.start()
    try:
        mine = fake.callbacks
        src.on_step(1)
        assert not src.aside and fake.disabled == []
        other[0] = True  # an on-demand trace started (no torch.profiler object to see)
        src.on_step(2)
        assert src.aside and fake.flushes == [1] and set(fake.disabled) == set(src.kinds)
        fake.callbacks = ("kineto's",)  # the other profiler registers its own
        src.flush()  # Argus's per-window flush leaves CUPTI alone meanwhile
        src.on_step(3)
        assert fake.flushes == [1] and src.gap_steps == 2
        other[0] = False  # it stopped (and disabled every kind)
        src.on_step(4)
        assert not src.aside and fake.callbacks == mine and fake.enabled[-3:] == src.kinds
        assert src.asides == 1 and src.gap_steps == 2
        fake.callbacks[1]([rec(ActivityKind.CONCURRENT_KERNEL, 2_000, 2_500, name="k")])
        assert len(recorder.batches) == 1  # kernels flow again
    finally:
        src.stop()


def test_a_torch_profiler_session_finds_argus_already_aside(monkeypatch):
    """``torch.profiler.profile`` takes CUPTI when it prepares its trace, mid-step: Argus steps
    aside right then, not at the next step boundary."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(cupti_mod, "now_ns", lambda: 5_000_000_000)
    from torch.autograd import profiler

    before = profiler.profile._prepare_trace
    fake, recorder = FakeCupti(), FakeRecorder()
    src = CuptiSource(recorder, cupti_module=fake)  # the real "another profiler is on" check
    src.start()
    try:
        seen = []
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            seen.append((src.aside, list(fake.flushes)))
            src.on_step(1)
        assert seen == [(True, [1])] and src.gap_steps == 1
        src.on_step(2)
        assert not src.aside and src.asides == 1
    finally:
        src.stop()
    assert profiler.profile._prepare_trace is before  # stop gave it back
