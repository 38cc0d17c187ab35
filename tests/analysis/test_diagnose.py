"""Golden scenarios: a simulated store, `diagnose`, and the expected incidents."""

import json
import subprocess
import sys

import pytest

from argus.analysis import CLASSES
from argus.sim import SCENARIOS

FAULTY = [s for s in SCENARIOS if s != "healthy"]


def _claims(d):
    return [i for i in d.incidents if i.severity != "info"]


@pytest.mark.parametrize("scenario", FAULTY)
def test_each_fault_is_found_with_its_class_and_exact_culprits(diagnosed, scenario):
    _, truth, d = diagnosed(scenario)
    fault = truth["faults"][0]
    claims = _claims(d)
    assert len(claims) == 1, [i.to_json()["summary"] for i in claims]
    inc = claims[0]
    assert inc.klass == fault["class"]
    assert inc.culprit_ranks == fault["culprit_ranks"]
    assert set(inc.hosts) == set(fault["culprit_hosts"])
    assert inc.start_step <= max(fault["steps"]) and inc.end_step >= min(fault["steps"])
    assert inc.state == "confirmed"


@pytest.mark.parametrize("seed", [0, 1])
def test_a_healthy_job_with_moe_imbalance_and_checkpoints_raises_nothing_above_info(diagnosed, seed):
    _, truth, d = diagnosed("healthy", seed=seed)
    assert truth["natural"]["checkpoint_steps"] and truth["natural"]["moe_routing_imbalance"]
    assert _claims(d) == []
    assert d.l1.checkpoint_steps == truth["natural"]["checkpoint_steps"]
    assert d.l1.warmup_steps == truth["natural"]["warmup_steps"]


def test_the_masked_straggler_is_compute_not_the_network(diagnosed):
    _, truth, d = diagnosed("masked_compute_straggler")
    (inc,) = _claims(d)
    assert inc.klass == "compute_straggler" and inc.phase == "mlp"
    assert not any(i.klass == "link_degradation" for i in d.incidents)
    kinds = {e["kind"] for e in inc.evidence}
    assert {"busy_outlier", "w1_outlier", "nic_port_down"} <= kinds  # the NIC alarm is shown, and overruled


def test_a_slow_host_is_named_whole_when_one_of_its_ranks_stood_out_first(diagnosed):
    """pp=8 × dp=16, one host's 8 ranks (half a stage) compute 2× slower behind a NIC alarm,
    with heavy MoE-free noise: one of the 8 stood out against a peer set half made of its
    slow host-mates and was named alone (recall 1/8). Judged against the same ranks' peers on
    other hosts, the host is slow as a whole: one incident, all 8 ranks, in place of the one."""
    _, truth, d = diagnosed("masked_compute_straggler", seed=62010, ranks=128, layout="tp=1,pp=8,dp=16",
                            params={"factor": 2.0}, moe_alpha=5.0, seqlen_sigma=0.02, jitter=0.01,
                            dataloader_spike_prob=0.03, megatron_groups=True)
    (inc,) = _claims(d)
    assert inc.klass == "compute_straggler" and inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]
    assert not any(i.klass == "link_degradation" and i.severity != "info" for i in d.incidents)


def test_a_slow_host_holding_a_whole_stage_is_compute_not_the_nic_alarm(diagnosed):
    """tp=2 × pp=4 × dp=4 on four hosts: each host holds one whole stage, so its ranks have no
    peer elsewhere to be compared with. Case 5 there (mlp ×5.7 behind a NIC alarm) was a
    critical link incident from one alarmed step; judged against their own kernel time before
    the slowdown, the host's ranks compute slowly — the alarm is overruled."""
    _, truth, d = diagnosed("masked_compute_straggler", ranks=32, layout="tp=2,pp=4,dp=4")
    fault = truth["faults"][0]
    (inc,) = _claims(d)
    assert inc.klass == "compute_straggler" and inc.culprit_ranks == fault["culprit_ranks"]
    assert inc.hosts == fault["culprit_hosts"] and "their own before the slowdown" in inc.summary
    assert not any(i.klass == "link_degradation" for i in d.incidents)


