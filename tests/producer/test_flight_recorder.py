"""Asynchronous NCCL collectives timed from the Flight Recorder's durations (issue 22, item 5):
nothing is attached to the work, so nothing the job runs changes. Fakes stand in for CUDA and
ProcessGroupNCCL's ring; the key that finds a record is checked against torch's real ring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from argus.producer.flight_recorder import FlightRecorderTimes, enable_timing


def entry(group: str, seq: int, state: str = "completed", duration_ms: float | None = 2.0, **kw) -> dict:
    return {"process_group": [group, "desc"], "collective_seq_id": seq, "state": state, "duration_ms": duration_ms,
            "is_p2p": False, "retired": state == "completed", "profiling_name": "nccl:all_reduce", **kw}


class Ring:
    def __init__(self):
        self.entries: list[dict] = []
        self.reads = 0

    def __call__(self) -> dict:
        self.reads += 1
        return {"version": "2.10", "entries": list(self.entries)}


def times(ring):
    done = []
    clock = [0.0]
    fr = FlightRecorderTimes(ring, lambda launch, t0, t1: done.append((launch, t0, t1)), interval_s=1.0,
                             clock=lambda: clock[0])
    return fr, done, clock


def test_a_groups_collectives_end_one_after_another_on_its_stream():
    """end_k = max(arrival_k, end_(k-1)) + duration_k: the second arrived while the first still
    ran, so it starts when the first ends; the third arrived after, so at its arrival."""
    ring = Ring()
    fr, done, clock = times(ring)
    for seq in (1, 2, 3):
        assert fr.expect(("0", seq), f"c{seq}")
    fr.arrived(("0", 1), 1_000_000)
    fr.arrived(("0", 2), 1_500_000)
    fr.arrived(("0", 3), 9_000_000)
    assert done == [] and ring.reads == 0  # no duration yet: nothing read before the poll
    ring.entries = [entry("0", 1, duration_ms=2.0), entry("0", 2, duration_ms=1.0), entry("0", 3, duration_ms=0.5)]
    fr.poll()
    assert done == [("c1", 1_000_000, 3_000_000), ("c2", 1_500_000, 4_000_000), ("c3", 9_000_000, 9_500_000)]
    assert fr.pending == 0 and fr.usable


def test_the_ring_is_read_as_seldom_as_it_allows_and_only_while_something_waits():
    """A read holds the GIL ~30 ms: once half the ring was written since the last read (never
    within a second of it), else every 5 s."""
    ring = Ring()
    done = []
    clock = [100.0]
    fr = FlightRecorderTimes(ring, lambda launch, t0, t1: done.append((launch, t0, t1)), interval_s=1.0,
                             clock=lambda: clock[0], capacity=100)
    fr.poll()
    assert ring.reads == 0  # nothing awaited
    fr.expect(("0", 1), "c1")
    fr.arrived(("0", 1), 10)
    ring.entries = [entry("0", 1, state="started", duration_ms=None)]
    fr.poll()
    assert ring.reads == 1 and done == []  # the first read at once; the collective still runs
    ring.entries = [entry("0", 1, duration_ms=0.25)]
    clock[0] = 102.0
    fr.poll()
    assert ring.reads == 1  # 2 s later, with 1 record of 100 written: not yet
    clock[0] = 105.1
    fr.poll()
    assert ring.reads == 2 and done == [("c1", 10, 10 + 250_000)]  # 5 s: read
    for seq in range(2, 53):  # half the ring written …
        fr.expect(("0", seq), f"c{seq}")
    clock[0] = 105.6
    fr.poll()
    assert ring.reads == 2  # … but within a second of the last read
    clock[0] = 106.2
    fr.poll()
    assert ring.reads == 3


def test_a_record_overwritten_before_it_was_read_settles_without_a_phase():
    ring = Ring()
    fr, done, _ = times(ring)
    fr.expect(("0", 5), "old")
    fr.expect(("0", 900), "new")
    fr.arrived(("0", 5), 100)
    fr.arrived(("0", 900), 200)
    ring.entries = [entry("0", s, duration_ms=1.0) for s in range(800, 1000)]  # 5 left the ring
    fr.poll()
    assert done == [("old", None, None), ("new", 200, 1_000_200)] and fr.stats["lost"] == 1


def test_a_ring_without_durations_or_records_says_it_cannot_time():
    ring = Ring()
    fr, done, clock = times(ring)
    fr.expect(("1", 1), "c")
    fr.arrived(("1", 1), 5)
    ring.entries = [entry("1", 1, duration_ms=None)]  # TORCH_NCCL_ENABLE_TIMING off for this group
    fr.poll()
    assert done == [("c", None, None)] and not fr.usable
    fr2, done2, _ = times(Ring())  # TORCH_FR_BUFFER_SIZE=0: an empty ring
    fr2.expect(("1", 1), "c")
    fr2.poll()
    assert done2 == [("c", None, None)] and not fr2.usable


def test_the_last_read_settles_everything_still_waiting():
    ring = Ring()
    fr, done, _ = times(ring)
    fr.expect(("0", 1), "c")  # its arrival never resolved
    ring.entries = [entry("0", 1)]
    fr.poll(final=True)
    assert done == [("c", None, None)] and fr.pending == 0


def test_a_record_of_another_op_under_the_key_is_never_taken():
    """A group with two backends may count its sequence on the other one: the record found
    under the key is then another collective's. Its duration is not taken, and the ring is no
    longer trusted for timing (the caller falls back)."""
    ring = Ring()
    fr, done, _ = times(ring)
    fr.expect(("0", 4), "ag", "allgather")
    fr.arrived(("0", 4), 100)
    ring.entries = [entry("0", 4, profiling_name="nccl:all_reduce")]
    fr.poll()
    assert done == [("ag", None, None)] and fr.mismatched == 1 and not fr.usable
    fr2, done2, _ = times(Ring())
    fr2.dump.entries = [entry("0", 1, profiling_name="nccl:_allgather_base", duration_ms=1.0),
                        entry("0", 2, profiling_name="nccl:reduce_scatter_tensor_coalesced", duration_ms=2.0),
                        entry("0", 3, profiling_name="nccl:all_reduce_barrier", duration_ms=0.5)]
    for seq, op in ((1, "allgather"), (2, "reduce-scatter"), (3, "barrier")):
        fr2.expect(("0", seq), op, op)
        fr2.arrived(("0", seq), seq * 10_000_000)
    fr2.poll()
    assert [d[0] for d in done2 if d[1] is not None] == ["allgather", "reduce-scatter", "barrier"] and fr2.usable


def test_timing_is_switched_on_unless_the_job_decided():
    env: dict[str, str] = {}
    assert enable_timing(env) and env == {"TORCH_NCCL_ENABLE_TIMING": "1"}
    assert not enable_timing({"TORCH_NCCL_ENABLE_TIMING": "0"})
    mine = {"TORCH_NCCL_ENABLE_TIMING": "true"}
    assert enable_timing(mine) and mine == {"TORCH_NCCL_ENABLE_TIMING": "true"}


# -- through the collective tracker -----------------------------------------------------------

pytest.importorskip("torch")

from argus.producer.collectives import CollectiveTracker, _Group  # noqa: E402
from argus.producer.recorder import Recorder  # noqa: E402
from argus.wire import Msg, RingReader, RingWriter, group_key  # noqa: E402


class SideEffects:
    """What ``Future.add_done_callback`` does on a CUDA future before running the callback
    (ivalue_inl.h ``invokeCallback``): a pool stream made to wait on the collective, and each
    output's memory recorded on it (``recordDataPtrOnStream``)."""

    def __init__(self):
        self.pool_stream_waits = 0
        self.record_data_ptr = 0


