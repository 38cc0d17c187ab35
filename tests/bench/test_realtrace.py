"""Faults injected into the real DDP trace: consistent timing, then found (or not) by diagnosis."""

import gzip
import json

import numpy as np

from argus.bench.realtrace import RealTraceJob, load_real_steps, run_real_trace, write_job


def _collectives(path):
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "allreduce" in e["name"].lower()]
    return sorted(ev, key=lambda e: e["ts"])


def test_a_slow_rank_arrives_late_and_its_peers_wait(tmp_path):
    real, _ = load_real_steps()
    assert len(real) == 3 and all(len(s.gpu) > 800 for s in real)  # the real kernel mix
    write_job(RealTraceJob(ranks=4, steps=6, culprit=2, factor=2.0, onset=3), tmp_path)
    ranks = [_collectives(tmp_path / f"rank-{r}.json.gz") for r in range(4)]
    assert len({len(c) for c in ranks}) == 1
    ends = np.array([[e["ts"] + e["dur"] for e in c] for c in ranks])
    assert np.allclose(ends, ends[0], atol=1e-6)  # every collective ends together on all ranks
    durs = np.array([[e["dur"] for e in c] for c in ranks])
    per_step = durs.shape[1] // 6
    late = slice(3 * per_step, None)
    peers = [0, 1, 3]
    # from the onset the culprit is the last to arrive at the gradient all-reduces: its are the
    # shortest, its peers wait for it
    assert (durs[2, late] <= durs[peers][:, late].min(0) + 1e-6).all()
    assert durs[peers][:, late].sum() > 1.5 * durs[peers][:, :3 * per_step].sum()


def test_the_healthy_job_raises_nothing_and_the_straggler_is_named():
    _, healthy = run_real_trace(RealTraceJob(ranks=4, steps=10))
    assert not healthy.false_incident
    truth, slow = run_real_trace(RealTraceJob(ranks=4, steps=10, culprit=1, factor=2.0))
    assert truth["cost_pct"] > 5
    assert slow.predicted == ["compute_straggler:1"] and slow.precision == slow.recall == 1.0


def _comm_by_name(path):
    doc = json.loads(gzip.decompress(path.read_bytes()))
    out: dict[str, list] = {}
    for e in sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()),
                    key=lambda e: e["ts"]):
        out.setdefault(e["name"], []).append(e)
    return out


def test_on_the_real_8_rank_job_each_collective_ends_together_and_a_slow_host_waits_for_nobody(tmp_path):
    truth = write_job(RealTraceJob(ranks=8, steps=6, culprit=2, factor=4.0, kind="host", base="dlrm", onset=2),
                      tmp_path)
    assert truth["faults"][0]["culprit_ranks"] == [2, 3]
    ranks = [_comm_by_name(tmp_path / f"rank-{r}.json.gz") for r in range(8)]
    names = set(ranks[0])
    assert len(names) == 2 and all(set(r) == names for r in ranks)  # NCCL all-reduce and all-to-all kernels
    for name in names:
        ends = np.array([[e["ts"] + e["dur"] for e in r[name]] for r in ranks])
        assert np.allclose(ends, ends[0], atol=1e-6)  # the j-th launch of a collective ends together on all ranks
        durs = np.array([[e["dur"] for e in r[name]] for r in ranks])
        late = slice(durs.shape[1] // 3, None)  # from the onset (step 2 of 6)
        # the slow host's ranks arrive last: their collectives are the short ones
        assert durs[[2, 3]][:, late].sum() / 2 < 0.7 * durs[[0, 1, 4, 5, 6, 7]][:, late].sum() / 6


def test_a_slow_host_on_the_real_8_rank_job_is_one_compute_incident_and_no_link():
    truth, s = run_real_trace(RealTraceJob(ranks=8, culprit=2, factor=6.0, kind="host", base="dlrm"))
    assert truth["cost_pct"] > 5
    assert s.predicted == ["compute_straggler:2"] and s.precision == s.recall == 1.0


def test_a_recurring_host_stall_on_the_real_ddp_job_is_named_with_its_measured_cost():
    """The replay of host-timed GPU annotations cannot move the stall (launches are asynchronous):
    it may not lower what L1 measured, and the stall is a warning, not an observation."""
    truth, s = run_real_trace(RealTraceJob(ranks=8, culprit=5, kind="stall", stall_ms=60.0))
    assert truth["cost_pct"] > 5 and truth["faults"][0]["steps"] == [4, 7, 10]
    assert s.predicted == ["host_stall:1"] and s.precision == s.recall == 1.0


def test_a_stall_on_the_real_dlrm_rank_whose_forward_differs_from_its_peers_all_along_is_named():
    """Real rank 1's forward is 10 ms against its peers' 3–9 ms: its 10 ms pauses (half a step,
    every third step) are measured against its own usual forward, not lost among the peers'."""
    truth, s = run_real_trace(RealTraceJob(ranks=4, culprit=1, kind="stall", stall_ms=10.0, base="dlrm"))
    assert truth["cost_pct"] > 5 and truth["faults"][0]["steps"] == [4, 7, 10]
    assert s.predicted == ["host_stall:1"] and s.precision == s.recall == 1.0
