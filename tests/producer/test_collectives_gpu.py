"""On a CUDA device a collective is timed by its completion on the GPU: an event before the
launch, one recorded in the work's future callback. Fakes stand in for CUDA and the backend."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from argus.producer.collectives import CollectiveTracker
from argus.producer.recorder import Recorder
from argus.wire import Msg, RingReader, RingWriter, group_key


class FakeTimer:
    def __init__(self):
        self.marks, self.spans = 0, []

    def mark(self, stream=None, device=None):
        self.marks += 1
        self.devices = [*getattr(self, "devices", []), device]
        return ("event", self.marks)

    def phase(self, m0, m1, meta):
        self.spans.append((m0, m1, meta))

    def capturing(self):
        return False


class FakeFuture:
    def __init__(self):
        self.callbacks = []

    def add_done_callback(self, cb):
        self.callbacks.append(cb)


class FakeWork:
    def __init__(self):
        self.future = FakeFuture()

    def get_future(self):
        return self.future


class FakeRuntime:
    def __init__(self, ring):
        self.ring, self.recorder, self.cuda = ring, Recorder(ring), FakeTimer()
        self.active, self.mb_context, self.step, self.comm_issued = True, 0, 3, 0

    def on_main_thread(self):
        return False


def test_a_gpu_collective_completes_when_its_callback_event_does(tmp_path):
    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    rt = FakeRuntime(ring)
    tracker = CollectiveTracker(rt, lambda: False)
    from argus.producer.collectives import _Group

    g = _Group("dp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    tracker.groups[(id("pg"), -1)] = g
    launch = tracker._launch("pg", "allreduce", None)
    assert launch[5] == ("event", 1)  # marked before the launch, on the launching stream
    work = FakeWork()
    tracker._track(work, launch)
    assert not tracker.pending and reader.inflight.read().groups[0].pending == 1  # not done at launch
    (cb,) = work.future.callbacks
    cb(work.future)  # the backend completed the future: the end event is recorded now
    ((m0, m1, meta),) = rt.cuda.spans
    assert (m0, m1) == (("event", 1), ("event", 2))
    meta[0](meta[1], 1_000, 5_000)  # the CUDA-event thread resolved both events
    state = reader.inflight.read().groups[0]
    assert state.completed == 1 and state.pending == 0
    names = reader.new_names()
    (row,) = reader.drain(settled=False)[Msg.PHASES]
    assert names[row["name"]] == "dp-allreduce" and (row["start_ns"], row["dur_ns"], row["step"]) == (1_000, 4_000, 3)


def test_a_synchronous_gpu_collective_without_work_ends_on_the_gpu_not_at_its_return(tmp_path):
    """torch ≥ 2.8 returns no Work for a synchronous collective (the backend made the current
    stream wait on it). Its end is an event recorded on that stream after the return — not the
    CPU's return, which is only its launch; until the event resolves it is still in flight."""
    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    rt = FakeRuntime(ring)
    tracker = CollectiveTracker(rt, lambda: False)
    from argus.producer.collectives import _Group

    g = _Group("tp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    tracker.groups[(id("pg"), -1)] = g
    launch = tracker._launch("pg", "allreduce", None)
    tracker._track(None, launch)
    ((m0, m1, meta),) = rt.cuda.spans  # timed between two GPU events …
    assert (m0, m1) == (("event", 1), ("event", 2))
    assert reader.inflight.read().groups[0].pending == 1  # … and not complete at the CPU's return
    meta[0](meta[1], 2_000, 9_000)
    assert reader.inflight.read().groups[0].completed == 1
    names = reader.new_names()
    (row,) = reader.drain(settled=False)[Msg.PHASES]
    assert names[row["name"]] == "tp-allreduce" and (row["start_ns"], row["dur_ns"]) == (2_000, 7_000)


def test_a_gloo_collective_on_cpu_tensors_in_a_gpu_job_is_timed_on_the_host(tmp_path):
    """A GPU job's gloo group on CPU tensors: no GPU event (it would time the GPU stream's
    queue, sometimes negative) — the host's launch and completion, as on a CPU job."""
    import torch

    from argus.producer.collectives import _Group, _on_cuda

    assert _on_cuda(([torch.zeros(2)],)) is False and _on_cuda(([[torch.zeros(2)]], [torch.zeros(1)])) is False
    assert _on_cuda((3,)) is True  # nothing to tell by: the device's clock, as before
    ring = RingWriter.create(tmp_path)
    rt = FakeRuntime(ring)
    tracker = CollectiveTracker(rt, lambda: False)
    tracker.groups[(id("pg"), -1)] = _Group("dp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    launch = tracker._launch("pg", "allreduce", None, on_cuda=False)
    assert launch[5] is None and rt.cuda.marks == 0
    tracker._track(None, launch)
    assert rt.cuda.spans == []


def test_a_collective_issued_during_cuda_graph_capture_touches_no_future(tmp_path):
    """A callback on the work's future during capture forks a pool stream into the capture
    that is never joined: the user's capture fails. Nothing is added, nothing recorded, and
    the in-flight count is settled."""
    from argus.producer.collectives import _Group

    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    rt = FakeRuntime(ring)
    rt.cuda.mark = lambda: None  # CudaTimer.mark records nothing while capturing …
    rt.cuda.capturing = lambda: True  # … and says why
    tracker = CollectiveTracker(rt, lambda: False)
    tracker.groups[(id("pg"), -1)] = _Group("tp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    launch = tracker._launch("pg", "allreduce", None)
    work = FakeWork()
    tracker._track(work, launch)
    assert work.future.callbacks == [] and not tracker.pending and rt.cuda.spans == []
    state = reader.inflight.read().groups[0]
    assert state.pending == 0 and state.completed == 1
    reader.new_names()
    assert Msg.PHASES not in reader.drain(settled=False)


class _CpuRuntime(FakeRuntime):
    def __init__(self, ring):
        super().__init__(ring)
        self.cuda = None
        self.failures = []

    def fail(self, why):
        self.failures.append(why)


def test_a_coalesced_p2p_batch_completes_with_the_work_its_end_returns(tmp_path):
    """``batch_isend_irecv`` on NCCL: sends and receives issued between ``_start_coalescing``
    and ``_end_coalescing`` return placeholder works; the batch completes with the work the
    end returns. Each is in flight until then, and ends when it does."""
    from argus.producer.collectives import _Group

    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    rt = _CpuRuntime(ring)
    tracker = CollectiveTracker(rt, lambda: False)
    pg = object()
    for peer in (0, 1):
        tracker.groups[(id(pg), peer)] = _Group("pp", ring.inflight.slot(group_key([0, 1 + peer]), 6, 2, 0), 6)
    placeholders = []

    def send(pg_, tensors, peer, tag=0):
        placeholders.append(FakeWork())
        return placeholders[-1]

    batch_work = FakeWork()
    start = tracker._wrap_start_coalescing(lambda pg_, device=None: None)
    end = tracker._wrap_end_coalescing(lambda pg_, device=None: batch_work)
    pg_send = tracker._wrap(send, "send", "send")
    start(pg, "cuda")
    pg_send(pg, [], 0)
    pg_send(pg, [], 1)
    assert all(w.future.callbacks == [] for w in placeholders)  # the placeholders are not what completes
    assert end(pg, "cuda") is batch_work
    assert sum(g.pending for g in reader.inflight.read().groups) == 2
    (cb,) = batch_work.future.callbacks
    cb(batch_work.future)
    groups = reader.inflight.read().groups
    assert sum(g.pending for g in groups) == 0 and sum(g.completed for g in groups) == 2
    reader.new_names()
    assert len(reader.drain(settled=False)[Msg.PHASES]) == 2 and rt.failures == []


def test_each_step_end_marks_the_gpu_and_the_steps_gpu_interval_is_emitted():
    """At every step end an event on the current stream; between two of them the step's
    interval on the GPU, as a ``gpu-step`` phase (the processor places kernels by it)."""
    from types import SimpleNamespace

    from argus.producer.runtime import Runtime
    from argus.wire import GPU_STEP_PHASE

    rt = SimpleNamespace(cuda=FakeTimer(), _gpu_step_mark=None)
    Runtime._gpu_step_boundary(rt, 0)  # the first step's start on the GPU is unknown: nothing yet
    Runtime._gpu_step_boundary(rt, 1)
    Runtime._gpu_step_boundary(rt, 2)
    assert [(m0, m1) for m0, m1, _ in rt.cuda.spans] == [(("event", 1), ("event", 2)), (("event", 2), ("event", 3))]
    assert [meta for *_, meta in rt.cuda.spans] == [(1, -1, GPU_STEP_PHASE, "host", ""), (2, -1, GPU_STEP_PHASE, "host", "")]


def test_a_collective_whose_gpu_span_the_timer_drops_is_not_left_in_flight(tmp_path):
    """The CUDA timer drops a span past its cap (or on a CUDA error): the collective's
    in-flight count is settled all the same — hang snapshots read it, and a count left
    pending shows this rank waiting in a collective it finished long ago."""
    import types

    from argus.producer.collectives import _Group
    from argus.producer.cuda_timing import CudaTimer
    from argus.producer.runtime import Runtime
    from tests.producer.test_cuda_timing import FakeClock, FakeCuda

    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    rt = FakeRuntime(ring)
    clock = FakeClock()
    rt.cuda = CudaTimer(lambda *a: None, torch_module=types.SimpleNamespace(cuda=FakeCuda(clock), __name__="fake"),
                        clock=clock, max_pending=0, dropped=lambda meta: Runtime._dropped_cuda(rt, meta))
    tracker = CollectiveTracker(rt, lambda: False)
    tracker.groups[(id("pg"), -1)] = _Group("dp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    launch = tracker._launch("pg", "allreduce", None)
    work = FakeWork()
    tracker._track(work, launch)
    assert reader.inflight.read().groups[0].pending == 1
    (cb,) = work.future.callbacks
    cb(work.future)  # completed; its end event is handed to a full timer, which drops the span
    assert rt.cuda.stats["dropped_full"] == 1
    state = reader.inflight.read().groups[0]
    assert state.pending == 0 and state.completed == 1
    reader.new_names()
    assert Msg.PHASES not in reader.drain(settled=False)  # no interval was measured: none is stored


def test_a_collective_on_another_devices_tensor_is_timed_on_that_devices_stream(tmp_path):
    """A rank on cuda:0 all-reducing a tensor on cuda:1: both events go on cuda:1's current
    stream (the future's callback runs under that device's guard); on the rank's device the
    end event would time the user's stream instead."""
    import types

    from argus.producer.collectives import _cuda_device, _Group

    on = lambda i: types.SimpleNamespace(is_cuda=True, device=types.SimpleNamespace(index=i))  # noqa: E731
    assert _cuda_device(([on(1)],)) == 1 and _cuda_device((on(None),)) is None
    assert _cuda_device((types.SimpleNamespace(is_cuda=False),)) == -1 and _cuda_device((3,)) is None
    ring = RingWriter.create(tmp_path)
    rt = FakeRuntime(ring)
    tracker = CollectiveTracker(rt, lambda: False)
    tracker.groups[(id("pg"), -1)] = _Group("dp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    launch = tracker._launch("pg", "allreduce", None, True, 1)
    work = FakeWork()
    tracker._track(work, launch)
    (cb,) = work.future.callbacks
    cb(work.future)
    assert rt.cuda.devices == [1, 1]
    tracker._track(None, tracker._launch("pg", "allreduce", None))  # the rank's own device
    assert rt.cuda.devices == [1, 1, None, None]