class CudaFuture:
    def __init__(self, effects: SideEffects, outputs: int = 2):
        self.effects, self.outputs = effects, outputs

    def add_done_callback(self, cb):
        self.effects.pool_stream_waits += 1
        self.effects.record_data_ptr += self.outputs
        cb(self)

    def then(self, cb):
        self.add_done_callback(cb)


class NcclWork:
    def __init__(self, effects):
        self.future = CudaFuture(effects)

    def get_future(self):
        return self.future


class NcclGroup:
    group_name = "3"

    def __init__(self):
        self.seq = 0

    def _get_sequence_number_for_group(self):
        return self.seq


class Timer:
    def __init__(self):
        self.marks, self.spans, self.on_pass = 0, [], []

    def mark(self, stream=None, device=None):
        self.marks += 1
        return ("event", self.marks)

    def phase(self, m0, m1, meta):
        self.spans.append((m0, m1, meta))

    def capturing(self):
        return False


class Runtime:
    def __init__(self, ring):
        self.ring, self.recorder, self.cuda = ring, Recorder(ring), Timer()
        self.active, self.mb_context, self.step, self.comm_issued = True, 0, 4, 0
        self.nccl_timing = True

    def on_main_thread(self):
        return False


def test_an_async_nccl_collective_is_timed_without_touching_its_work(tmp_path):
    """Issue 22 item 5: the future callback made a pool stream wait and recorded every output on
    it. Timed from the Flight Recorder, the work is never touched, and the phase still runs from
    the arrival to the end NCCL measured."""
    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    rt = Runtime(ring)
    tracker = CollectiveTracker(rt, lambda: False)
    fr_ring = Ring()
    tracker.fr_dump = fr_ring
    tracker.groups[(id("pg"), -1)] = _Group("dp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    effects, pg = SideEffects(), NcclGroup()
    launch = tracker._launch("pg", "allreduce", None)
    pg.seq = 17  # the backend counted this collective
    tracker._track(NcclWork(effects), launch, pg)
    assert (effects.pool_stream_waits, effects.record_data_ptr) == (0, 0)
    ((m0, m1, meta),) = rt.cuda.spans
    assert m0 == m1 == ("event", 1)  # the arrival alone, resolved on the GPU clock
    meta[0](meta[1], 7_000_000, 7_000_000)
    assert reader.inflight.read().groups[0].pending == 1  # arrived, not complete
    fr_ring.entries = [entry("3", 17, duration_ms=4.5)]
    (poll,) = rt.cuda.on_pass
    poll(False)
    state = reader.inflight.read().groups[0]
    assert state.completed == 1 and state.pending == 0
    names = reader.new_names()
    (row,) = reader.drain(settled=False)[Msg.PHASES]
    assert names[row["name"]] == "dp-allreduce"
    assert (row["start_ns"], row["dur_ns"], row["step"]) == (7_000_000, 4_500_000, 4)


def test_without_nccl_timing_the_callback_is_the_fallback(tmp_path):
    ring = RingWriter.create(tmp_path)
    rt = Runtime(ring)
    rt.nccl_timing = False  # the job set TORCH_NCCL_ENABLE_TIMING=0
    tracker = CollectiveTracker(rt, lambda: False)
    tracker.fr_dump = Ring()
    tracker.groups[(id("pg"), -1)] = _Group("dp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    effects = SideEffects()
    tracker._track(NcclWork(effects), tracker._launch("pg", "allreduce", None), NcclGroup())
    assert effects.pool_stream_waits == 1 and not rt.cuda.on_pass


REAL_RING = textwrap.dedent("""
    import json, pickle, torch, torch.distributed as dist
    from torch._C import _distributed_c10d as c10d
    from argus.producer.flight_recorder import fr_key
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    sub = dist.new_group([0])
    keys = []
    for pg in (dist.group.WORLD, sub, dist.group.WORLD):
        work = dist.all_reduce(torch.ones(3), group=pg, async_op=True)
        keys.append(fr_key(pg))
        work.wait()
    ring = pickle.loads(c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False))
    found = [[e["process_group"][0], e["collective_seq_id"], e["profiling_name"]] for e in ring["entries"]]
    print(json.dumps({{"keys": keys, "found": found}}))
    dist.destroy_process_group()
""")


def test_the_key_read_after_a_launch_finds_that_collective_in_torchs_own_ring(tmp_path):
    """The group name and sequence number Argus reads right after a launch are the
    ``process_group[0]`` and ``collective_seq_id`` torch's Flight Recorder stores for it (checked
    on gloo's ring, which the same recorder keeps; NCCL's adds the durations)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-c", REAL_RING.format(port=port)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TORCH_FR_BUFFER_SIZE": "64"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    found = {(g, s): name for g, s, name in doc["found"]}
    keys = [tuple(k) for k in doc["keys"]]
    assert len(set(keys)) == 3 and keys[0][0] == keys[2][0] != keys[1][0]
    assert all(found.get(k, "").endswith("all_reduce") for k in keys), (keys, found)


def test_a_point_to_point_op_is_never_matched_to_a_collective_record(tmp_path, monkeypatch):
    """send/recv count on the group's p2p sequence; the collective sequence read after one would
    name the previous collective's record. They keep the callback path (through the wrapped
    process-group method, as the job calls it)."""
    ring = RingWriter.create(tmp_path)
    rt = Runtime(ring)
    tracker = CollectiveTracker(rt, lambda: False)
    tracker.fr_dump = Ring()
    tracker.groups[(id(None), 1)] = _Group("pp", ring.inflight.slot(group_key([0, 1]), 4, 2, 0), 4)
    monkeypatch.setattr(tracker, "_group", lambda pg, peer: tracker.groups[(id(None), 1)])
    effects, pg = SideEffects(), NcclGroup()
    send = tracker._wrap(lambda pg, tensors, dst, tag=0: NcclWork(effects), "send", "send")
    monkeypatch.setattr("argus.producer.collectives._cuda_device", lambda args: 0)
    send(pg, [object()], 1)
    assert effects.pool_stream_waits == 1 and not rt.cuda.on_pass  # the callback, no ring read
    allreduce = tracker._wrap(lambda pg, tensors: NcclWork(effects), "allreduce", "allreduce")
    allreduce(pg, [object()])
    assert effects.pool_stream_waits == 1 and rt.cuda.on_pass  # a collective: the Flight Recorder
