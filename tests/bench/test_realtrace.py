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
