"""The what-if attribution on per-op timelines of 1F1B pipeline jobs made here
(``tests/optrace/pipeline.py``: no microbatch labels, a schedule that shares no code with Argus),
each with the slowdown the generator knows — the job against its ideal (no slow device, no noise,
even inputs, the stages' work spread evenly)."""

from __future__ import annotations

import numpy as np
import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.optrace import import_ops, read_ops
from argus.store import Store
from tests.optrace.pipeline import Job, write

pytestmark = pytest.mark.xdist_group("attribution-timelines")

JOBS = {
    # one rank of a pp=4 × dp=4 job computes forward 2.5× and backward 2.2× slower from the first step
    "straggler": Job(slow={(2, 1): (2.5, 2.2)}),
    # the last stage of a pp=4 × dp=2 job holds 2.1× the others' layers
    "long_stage": Job(pp=4, dp=2, stage_factor={3: 2.1}),
    # pp=2 × dp=16, every microbatch's length drawn anew (the same on both stages of a line), in
    # more than one window (uneven inputs seen in one window only are shown, not claimed)
    "variance": Job(pp=2, dp=16, seq_sigma=0.3, steps=12),
    "healthy": Job(),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    cache = {}

    def get(name: str):
        if name not in cache:
            root = tmp_path_factory.mktemp(name)
            recorded, ideal = write(JOBS[name], root / "ops.parquet")
            import_ops(read_ops(root / "ops.parquet"), root / "s")
            attempt = Store.open(root / "s").attempt()
            cache[name] = (attempt, float(np.mean(recorded)) / float(np.mean(ideal)),
                           diagnose(attempt, DiagnoseConfig(store_incidents=False)))
        return cache[name]

    return get


def _claims(d):
    return [i for i in d.incidents if i.severity != "info"]


def test_the_replay_reproduces_every_timeline(jobs):
    for name in JOBS:
        _, _, d = jobs(name)
        assert d.attribution and all(o.modeled and o.attribution.error_pct < 1.0 for o in d.attribution), name


def test_a_persistent_straggler_is_named_alone_with_its_cost(jobs):
    """No healthy window to compare with (slow from the first step), no microbatch labels: the
    rank is named alone, and its impact is the ×1.8 the job loses to it (within 15%)."""
    attempt, s_true, d = jobs("straggler")
    (inc,) = _claims(d)
    culprit = int(attempt.layout.rank_of(dp=1, pp=2))
    assert inc.klass == "compute_straggler" and inc.culprit_ranks == [culprit]
    assert inc.severity == "critical"
    s_found = 1.0 + inc.slowdown_pct / 100.0
    assert abs(s_found - s_true) <= 0.15 * (s_true - 1.0), (s_found, s_true)
    kinds = {e["kind"] for e in inc.evidence}
    assert {"attribution", "what_if", "critical_path"} <= kinds
    crit = next(e for e in inc.evidence if e["kind"] == "critical_path")
    assert crit["by_rank"][0]["rank"] == culprit


def test_a_long_stage_is_named_as_the_stage_of_every_replica(jobs):
    attempt, s_true, d = jobs("long_stage")
    (inc,) = _claims(d)
    stage3 = sorted(int(r) for r in range(attempt.layout.world_size) if attempt.layout.stage_of(r) == 3)
    assert inc.klass == "pipeline_imbalance" and inc.phase == "stage 3" and inc.culprit_ranks == stage3
    assert inc.action == "observe" and "move layers" in inc.summary
    s_found = 1.0 + inc.slowdown_pct / 100.0
    assert abs(s_found - s_true) <= 0.15 * (s_true - 1.0), (s_found, s_true)


def test_variance_on_every_worker_names_no_culprit(jobs):
    _, s_true, d = jobs("variance")
    named = [i for i in d.incidents if i.culprit_ranks and i.klass != "pipeline_imbalance"]
    assert not named, [i.summary for i in named]
    (inc,) = [i for i in d.incidents if i.klass == "input_imbalance"]
    assert inc.culprit_ranks == [] and inc.action == "observe"
    ev = next(e for e in inc.evidence if e["kind"] == "attribution")
    assert ev["fluctuation_share"] >= 0.4 and ev["stage_correlation"] >= 0.3
    assert 1.0 + inc.slowdown_pct / 100.0 >= 1.0 + 0.6 * (s_true - 1.0)


def test_a_healthy_pipeline_is_silent(jobs):
    _, s_true, d = jobs("healthy")
    assert s_true < 1.02 and not d.incidents


def test_microbatch_labels_change_nothing(tmp_path):
    """The same straggler timeline imported with its microbatch ids: the same verdict and cost."""
    import pyarrow.parquet as pq

    write(JOBS["straggler"], tmp_path / "ops.parquet")
    t = pq.read_table(tmp_path / "ops.parquet").to_pydict()
    # give the compute ops their microbatch ids back (the generator's order within each step)
    counts: dict[tuple, int] = {}
    for i, op in enumerate(t["optype"]):
        if op.endswith("compute"):
            key = (t["step"][i], t["stage"][i], t["dp_rank"][i], op)
            t["mb_id"][i] = counts.get(key, 0)
            counts[key] = t["mb_id"][i] + 1
    pq.write_table(__import__("pyarrow").table(t), tmp_path / "labelled.parquet")
    import_ops(read_ops(tmp_path / "labelled.parquet"), tmp_path / "s")
    d = diagnose(Store.open(tmp_path / "s").attempt(), DiagnoseConfig(store_incidents=False))
    (inc,) = _claims(d)
    attempt = Store.open(tmp_path / "s").attempt()
    assert inc.klass == "compute_straggler" and inc.culprit_ranks == [int(attempt.layout.rank_of(dp=1, pp=2))]


@pytest.mark.parametrize("until, scale, severe", [(40, 10.0, True), (18, 10.0, False), (40, 1.0, False)],
                         ids=["lasting", "recovered", "seconds"])
def test_a_whole_job_slowdown_nothing_explains_is_said_so(tmp_path, until, scale, severe):
    """Every rank's compute ×1.5 from step 12 (the inputs, the cluster): no rank, stage or link is
    blamed; lasting (28 steps of ~4 s), it is an incident the job owner sees; over by itself after
    six steps, it is shown and not claimed; 28 steps of 0.4 s (a VM's vCPUs drift for seconds)
    too."""
    write(Job(pp=2, dp=4, steps=40, whole={s: 1.5 for s in range(12, until)}, time_scale=scale), tmp_path / "ops.parquet")
    import_ops(read_ops(tmp_path / "ops.parquet"), tmp_path / "s")
    d = diagnose(Store.open(tmp_path / "s").attempt(), DiagnoseConfig(store_incidents=False))
    (inc,) = d.incidents
    assert inc.klass == "job_slowdown" and inc.culprit_ranks == [] and inc.action == "observe"
    assert inc.start_step == 12 and 40 <= inc.slowdown_pct <= 55
    assert (inc.severity != "info") == severe
    ev = next(e for e in inc.evidence if e["kind"] == "attribution")
    assert ev["ruled_out"] and all(r["worker"] < 1.05 and r["stage"] < 1.05 for r in ev["ruled_out"])


def _straggler_model(jobs):
    """The straggler job's chains, step graph and durations over steps 2–5 (a replay's inputs)."""
    from argus.analysis.attribution import StepBounds, build_chains
    from argus.analysis.attribution.durations import durations
    from argus.analysis.attribution.graph import build_graphs
    from argus.analysis.frames import load_phases

    attempt, _, _ = jobs("straggler")
    layout, hosts = attempt.layout, attempt.topology().hosts
    st = attempt.read("steps", columns=["rank", "step", "start_ns", "end_ns"])
    bounds = StepBounds.of(*(st.column(c).to_numpy() for c in ("rank", "step", "start_ns", "end_ns")))
    ch = build_chains(load_phases(attempt, 2, 5), layout, hosts, bounds)
    g = build_graphs(ch, layout)[0]
    return ch, g, durations(ch, g, layout)


def test_the_replay_answers_each_scenario_as_if_it_ran_alone(jobs):
    """Scenarios are replayed in runs of the same durations (a slice of the last axis, not an
    index array): the answer to each is the same, in the order asked, as replayed on its own."""
    from argus.analysis.attribution.replay import Scenario, replay

    ch, g, d = _straggler_model(jobs)
    n = sum(s.columns for s in g.stages)
    one = np.zeros(n, bool)
    one[1] = True
    mixed = [Scenario("peer", "peer", "peer", tr_base="peer", tr_over="peer"), Scenario("a", "rec0", "peer", cols=one),
             Scenario("rec"), Scenario("b", "rec0", "peer", cols=~one), Scenario("ideal", "ideal", "ideal"),
             Scenario("c", "rec", "upeer", cols=one)]
    together = replay(g, d, mixed)
    alone = np.stack([replay(g, d, [s])[:, 0] for s in mixed], axis=1)
    assert np.array_equal(together, alone)
    assert not np.array_equal(together[:, 1], together[:, 3])  # the scenarios differ: the order matters


def test_scenarios_of_a_few_ranks_replay_as_those_of_every_rank_do(jobs, monkeypatch):
    """Scenarios that change a few columns have their gaps computed on those columns only: the
    step times are those of the full computation, bit for bit."""
    from argus.analysis.attribution import replay as replay_mod
    from argus.analysis.attribution.replay import Scenario, replay

    ch, g, d = _straggler_model(jobs)
    n = sum(s.columns for s in g.stages)
    J = len(ch.components)

    def cols(*idx):
        m = np.zeros(n, bool)
        m[list(idx)] = True
        return m

    untracked = np.zeros(J, bool)
    untracked[-1] = True
    scen = [Scenario("rec"), Scenario("r1", "rec0", "peer", cols=cols(1)), Scenario("r6", "peer", "rec0", cols=cols(6)),
            Scenario("pair", "rec0", "peer", cols=cols(1, 14)), Scenario("host", "rec", "upeer", cols=cols(3), comps=untracked),
            Scenario("most", "rec0", "peer", cols=~cols(2)), Scenario("ideal", "ideal", "ideal")]
    assert replay_mod._gap_key(scen[1], n)[2] and not replay_mod._gap_key(scen[5], n)[2]
    few = replay(g, d, scen)
    monkeypatch.setattr(replay_mod, "FEW_COLUMNS", 0.0)  # every scenario over every column
    assert np.array_equal(few, replay(g, d, scen))
    assert len({float(t) for t in few.mean(axis=0)}) > 3  # the scenarios differ


def test_a_stage_stretched_by_run_queue_delay_holds_no_more_work(jobs):
    """The long-stage timeline once more, its stage 3's extra compute time declared as run-queue
    delay inside the phases (``wait_ns``: the CPU its ranks share ran something else): the stages
    hold the same work, so balancing them gains nothing and no partition is blamed; the same
    frame without the delay measured names stage 3."""
    from argus.analysis.attribution import StepBounds, attribute_window
    from argus.analysis.frames import _busy, load_phases

    attempt, _, _ = jobs("long_stage")
    layout, hosts = attempt.layout, attempt.topology().hosts
    st = attempt.read("steps", columns=["rank", "step", "start_ns", "end_ns"])
    bounds = StepBounds.of(*(st.column(c).to_numpy() for c in ("rank", "step", "start_ns", "end_ns")))
    frame = load_phases(attempt, 2, 6)
    stretched = (layout.stage_of(frame.rank) == 3) & ~frame.is_comm
    frame.wait = np.where(stretched, (frame.dur * (1 - 1 / 2.1)).astype(np.int64), 0)
    frame.wait[frame.is_comm] = -1
    frame.busy = _busy(frame, frame.wait)
    out = attribute_window(frame, layout, hosts, bounds, 2, 6)
    assert out.modeled and not [f for f in out.findings if f.klass == "pipeline_imbalance"], out.findings
    factors = [f for s in out.attribution.balance.values() for b, f in s.items() if b in ("fwd", "bwd")]
    assert max(abs(f - 1.0) for f in factors) < 0.05, out.attribution.balance
    frame.wait[:] = -1
    frame.busy = _busy(frame, frame.wait)
    out = attribute_window(frame, layout, hosts, bounds, 2, 6)
    assert [f.label for f in out.findings if f.klass == "pipeline_imbalance"] == ["stage 3"]


def test_a_rank_stretched_by_run_queue_delay_is_no_straggler(jobs):
    """The straggler timeline, its slow rank's extra compute time declared as run-queue delay:
    its own work is its peers', so no rank stands out; undeclared, it is named."""
    from argus.analysis.attribution import StepBounds, attribute_window
    from argus.analysis.frames import _busy, load_phases

    attempt, _, _ = jobs("straggler")
    layout, hosts = attempt.layout, attempt.topology().hosts
    culprit = int(layout.rank_of(dp=1, pp=2))
    st = attempt.read("steps", columns=["rank", "step", "start_ns", "end_ns"])
    bounds = StepBounds.of(*(st.column(c).to_numpy() for c in ("rank", "step", "start_ns", "end_ns")))
    frame = load_phases(attempt, 2, 6)
    names = np.array(frame.names)[frame.name]
    slow = (frame.rank == culprit) & ~frame.is_comm
    factor = np.where(np.char.find(names.astype(str), "backward") >= 0, 2.2, 2.5)
    frame.wait = np.where(slow, (frame.dur * (1 - 1 / factor)).astype(np.int64), 0)
    frame.wait[frame.is_comm] = -1
    frame.busy = _busy(frame, frame.wait)
    out = attribute_window(frame, layout, hosts, bounds, 2, 6)
    assert out.modeled and not [f for f in out.findings if culprit in f.culprits], out.findings
    frame.wait[:] = -1
    frame.busy = _busy(frame, frame.wait)
    out = attribute_window(frame, layout, hosts, bounds, 2, 6)
    assert [f.culprits for f in out.findings if f.klass == "compute_straggler"] == [[culprit]], out.findings
