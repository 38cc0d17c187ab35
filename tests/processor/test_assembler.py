import numpy as np

from argus.processor.assembler import RankInfo, WindowAssembler
from argus.wire.protocol import DTYPES, Msg


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _steps(steps, t0=0):
    r = np.zeros(len(steps), DTYPES[Msg.STEPS])
    r["step"] = steps
    r["start_ns"] = [t0 + 100 * s for s in steps]
    r["end_ns"] = [t0 + 100 * s + 90 for s in steps]
    return r


def _kernels(steps, starts, name=0):
    r = np.zeros(len(steps), DTYPES[Msg.KERNELS])
    r["step"], r["start_ns"], r["dur_ns"], r["name"], r["stream"] = steps, starts, 10, name, 7
    return r


def _rank(r):
    return RankInfo(rank=r, names=["k"])


def test_window_closes_when_every_active_rank_is_past_it_plus_lag():
    a = WindowAssembler(window_steps=2, close_lag_steps=1, clock=Clock())
    r0, r1 = _rank(0), _rank(1)
    a.add(r0, Msg.STEPS, _steps([0, 1, 2]))
    a.add(r1, Msg.STEPS, _steps([0, 1]))
    active = {0: r0, 1: r1}
    assert a.ready(active) == []  # rank 1 has not reported step 2 yet
    a.add(r1, Msg.STEPS, _steps([2]))
    assert a.ready(active) == [0]
    data, ranks = a.take(0)
    assert ranks == {0, 1} and data.steps.num_rows == 4 and (data.start_step, data.end_step) == (0, 1)
    assert a.buffered_events == 2  # step 2 of both ranks is still open


def test_a_hung_rank_does_not_hold_a_window_past_its_timeout():
    clock = Clock()
    a = WindowAssembler(window_steps=2, timeout_s=30, clock=clock)
    r0, r1 = _rank(0), _rank(1)
    a.add(r0, Msg.STEPS, _steps([0, 1]))
    clock.t = 10.0
    a.add(r0, Msg.STEPS, _steps([2]))
    clock.t = 29.0
    assert a.ready({0: r0, 1: r1}) == []
    clock.t = 30.0
    assert a.ready({0: r0, 1: r1}) == [0]
    assert a.ready({}, final=True) == [0, 1]


def test_memory_cap_drops_and_counts_batches():
    a = WindowAssembler(window_steps=10, max_events=5, clock=Clock())
    r0 = _rank(0)
    a.add(r0, Msg.KERNELS, _kernels([0, 0, 0, 0], [1, 2, 3, 4]))
    a.add(r0, Msg.KERNELS, _kernels([0, 0, 0], [5, 6, 7]))  # would exceed the cap
    assert a.buffered_events == 4
    data, _ = a.take(0)
    row = data.drops.to_pylist()[0]
    assert (row["rank"], row["table"], row["events"], row["batches"], row["reason"]) == (0, "kernels", 3, 1, "memory_cap")


def test_kernels_without_a_step_are_placed_by_time():
    a = WindowAssembler(window_steps=1, clock=Clock())
    r0 = _rank(0)
    a.add(r0, Msg.STEPS, _steps([5, 6, 7], t0=1000))  # steps start at 1500, 1600, 1700
    a.add(r0, Msg.KERNELS, _kernels([-1, -1, -1], [1550, 1650, 1799]))
    got = {}
    for w in sorted(a.windows):
        data, _ = a.take(w)
        if data.kernels is not None:
            got[w] = data.kernels.column("step").to_pylist()
    assert got == {5: [5], 6: [6], 7: [7]}


def test_names_are_decoded_per_rank():
    a = WindowAssembler(window_steps=1, clock=Clock())
    r0, r1 = RankInfo(rank=0, names=["alpha", "beta"]), RankInfo(rank=1, names=["beta", "alpha"])
    a.add(r0, Msg.KERNELS, _kernels([0], [1], name=1))
    a.add(r1, Msg.KERNELS, _kernels([0], [1], name=1))
    data, _ = a.take(0)
    assert data.kernels.column("name").to_pylist() == ["beta", "alpha"]


def _gpu_steps(name_id, steps, starts):
    r = np.zeros(len(steps), DTYPES[Msg.PHASES])
    r["step"], r["start_ns"], r["dur_ns"], r["name"], r["microbatch"] = steps, starts, 80, name_id, -1
    return r


def test_kernels_are_placed_by_the_gpu_step_boundaries_when_the_cpu_runs_ahead():
    """The host starts steps 5, 6, 7 at 1500, 1600, 1700 while the GPU, a step behind, runs
    them from 1590, 1690, 1790: a kernel at 1650 ran in step 5 on the device (by host time:
    step 6). The GPU's step phases place it and are not stored as phases."""
    from argus.wire.protocol import GPU_STEP_PHASE

    a = WindowAssembler(window_steps=1, clock=Clock())
    r0 = RankInfo(rank=0, names=["k", "forward", GPU_STEP_PHASE])
    a.add(r0, Msg.STEPS, _steps([5, 6, 7], t0=1000))
    a.add(r0, Msg.PHASES, _gpu_steps(2, [5, 6, 7], [1590, 1690, 1790]))
    a.add(r0, Msg.KERNELS, _kernels([-1, -1, -1, -1], [1550, 1650, 1750, 1799]))
    got, phases = {}, 0
    for w in sorted(a.windows):
        data, _ = a.take(w)
        if data.kernels is not None:
            got[w] = data.kernels.column("step").to_pylist()
        phases += 0 if data.phases is None else data.phases.num_rows
    # 1550: before the GPU's first known start, placed by host time (step 5)
    assert got == {5: [5, 5], 6: [6], 7: [7]} and phases == 0
