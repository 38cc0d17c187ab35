"""On a CUDA device a collective is timed by its completion on the GPU: an event before the
launch, one recorded in the work's future callback. Fakes stand in for CUDA and the backend."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from argus.producer.collectives import CollectiveTracker  # noqa: E402
from argus.producer.recorder import Recorder  # noqa: E402
from argus.wire import Msg, RingReader, RingWriter, group_key  # noqa: E402


class FakeTimer:
    def __init__(self):
        self.marks, self.spans = 0, []

    def mark(self):
        self.marks += 1
        return ("event", self.marks)

    def phase(self, m0, m1, meta):
        self.spans.append((m0, m1, meta))


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
