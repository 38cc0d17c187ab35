"""Link evidence on simulated stores: pipeline transfers, group-confined faults, the real-job null."""

import numpy as np

from argus.analysis.collectives import p2p_transfers
from argus.analysis.frames import load_phases


def test_pipeline_transfers_align_stage_hosts_from_their_own_traffic(diagnosed):
    """Stages share no collective, so only their send/receive traffic aligns their hosts'
    clocks. With ±25 ms skews a receive's end minus its sender's post, read on raw clocks,
    is off by tens of ms (or below zero); aligned, every transfer is the wire's ~0.5 ms."""
    attempt, truth, _ = diagnosed("healthy", ranks=32, clock_skew_ms=25.0, layout="tp=2,dp=4,pp=4")
    f = load_phases(attempt, 6, 9)
    p = p2p_transfers(f, attempt.layout, attempt.topology().hosts)
    assert p is not None and set(np.unique(p.step)) == {6, 7, 8, 9}
    assert len(np.unique(p.rank)) == 32  # every stage receives (activations or gradients)
    assert p.min_ns.min() > 0.2e6 and p.min_ns.max() < 1.5e6, np.quantile(p.min_ns, [0, 0.5, 1])


def test_a_slow_data_parallel_group_names_that_group_not_its_hosts_or_stage(diagnosed):
    _, truth, d = diagnosed("group_link_degradation", ranks=64, layout="tp=4,dp=16", params={"factor": 3.0})
    fault = truth["faults"][0]
    claims = [i for i in d.incidents if i.severity != "info"]
    assert [i.klass for i in claims] == ["link_degradation"]
    assert claims[0].culprit_ranks == fault["culprit_ranks"] and len(fault["culprit_ranks"]) == 16
    assert "dp group of ranks" in claims[0].summary
