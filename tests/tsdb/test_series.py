"""A closed window as series: labels a TSDB can index, one stamp per (rank, step), exact sums."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from argus.compress import summarize_kernels
from argus.sim import Engine, SimConfig
from argus.topology import parse_layout
from argus.tsdb.series import AttemptClock, WindowJob, _phase_waits, build_window_series

LAYOUT = "tp=2,pp=2,dp=2"
NOW_NS = 1_800_000_000_000_000_000


@pytest.fixture(scope="module")
def records():
    return list(Engine(SimConfig(ranks=8, steps=10, layout=LAYOUT, gpus_per_host=4)).run())


def _job(records, lo: int, hi: int) -> WindowJob:
    recs = records[lo:hi + 1]
    kernels = pa.concat_tables([r.kernels_table() for r in recs])
    summaries, _ = summarize_kernels(kernels, lo // 5, lo, hi)
    layout = parse_layout(LAYOUT, world_size=8)
    return WindowJob(run_id="r", attempt_id="0", host="node-0000", layout=layout,
                     ranks={r: (f"node-{r // 4:04d}", r % 4, f"GPU-{r}") for r in range(8)},
                     window=lo // 5, start_step=lo, end_step=hi,
                     steps=pa.concat_tables([r.steps_table() for r in recs]),
                     phases=pa.concat_tables([r.phases_table() for r in recs]),
                     hw=pa.concat_tables([r.hw for r in recs if r.hw is not None]), summaries=summaries)


def _samples(batch, name: str) -> list[tuple[dict, int, float]]:
    s, t, v = batch.arrays()
    out = []
    for sid, ts, val in zip(s.tolist(), t.tolist(), v.tolist()):
        labels = dict(batch.keys[sid])
        if labels["__name__"] == name:
            out.append((labels, ts, val))
    return out


def test_labels_are_bounded_and_steps_are_values(records):
    clock = AttemptClock()
    first = build_window_series(_job(records, 0, 4), clock, "train", now_ns=NOW_NS)
    second = build_window_series(_job(records, 5, 9), clock, "train", now_ns=NOW_NS + 10**9)
    assert all("step" not in dict(k) for k in first.keys)
    assert all(dict(k)["job"] == "train" and dict(k)["run"] == "r" for k in first.keys)
    rank_series = [dict(k) for k in first.keys if "rank" in dict(k) and dict(k)["__name__"] == "argus_step"]
    assert {k["host"] for k in rank_series} == {"node-0000", "node-0001"}
    assert {tuple(sorted(k)) for k in rank_series} == {("__name__", "attempt", "dp", "host", "job", "pp", "rank",
                                                         "run", "tp")}  # coordinates of axes > 1 only
    # the same series every window: cardinality does not grow with steps
    per_window = lambda b: {k for k in b.keys if dict(k)["__name__"].startswith(("argus_step", "argus_phase"))}  # noqa: E731
    assert per_window(first) == per_window(second)


def test_one_increasing_stamp_per_rank_step_near_now(records):
    clock = AttemptClock()
    batches = [build_window_series(_job(records, lo, lo + 4), clock, "j", now_ns=NOW_NS) for lo in (0, 5)]
    steps = [x for b in batches for x in _samples(b, "argus_step")]
    by_rank: dict[str, list[tuple[int, float]]] = {}
    for labels, ts, step in steps:
        by_rank.setdefault(labels["rank"], []).append((ts, step))
    for rows in by_rank.values():
        assert [s for _, s in rows] == list(range(10))
        assert all(b[0] > a[0] for a, b in zip(rows, rows[1:]))
    # the first window's last activity maps to "now"; later windows keep the same offset
    assert max(ts for _, ts, _ in _samples(batches[0], "argus_step")) == NOW_NS // 10**6
    durations = [x for b in batches for x in _samples(b, "argus_step_duration_seconds")]
    ends = {(lab["rank"], ts) for lab, ts, _ in durations}
    assert ends == {(lab["rank"], ts) for lab, ts, _ in steps}  # durations share the step's stamp


def test_phase_aggregates_are_exact(records):
    job = _job(records, 0, 4)
    batch = build_window_series(job, AttemptClock(), "j", now_ns=NOW_NS)
    ph = job.phases.to_pylist()
    want_total: dict[tuple, float] = {}
    want_count: dict[tuple, int] = {}
    want_min: dict[tuple, float] = {}
    for p in ph:
        k = (str(p["rank"]), p["name"])
        want_count[k] = want_count.get(k, 0) + 1
        if p["dur_ns"] >= 0:
            want_total[k] = want_total.get(k, 0) + p["dur_ns"]
            if p["category"] == "comm":
                want_min[k] = min(want_min.get(k, np.inf), p["dur_ns"])
    got_total: dict[tuple, float] = {}
    for labels, _, v in _samples(batch, "argus_phase_seconds"):
        k = (labels["rank"], labels["phase"])
        got_total[k] = got_total.get(k, 0) + v * 1e9
    assert got_total.keys() == want_total.keys()
    assert all(abs(got_total[k] - want_total[k]) < 1e-3 * 5 for k in want_total)
    assert sum(v for _, _, v in _samples(batch, "argus_phase_count")) == len(ph)
    mins: dict[tuple, float] = {}
    for labels, _, v in _samples(batch, "argus_phase_min_seconds"):
        k = (labels["rank"], labels["phase"])
        mins[k] = min(mins.get(k, np.inf), v * 1e9)
        assert labels["category"] == "comm"
    assert mins.keys() == want_min.keys() and all(abs(mins[k] - want_min[k]) < 1e-3 for k in mins)
    assert all(lab["category"] != "comm" for lab, _, _ in _samples(batch, "argus_phase_wait_seconds"))


def test_waits_are_measured_or_nested_collectives():
    rank = np.array([0, 0, 0, 0, 1])
    start = np.array([0, 10, 50, 200, 0])
    dur = np.array([100, 20, 10, 40, 30])
    comm = np.array([False, True, True, False, False])
    wait = np.array([-1, -1, -1, 5, -1])
    assert _phase_waits(rank, start, dur, comm, wait).tolist() == [30.0, 0.0, 0.0, 5.0, 0.0]


def test_kernel_summaries_and_hardware_go_out_per_window(records):
    job = _job(records, 0, 4)
    batch = build_window_series(job, AttemptClock(), "j", now_ns=NOW_NS)
    counts = _samples(batch, "argus_kernel_count")
    assert len(counts) == job.summaries.num_rows and len({ts for _, ts, _ in counts}) == 1
    assert {k for k in counts[0][0]} >= {"kernel", "stream", "cluster", "op", "category", "rank", "host"}
    assert len(_samples(batch, "argus_hw")) == job.hw.num_rows
    assert [v for _, _, v in _samples(batch, "argus_window_end_step")] == [4.0] * 8
