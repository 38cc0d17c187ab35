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


def _with_pair_findings(diagnosed, steps: list[int]):
    """A healthy simulated pp=2 × dp=2 job (one rank a host) whose second pipeline line is
    found ≥ 4× slower than the first (``links.PP_PAIR_FLOOR``) in ``steps``: the incidents
    root cause builds from it."""
    from dataclasses import replace

    from argus.analysis.links import LinkFinding
    from argus.analysis.rootcause import build_incidents
    from argus.topology import GroupKind

    attempt, _, d = diagnosed("healthy", ranks=4, steps=20, layout="pp=2,dp=2", gpus_per_host=1,
                              checkpoint_every=0)
    topology = attempt.topology()
    ranks = sorted(int(r) for r in attempt.layout.groups(GroupKind.PP)[1])
    hosts = sorted({str(topology.hosts[r]) for r in ranks})
    windows = []
    for w in d.windows:
        found = [LinkFinding("pp-send/recv", GroupKind.PP, s, ranks, hosts, 9.0, 8e6, per_step=2.0, pair_only=True)
                 for s in steps if w.lo <= s <= w.hi]
        windows.append(replace(w, l2=replace(w.l2, links=list(w.l2.links) + found)))
    step_time = {int(s): float(t) for s, t in zip(d.l1.steps, d.l1.step_time_s)}
    return ranks, build_incidents(attempt, topology, d.l1, windows, d.hw, step_time)


def test_two_pipeline_lines_apart_in_a_few_steps_are_scheduling_not_a_link(diagnosed):
    """On a shared CPU host one pipeline line's receives ran 4–22× the other's in 3 of 12
    steps of a healthy job (CI: a confirmed link incident, cordon_node). Two lines give no
    spread to judge by; only persistence tells a link from the scheduler."""
    _, incidents = _with_pair_findings(diagnosed, [5, 6, 11, 15])
    assert [i for i in incidents if i.klass == "link_degradation"] == []


def test_two_pipeline_lines_apart_step_after_step_are_a_slow_link(diagnosed):
    """… while a throttled link makes it every step (the netns repro: 60 of 60)."""
    ranks, incidents = _with_pair_findings(diagnosed, list(range(4, 20)))
    (link,) = [i for i in incidents if i.klass == "link_degradation"]
    assert link.culprit_ranks == ranks


def test_a_link_the_hardware_reports_down_that_every_group_crosses_is_a_warning_with_its_cost_unmeasured(diagnosed):
    """tp=4 × dp=6 on three hosts: every data-parallel group crosses all three, so two hosts'
    PCIe links trained down (Gen3 x4) slow every group alike and no comparison can stand.
    The hardware names the hosts; the cost is stated as not measurable (no clean step before
    the fault), never inferred and never zero — a warning to verify, not a confirmed cordon
    (was: no incident at all, the job 10% slower)."""
    _, truth, d = diagnosed("link_degradation", ranks=24, layout="tp=4,dp=6", params={"factor": 3.0, "hosts": "0,1"})
    fault = truth["faults"][0]
    claims = [i for i in d.incidents if i.severity != "info"]
    assert [i.klass for i in claims] == ["link_degradation"], [i.summary for i in d.incidents]
    inc = claims[0]
    assert inc.hosts == fault["culprit_hosts"] and inc.culprit_ranks == fault["culprit_ranks"]
    assert inc.slowdown_pct is None and inc.gpu_hours_lost is None
    assert (inc.severity, inc.state, inc.action) == ("warning", "suspected", "verify")
    assert any(e.get("kind") == "pcie_degraded" for e in inc.evidence)
    assert inc.to_json()["impact"]["slowdown_pct"] is None


def test_a_link_trained_down_mid_run_is_measured_against_the_steps_before(diagnosed):
    """The same link going down at step 8: the steps before it are clean, so the cost is
    measured (the job's own step time before and after), not stated unknown."""
    _, truth, d = diagnosed("link_degradation", ranks=24, layout="tp=4,dp=6",
                            params={"factor": 3.0, "hosts": "0,1", "start_step": 8})
    claims = [i for i in d.incidents if i.severity != "info"]
    assert [i.klass for i in claims] == ["link_degradation"], [i.summary for i in d.incidents]
    assert claims[0].slowdown_pct is not None and claims[0].slowdown_pct >= 5.0
    assert claims[0].start_step >= 8
    assert truth["faults"][0]["impact"]["slowdown_pct"] >= 5.0