def test_a_stall_of_a_third_of_a_step_twice_is_a_recurring_stall(diagnosed):
    """300 ms compiles in 0.5 s steps at steps 2, 4 and 6; the first hides in the warm-up, so
    two remain, each below the one-off bar (half a step) and short of three recurrences: no
    incident at all while the job lost a third of those steps. Twice at a third of a step
    each is no shared host's noise."""
    _, truth, d = diagnosed("jit_stall", seed=62015, ranks=24, layout="tp=1,pp=1,ep=2,dp=12",
                            params={"stall_ms": 300.0}, moe_alpha=15.0, seqlen_sigma=0.02, jitter=0.04,
                            dataloader_spike_prob=0.03, megatron_groups=True)
    (inc,) = _claims(d)
    assert inc.klass == "host_stall" and inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]
    assert set(inc.steps) <= set(truth["faults"][0]["steps"]) and len(inc.steps) == 2


def test_a_third_of_a_step_is_measured_against_a_healthy_step_not_the_stalled_one(diagnosed):
    """The same 300 ms compiles in 0.62 s steps (an interleaved tp=4, pp=4 job): each read
    0.326 of its own stalled step, short of a third, and nothing was reported (held-out
    seed 66009). Against the job's healthy level each is 0.48 of a step."""
    _, truth, d = diagnosed("jit_stall", seed=66009, ranks=96, layout="tp=4,pp=4,ep=1,dp=6",
                            params={"stall_ms": 300.0}, moe_alpha=15.0, seqlen_sigma=0.02, jitter=0.01,
                            dataloader_spike_prob=0.01, megatron_groups=True, virtual_stages=2)
    (inc,) = _claims(d)
    assert inc.klass == "host_stall" and inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]
    assert len(inc.steps) == 2


def test_pauses_filling_three_steps_of_a_window_recur_step_by_step(diagnosed):
    """Nine 90–210 ms GC pauses on one rank of an interleaved tp=2, cp=2, pp=4 job (0.75 s
    steps; held-out seed 69016, which cost 9%). Two windows hold three pauses each, so L2 calls
    their findings persistent — and persistent findings did not count as recurrences: only the
    three pauses above a fifth of a step were the incident. The replay, which left the
    interleaved schedule's wrap-around transfers unpaired, then found nothing gained without
    them: +0.5%, info. A finding that misses steps of its window recurs step by step."""
    _, truth, d = diagnosed("gc_pause", seed=69016, ranks=64, layout="tp=2,cp=2,pp=4,ep=2,dp=2",
                            params={"pause_ms": 150.0}, moe_alpha=5.0, seqlen_sigma=0.08, jitter=0.04,
                            dataloader_spike_prob=0.03, virtual_stages=2)
    fault = truth["faults"][0]
    (inc,) = _claims(d)
    assert inc.klass == "host_stall" and inc.culprit_ranks == fault["culprit_ranks"]
    normal = [s for s in fault["steps"] if s not in d.l1.checkpoint_steps]
    assert inc.steps == normal and len(normal) == 8
    assert inc.slowdown_pct >= 5.0


def test_a_gpu_that_heats_up_in_a_peer_pair_is_named_by_when_it_slowed(diagnosed):
    """tp=8 × dp=2 on two hosts: every rank's peer set is itself and one other, so no per-rank
    test tells the slow one from the fast. One GPU fell to ×1.25 by the end (the job 17% slower
    at the end, 5.8% over the run) and the diagnosis was "every rank matches its peers'"
    (held-out 69122). Its kernel time rose against its peer's when the job slowed."""
    _, truth, d = diagnosed("thermal_throttle", seed=69122, ranks=16, layout="tp=8,pp=1,ep=1,dp=2",
                            params={"factor": 1.25}, moe_alpha=100.0, seqlen_sigma=0.02, jitter=0.02,
                            dataloader_spike_prob=0.01)
    (inc,) = _claims(d)
    assert inc.klass == "compute_straggler" and inc.culprit_ranks == truth["faults"][0]["culprit_ranks"] == [8]
    assert inc.state == "suspected" and "its only peer's (rank 0)" in inc.summary


def test_groups_that_wait_for_a_slow_host_are_its_victims_not_a_link_elsewhere(diagnosed):
    """tp=1 × pp=4 × ep=2 × dp=3, interleaved, on three hosts: one host's mlp ×2 behind a NIC
    alarm (held-out 69222). Named — and the data-parallel groups its ranks share with the next
    host were a confirmed link on that next host, with cordon_node: a healthy host."""
    _, truth, d = diagnosed("masked_compute_straggler", seed=69222, ranks=24, layout="tp=1,pp=4,ep=2,dp=3",
                            params={"factor": 2.0}, moe_alpha=5.0, seqlen_sigma=0.08, jitter=0.01,
                            dataloader_spike_prob=0.03, megatron_groups=True, virtual_stages=2)
    (inc,) = _claims(d)
    assert inc.klass == "compute_straggler" and inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]
    assert not any(i.klass == "link_degradation" for i in d.incidents)
    assert any(e["kind"] == "victim_transfers" for e in inc.evidence)


