"""Per-op timelines of 1F1B pipeline jobs, made here for tests: the shape of the OSDI 2025 what-if
artifact's traces (one row per op, device-side start and duration, waits included, no microbatch
labels), from a small hand-written schedule that shares no code with Argus.

Each data-parallel replica runs Megatron's non-interleaved 1F1B over ``pp`` stages: warm-up
forwards, then one forward and one backward at a time, then the remaining backwards. A send and
its receive end together, when the later of the two was posted plus the transfer. Every step
begins with a parameter all-gather and ends with a gradient reduce-scatter over the replicas of
each stage, then the optimizer. Returns the table and the step times with and without the
injected slowness (``ideal``: every op at its nominal duration, no noise, no fault)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FWD, BWD = 0.010, 0.020  # nominal compute seconds per microbatch and stage
XFER, AG, RS, OPT = 0.0005, 0.003, 0.004, 0.002


@dataclass
class Job:
    pp: int = 4
    dp: int = 4
    microbatches: int = 8
    steps: int = 8
    noise: float = 0.02  # each op's duration × lognormal(0, noise)
    seed: int = 0
    #: (stage, dp) → (forward factor, backward factor): a slow device, from the first step
    slow: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    stage_factor: dict[int, float] = field(default_factory=dict)  # stage → compute factor (a long stage)
    seq_sigma: float = 0.0  # per (replica, step, microbatch) length factor, the same on every stage
    whole: dict[int, float] = field(default_factory=dict)  # step → every rank's compute factor (the job slowed)
    time_scale: float = 1.0  # every time × this (a job of longer steps, the same shape)


def _stage_ops(pp: int, s: int, m: int) -> list[list[tuple[str, int]]]:
    """Megatron's non-interleaved 1F1B for stage ``s``: items of one compute op, or of the transfers
    posted together (``send_forward_recv_backward`` and ``send_backward_recv_forward`` are batched:
    posted one after the other, a deadlock)."""
    first, last = s == 0, s == pp - 1
    warm = min(pp - s - 1, m)
    rest = m - warm
    items: list[list[tuple[str, int]]] = []

    def xfer(*ops: tuple[str, int]) -> None:
        ops_ = [o for o in ops if o[0]]
        if ops_:
            items.append(ops_)

    for i in range(warm):
        xfer(("forward-recv" if not first else "", i))
        items.append([("forward-compute", i)])
        xfer(("forward-send" if not last else "", i))
    if rest:
        xfer(("forward-recv" if not first else "", warm))
    for i in range(rest):
        f = warm + i
        items.append([("forward-compute", f)])
        xfer(("forward-send" if not last else "", f), ("backward-recv" if not last else "", i))
        items.append([("backward-compute", i)])
        if i == rest - 1:
            xfer(("backward-send" if not first else "", i))
        else:
            xfer(("backward-send" if not first else "", i), ("forward-recv" if not first else "", f + 1))
    for i in range(rest, m):
        xfer(("backward-recv" if not last else "", i))
        items.append([("backward-compute", i)])
        xfer(("backward-send" if not first else "", i))
    return items


def _replica_step(job: Job, d: int, step: int, t0: np.ndarray, rng: np.random.Generator | None,
                  seq: np.ndarray) -> tuple[list[tuple], np.ndarray]:
    """One replica's pipeline phase: ops as (stage, optype, mb, start, dur) and each stage's end."""
    pp, m = job.pp, job.microbatches
    lists = [_stage_ops(pp, s, m) for s in range(pp)]
    ptr = [0] * pp
    clock = t0.astype(float).copy()
    posted: dict[tuple, float] = {}
    rows: list[tuple] = []

    def noisy(x: float) -> float:
        return x * float(np.exp(rng.normal(0.0, job.noise))) if rng is not None and job.noise else x

    def key(s: int, op: str, i: int) -> tuple:
        forward = op.startswith("forward")
        peer = s + 1 if (op.endswith("send") == forward) else s - 1
        return (forward, i, min(s, peer)), op.endswith("send")

    progress = True
    while progress:
        progress = False
        for s in range(pp):
            while ptr[s] < len(lists[s]):
                item = lists[s][ptr[s]]
                op, i = item[0]
                if op.endswith("compute"):
                    base = FWD if op.startswith("forward") else BWD
                    f = job.stage_factor.get(s, 1.0) * seq[i]
                    slow = job.slow.get((s, d))
                    if slow is not None:
                        f *= slow[0] if op.startswith("forward") else slow[1]
                    dur = noisy(base * f)
                    rows.append((s, op, i, clock[s], dur))
                    clock[s] += dur
                    ptr[s] += 1
                    progress = True
                    continue
                # a batch of transfers, posted together; each ends when its partner has posted too
                for o, j in item:
                    k, send = key(s, o, j)
                    posted.setdefault((k, send), clock[s])
                if any((key(s, o, j)[0], not key(s, o, j)[1]) not in posted for o, j in item):
                    break  # a partner has not posted yet
                end = clock[s]
                for o, j in item:
                    k, send = key(s, o, j)
                    e = max(posted[(k, send)], posted[(k, not send)]) + noisy(XFER)
                    rows.append((s, o, j, posted[(k, send)], e - posted[(k, send)]))
                    end = max(end, e)
                clock[s] = end
                ptr[s] += 1
                progress = True
    assert all(p == len(ops) for p, ops in zip(ptr, lists)), "the schedule deadlocked"
    return rows, clock


def make(job: Job) -> tuple[pa.Table, list[float], list[float]]:
    """The timeline, the recorded step times and the ideal step times."""
    rng = np.random.default_rng(job.seed)
    table: dict[str, list] = {k: [] for k in ("stage", "dp_rank", "rank", "step", "optype", "start_ts", "duration",
                                              "mb_id")}
    recorded, ideal = [], []
    for step in range(job.steps):
        seqs = np.exp(rng.normal(0.0, job.seq_sigma, (job.dp, job.microbatches))) if job.seq_sigma else \
            np.ones((job.dp, job.microbatches))
        seqs = seqs * job.whole.get(step, 1.0)
        step_rows = []
        ends = np.zeros((job.dp, job.pp))
        for d in range(job.dp):
            t0 = np.full(job.pp, AG)  # the parameter all-gather, every rank at once
            for s in range(job.pp):
                step_rows.append((s, d, "params-all-gather", -1, 0.0, AG))
            rows, clock = _replica_step(job, d, step, t0, rng, seqs[d])
            step_rows += [(s, d, op, i, st, du) for s, op, i, st, du in rows]
            ends[d] = clock
        for s in range(job.pp):  # the gradient reduce-scatter over the stage's replicas, then the optimizer
            start = ends[:, s]
            done = start.max() + RS
            for d in range(job.dp):
                step_rows.append((s, d, "grads-reduce-scatter", -1, float(start[d]), float(done - start[d])))
                step_rows.append((s, d, "optimizer", -1, float(done), OPT))
        recorded.append(float(max(r[4] + r[5] for r in step_rows)))
        for s, d, op, _i, st, du in step_rows:
            table["stage"].append(s)
            table["dp_rank"].append(d)
            table["rank"].append(d * job.pp + s)  # one rank per TP group: placed dp-major
            table["step"].append(step)
            table["optype"].append(op)
            table["start_ts"].append(st)
            table["duration"].append(du)
            table["mb_id"].append(-1)  # no microbatch labels
        # the ideal: no slow device, no noise, even inputs, the stages' work spread evenly
        mean = float(np.mean([job.stage_factor.get(s, 1.0) for s in range(job.pp)]))
        base = Job(pp=job.pp, dp=job.dp, microbatches=job.microbatches, steps=1, noise=0.0,
                   stage_factor={s: mean for s in range(job.pp)})
        rows0, clock0 = _replica_step(base, 0, step, np.full(job.pp, AG), None, np.ones(job.microbatches))
        ideal.append(float(clock0.max() + RS + OPT))
    k = job.time_scale
    table["start_ts"] = [t * k for t in table["start_ts"]]
    table["duration"] = [t * k for t in table["duration"]]
    return pa.table(table), [t * k for t in recorded], [t * k for t in ideal]


def write(job: Job, path) -> tuple[list[float], list[float]]:
    table, recorded, ideal = make(job)
    pq.write_table(table, path)
    return recorded, ideal