def test_a_slow_group_seen_by_the_phases_alone_is_suspected_until_a_second_channel_agrees(diagnosed):
    """One data-parallel group ×3 from step 5: found every step by the host-timed phases. With
    its device-timed communicator kernels (L3) agreeing it is confirmed — and still verified
    before a cordon: two timing channels are not the hardware's own word; without kernel
    summaries and without a hardware signal it is one channel — suspected, verify, no cordon."""
    for summaries, state, action in ((True, "confirmed", "verify"), (False, "suspected", "verify")):
        _, truth, d = diagnosed("group_link_degradation", summaries=summaries)
        (inc,) = [i for i in d.incidents if i.severity != "info"]
        assert inc.klass == "link_degradation" and inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]
        assert (inc.state, inc.action) == (state, action)


def test_a_link_held_back_behind_a_culprit_the_replay_dismisses_is_put_back(diagnosed):
    """Culprit over victim is decided before L4: a rank of the slow pipeline line computing
    1.5× its peer takes the line's slow transfers as its victims' waits, and no link incident
    is made. If the replay then finds its removal gains nothing (graded info), the link must
    come back — else a throttled link's cost has no incident at all (CI: a 20 Mbit/s host
    link, 0 incidents)."""
    from dataclasses import replace

    from argus.analysis.l2_stragglers import Finding
    from argus.analysis.links import LinkFinding
    from argus.analysis.rootcause import build_incidents, reinstate_victims
    from argus.topology import GroupKind

    attempt, _, d = diagnosed("healthy", ranks=4, steps=20, layout="pp=2,dp=2", gpus_per_host=1,
                              checkpoint_every=0)
    topology = attempt.topology()
    ranks = sorted(int(r) for r in attempt.layout.groups(GroupKind.PP)[1])
    hosts = sorted({str(topology.hosts[r]) for r in ranks})
    windows = []
    for w in d.windows:
        steps = [s for s in range(max(w.lo, 4), w.hi + 1)]
        links = [LinkFinding("pp-send/recv", GroupKind.PP, s, ranks, hosts, 9.0, 8e6, per_step=2.0, pair_only=True)
                 for s in steps]
        busy = Finding("busy", ranks[1], "forward-compute", "compute", -1, steps, 1.5, 10.0, 0.05, "dp", True,
                       [0.05] * len(steps))
        windows.append(replace(w, l3=None, l2=replace(w.l2, links=list(w.l2.links) + links,
                                                       findings=list(w.l2.findings) + ([busy] if steps else []))))
    step_time = {int(s): float(t) for s, t in zip(d.l1.steps, d.l1.step_time_s)}
    incidents = build_incidents(attempt, topology, d.l1, windows, d.hw, step_time)
    (culprit,) = [i for i in incidents if i.klass in ("compute_straggler", "pipeline_imbalance")]
    assert culprit.culprit_ranks == [ranks[1]] and culprit.severity != "info"
    assert not [i for i in incidents if i.klass == "link_degradation"]
    assert reinstate_victims(incidents) == incidents  # the culprit still explains the waits

    culprit.severity = "info"  # what L4 does when the replay without its excess gains nothing
    (link,) = [i for i in reinstate_victims(incidents) if i.klass == "link_degradation"]
    assert link.culprit_ranks == ranks
    assert any(e["kind"] == "culprit_dismissed" for e in link.evidence)
    assert not any(e["kind"] == "victim_transfers" for e in culprit.evidence) and not culprit.victims


def test_of_a_pipeline_pairs_two_hosts_the_one_slow_in_another_group_is_the_link():
    """Host 4 throttled: its sends to host 1 and its reduction with hosts 3 and 5 slow, host 1's
    reduction with hosts 0 and 2 normal — host 4; a link slow between exactly two hosts keeps both."""
    from types import SimpleNamespace

    from argus.analysis.rootcause.links import _alone

    pair = SimpleNamespace(hosts=["h1", "h4"])
    by_step = {13: [pair], 14: [pair], 15: [pair, SimpleNamespace(hosts=["h3", "h4", "h5"])]}
    assert _alone(["h1", "h4"], by_step, []) == ["h4"]
    assert _alone(["h1", "h4"], {13: [pair], 14: [pair]}, []) == ["h1", "h4"]
    assert _alone(["h1", "h4"], {13: [pair]}, [SimpleNamespace(hosts=["h0", "h1", "h2"])]) == ["h1"]