def test_a_slowdown_only_in_the_jobs_last_short_window_is_not_claimed(tmp_path):
    """A real 4-rank DDP CPU job of the e2e suite (GC pauses on rank 1 from step 3; 12 steps in
    windows of 5, so the last holds steps 10–11), recorded by CI: rank 0, 1.43× in its backward in
    those two steps alone (four ranks over two vCPUs), read "persistent" there (2 of 2) and was a
    compute straggler next to the right GC stall. Two steps are too thin to call a slow device."""
    import shutil
    from pathlib import Path

    from argus.analysis import DiagnoseConfig, diagnose
    from argus.store import Store

    shutil.copytree(Path(__file__).parents[1] / "data" / "stores" / "cpu-tail-noise", tmp_path / "s")
    d = diagnose(Store.open(tmp_path / "s").attempt(), DiagnoseConfig(store_incidents=False))
    assert [(i.klass, i.culprit_ranks) for i in _claims(d)] == [("host_stall", [1])]


def test_a_slow_backward_is_pipeline_imbalance_with_its_stage(diagnosed):
    _, truth, d = diagnosed("pipeline_bubble")
    (inc,) = _claims(d)
    assert inc.klass == "pipeline_imbalance" and inc.phase == "backward-compute"
    assert inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]


def test_host_stalls_name_their_cause_from_the_stacks(diagnosed):
    for scenario, cause in (("jit_stall", "jit_compile"), ("gc_pause", "garbage_collection")):
        _, truth, d = diagnosed(scenario)
        (inc,) = _claims(d)
        stacks = [e for e in inc.evidence if e["kind"] == "stacks"]
        assert stacks and stacks[0]["cause"] == cause
        assert set(inc.steps) <= set(truth["faults"][0]["steps"])


@pytest.mark.parametrize("pause_ms, severity", [(1000.0, "info"), (4000.0, "warning")])
def test_a_one_off_pause_is_graded_by_what_it_cost_the_run(diagnosed, pause_ms, severity):
    """One GC pause that nearly doubles its step costs an 80-step job ~1% (an observation); one
    of several steps' length costs it ~4% (worth a warning), whatever it did to its own step."""
    _, truth, d = diagnosed("gc_pause", seed=3, ranks=8, steps=80,
                            params={"pause_ms": pause_ms, "probability": 0.0})
    fault = truth["faults"][0]
    (inc,) = [i for i in d.incidents if i.klass == "host_stall"]
    assert inc.steps == fault["steps"] and inc.culprit_ranks == fault["culprit_ranks"]
    run_s = sum(truth["step_time_s"])
    expected = 100 * fault["impact"]["extra_s"] / (run_s - fault["impact"]["extra_s"])
    assert inc.slowdown_pct == pytest.approx(expected, rel=0.35)
    assert inc.severity == severity


def test_a_link_slow_from_the_first_step_is_charged_its_costliest_collective(diagnosed):
    """Two hosts' PCIe links downtrained from step 0 slow 64 expert all-to-alls a step: with no
    healthy level to compare with, the loss is at least the costliest shifted floor × its
    launches per step — not the one pipeline transfer per step a per-step test sees."""
    _, truth, d = diagnosed("link_degradation", seed=40010, ranks=64, layout="tp=2,pp=2,ep=8,dp=2",
                            moe_alpha=100.0, seqlen_sigma=0.08, jitter=0.01, dataloader_spike_prob=0.01,
                            params={"factor": 2.0})
    fault = truth["faults"][0]
    assert fault["steps"][0] == 0
    (inc,) = _claims(d)
    assert inc.klass == "link_degradation" and set(inc.hosts) == set(fault["culprit_hosts"])
    assert set(inc.culprit_ranks) <= set(fault["culprit_ranks"])
    assert inc.slowdown_pct == pytest.approx(fault["impact"]["slowdown_pct"], rel=0.4)


def test_a_link_flap_is_found_in_the_flapping_steps(diagnosed):
    _, truth, d = diagnosed("link_flap")
    (inc,) = _claims(d)
    assert inc.steps == [s for s in truth["faults"][0]["steps"]]
    assert any(e["kind"] == "nic_port_down" for e in inc.evidence)


