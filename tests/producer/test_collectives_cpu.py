"""On the CPU a collective ends when its future completes (or ``wait()`` returns). Fakes stand in
for the backend's works and futures."""

from __future__ import annotations


import pytest

pytest.importorskip("torch")

from argus.producer.collectives import CollectiveTracker, _Group
from argus.producer.recorder import Recorder
from argus.wire import Msg, RingReader, RingWriter, group_key


class FakeFuture:
    __slots__ = ("callbacks",)

    def __init__(self):
        self.callbacks = []

    def add_done_callback(self, cb):
        self.callbacks.append(cb)

    def complete(self):
        for cb in self.callbacks:
            cb(self)


class FakeWork:
    __slots__ = ("future",)

    def __init__(self):
        self.future = FakeFuture()

    def get_future(self):
        return self.future


class FakeRuntime:
    def __init__(self, ring):
        self.ring, self.recorder, self.cuda = ring, Recorder(ring), None
        self.active, self.mb_context, self.step, self.comm_issued = True, 0, 3, 0

    def on_main_thread(self):
        return False


def test_a_work_dropped_at_once_keeps_its_own_launch(tmp_path):
    """DDP's comm hook keeps only a bucket's future: its Work object dies at once, and the next
    bucket's Work could take its address — keyed by ``id(work)``, the first completion then
    finished the second's launch and the second found none (a real DDP job: one of two bucket
    all-reduces lost in 8 of 120 rank-steps). Both must be recorded, each with its own start."""
    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    tracker = CollectiveTracker(FakeRuntime(ring), lambda: False)
    tracker.groups[(id("pg"), -1)] = _Group("dp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    first, second = tracker._launch("pg", "allreduce", None), tracker._launch("pg", "allreduce", None)
    work = FakeWork()
    tracker._track(work, first)
    futures, freed = [work.future], id(work)
    del work  # the hook returns the future only; the next Work is made at once, as the next bucket's is
    work = FakeWork()
    reused = id(work) == freed
    tracker._track(work, second)
    futures.append(work.future)
    del work
    for fut in futures:
        fut.complete()
    rows = reader.drain(settled=False)[Msg.PHASES]
    assert sorted(rows["start_ns"].tolist()) == [first[0], second[0]], f"each launch once (address reused: {reused})"
    assert not tracker.pending
    state = reader.inflight.read().groups[0]
    assert state.completed == 2 and state.pending == 0