def test_a_hang_names_the_rank_that_never_joined(diagnosed):
    _, truth, d = diagnosed("hang")
    (inc,) = _claims(d)
    assert inc.severity == "critical" and inc.action == "checkpoint_and_restart"
    assert inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]


def test_incidents_document_matches_the_contract_and_is_stored(diagnosed):
    attempt, truth, d = diagnosed("compute_straggler")
    doc = json.loads(json.dumps(d.document()))
    assert {"run_id", "attempt_id", "ranks", "incidents"} <= set(doc)
    inc = doc["incidents"][0]
    for key in ("id", "class", "state", "severity", "culprit_ranks", "hosts", "window", "phase", "kernels",
                "impact", "action", "evidence"):
        assert key in inc
    assert inc["class"] in CLASSES and set(inc["window"]) == {"start_step", "end_step"}
    assert set(inc["impact"]) == {"slowdown_pct", "gpu_hours_lost"} and inc["impact"]["slowdown_pct"] > 20
    assert {e["level"] for e in inc["evidence"]} >= {"L1", "L2", "L3"}
    matrix = [e for e in inc["evidence"] if e["kind"] == "w1_matrix"][0]  # for display: culprits vs peers
    n = len(matrix["ranks"])
    assert set(matrix["culprits"]) <= set(inc["culprit_ranks"]) and len(matrix["w1_ms"]) == n
    c = matrix["ranks"].index(matrix["culprits"][0])
    peers = [i for i, r in enumerate(matrix["ranks"]) if r not in matrix["culprits"]]
    assert min(matrix["w1_ms"][c][p] for p in peers) > 5 * max(matrix["w1_ms"][peers[0]][p] for p in peers)
    stored = attempt.read("incidents").to_pylist()
    assert stored and stored[-1]["class"] == "compute_straggler" and stored[-1]["culprit_ranks"] == inc["culprit_ranks"]


def test_diagnose_cli_prints_json_and_a_readable_table(diagnosed):
    attempt, truth, _ = diagnosed("compute_straggler")
    store = attempt.path.parents[2]
    out = subprocess.run([sys.executable, "-m", "argus", "diagnose", str(store), "--json", "--no-store"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["incidents"][0]["culprit_ranks"] == truth["faults"][0]["culprit_ranks"]
    human = subprocess.run([sys.executable, "-m", "argus", "diagnose", str(store), "--no-store"],
                           capture_output=True, text=True, timeout=300)
    assert "compute_straggler" in human.stdout and "self_attention" in human.stdout


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_evidence_record_keeps_the_contract_its_readers_rely_on(diagnosed, scenario):
    from argus.analysis.evidence import check_evidence

    _, _, d = diagnosed(scenario)
    for inc in d.incidents:
        assert check_evidence(inc.evidence) == [], (inc.klass, inc.evidence)


def test_what_a_rank_did_before_its_first_step_is_not_step_0s(tmp_path):
    """Step 0 begins with the first forward; the garbage collections of start-up (imports,
    building the model) come before it but are recorded as step 0. CI's healthy 4-rank pipeline
    job: ~1 s of them a rank, one rank's 76 ms more than its peer's, read as a "host stall in gc"
    that nearly doubled a 0.15 s step (warning, confirmed). Here one rank's start-up took a whole
    step longer than everyone else's, and step 0 runs no warm-up to hide it in."""
    import pyarrow as pa

    from argus.analysis import DiagnoseConfig, diagnose
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    simulate_to_store(SimConfig(ranks=8, steps=12, seed=5, warmup_steps=0), "healthy", tmp_path / "s")
    attempt = Store.open(tmp_path / "s").attempt()
    first = {r["rank"]: (r["start_ns"], r["end_ns"] - r["start_ns"])
             for r in attempt.sql("SELECT rank, start_ns, end_ns FROM steps WHERE step = 0").to_pylist()}
    rows: dict[str, list] = {k: [] for k in ("rank", "step", "microbatch", "name", "category", "group_kind",
                                              "start_ns", "dur_ns", "wait_ns")}
    for rank, (start, step_ns) in first.items():
        pauses = 40 + 20 * (rank == 3)  # rank 3: ~1.5 steps more collecting than the others
        dur = int(0.075 * step_ns)
        for k in range(pauses):  # back to back, the last ending 1 ms before the first forward
            end = start - 1_000_000 - k * dur
            for col, v in zip(rows, (rank, 0, -1, "gc", "host", "", end - dur, dur, -1)):
                rows[col].append(v)
    attempt.writer("startup").write("phases", pa.table(rows), 0)
    assert attempt.sql("SELECT count(*) FROM phases WHERE name = 'gc' AND step = 0 AND rank = 3").column(0)[0].as_py() == 60
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert not _claims(d)
    assert not any(i.klass == "host_stall" for i in d.incidents)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_window_against_one_peer_is_shown_not_claimed(diagnosed, seed):
    """Two ranks, phases only (CPU: no device kernels to corroborate). A rank 1.5× its one
    peer for three steps of one window is what a shared VM's CPU does now and then (CI: a
    healthy 2-rank compiled job got a warning straggler on rank 0): info, watched, never a
    cordon. The same excess over the rest of the run is seen window after window: a claim."""
    cfg = dict(ranks=2, layout="tp=1,pp=1,dp=2", summaries=False)
    _, truth, d = diagnosed("compute_straggler", seed=seed, params={"factor": 1.5, "start_step": 6, "end_step": 8},
                            **cfg)
    culprit = truth["faults"][0]["culprit_ranks"]
    (inc,) = [i for i in d.incidents if i.klass == "compute_straggler"]
    assert inc.culprit_ranks == culprit and inc.severity == "info" and inc.action == "observe"
    assert inc.state == "suspected" and "a single peer" in inc.summary
    assert _claims(d) == []
    _, truth, d = diagnosed("compute_straggler", seed=seed, params={"factor": 1.5, "start_step": 6, "end_step": 19},
                            **cfg)
    (inc,) = _claims(d)
    assert inc.klass == "compute_straggler" and inc.culprit_ranks == truth["faults"][0]["culprit_ranks"]
    assert inc.severity == "warning" and inc.state == "confirmed"


def test_pauses_in_a_window_whose_kernels_could_not_be_measured_are_the_hosts(diagnosed):
    """dp=16, 150 ms GC pauses on one rank in steps 2, 3, 4, 9, 16, 17, 18 (held-out 70007). Steps
    2–4 share a window with the warm-up, where L3 cannot judge kernels: the long work there read
    as a persistent compute straggler, and hid the same rank's recurring stall. Its kernels are
    normal wherever they were measured: one host stall, all seven steps."""
    _, truth, d = diagnosed("gc_pause", seed=70007, ranks=16, layout="tp=1,pp=1,ep=1,dp=16",
                            params={"pause_ms": 150.0}, moe_alpha=15.0, seqlen_sigma=0.08, jitter=0.01,
                            dataloader_spike_prob=0.03, megatron_groups=True)
    (inc,) = _claims(d)
    fault = truth["faults"][0]
    assert inc.klass == "host_stall" and inc.culprit_ranks == fault["culprit_ranks"]
    assert set(inc.steps) == set(fault["steps"]) and "garbage collection" in inc.summary


def test_a_rank_frozen_after_its_last_collective_keeps_the_stall_the_processor_watched(tmp_path):
    """CI's stall-rank drill (a real 4-rank gloo job under ``argus drill``; the store is kept in
    tests/data): rank 1 SIGSTOPped for 15 s inside its optimizer, after the step's last all-reduce,
    so its peers waited in the *next* step's. A replay of step 12 alone gave back 0.007 s and
    graded the freeze the processor had watched as info."""
    import shutil
    from pathlib import Path

    from argus.analysis import DiagnoseConfig, diagnose
    from argus.store import Store

    shutil.copytree(Path(__file__).parents[1] / "data" / "stores" / "frozen-in-optimizer", tmp_path / "s")
    d = diagnose(Store.open(tmp_path / "s").attempt(), DiagnoseConfig(store_incidents=False))
    (inc,) = _claims(d)
    assert (inc.klass, inc.culprit_ranks, inc.severity) == ("host_stall", [1], "critical")
    assert "its process was stopped" in inc.summary
    # the attribution replays the step that holds the wait (the next one: the freeze is time
    # between rank 1's last collective and its next, a node of the graph) and gives back the
    # whole 15 s SIGSTOP — more than the 10 s the processor saw before it reported
    wi = next(e for e in inc.evidence if e["kind"] == "what_if")
    assert 14.0 <= wi["extra_s"] <= 16.0
    # one fault, one incident: the phases' view of the same freeze joined the processor's
    assert not [i for i in d.incidents if i.klass == "host_stall" and i is not inc and i.start_step <= 13
                and i.end_step >= 12]
