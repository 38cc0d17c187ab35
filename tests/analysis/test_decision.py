"""Decisions priced against the docs' worked example (docs/diagnosis.md, "Deciding"), the ladder's
rungs per cause, and the job facts the store measures."""

from __future__ import annotations

import json

import pytest

from argus.analysis.decision import DEFAULT_RESTART_S, JobFacts, decide, job_facts
from argus.cli.main import main


def _inc(klass, action, pct, evidence=(), ranks=(5,), hosts=("node-3",)):
    return {"id": "inc-x", "class": klass, "action": action, "impact": {"slowdown_pct": pct},
            "culprit_ranks": list(ranks), "hosts": list(hosts), "gpus": ["GPU-1"], "evidence": list(evidence)}


FACTS = JobFacts(ranks=1024, step_s=2.0, checkpoint_interval_s=1800.0, checkpoint_s=40.0, restart_s=600.0,
                 measured=("checkpoint_interval_s", "checkpoint_s", "restart_s"))


def test_the_worked_example():
    """1,024 GPUs, one node 12% slow, checkpoints every 30 min, restarts of 10 min:
    doing nothing loses 1024·12/112 = 109.7 GPU-h per hour; cordoning at the next checkpoint costs
    one restart, 1024·600 s = 170.7 GPU-h, so it pays off after 1.56 h of the loss; restarting at
    once costs 1024·(600 + 900) s = 426.7 GPU-h: the ladder takes that rung after 3.89 h."""
    d = decide(_inc("compute_straggler", "cordon_node", 12.0), FACTS).to_json()
    assert d["loss_gpuh_per_h"] == pytest.approx(109.714, abs=1e-3)
    assert d["action_cost_gpuh"] == pytest.approx(170.667, abs=1e-3)
    assert d["pays_off_after_h"] == pytest.approx(1.556, abs=1e-3)
    assert d["next_rung"] == "checkpoint_and_restart" and d["escalate_after_h"] == pytest.approx(3.889, abs=1e-3)
    assert d["target"] == {"ranks": [5], "hosts": ["node-3"], "gpus": ["GPU-1"]} and d["basis"]["assumed"] == []


def test_each_rung_costs_what_it_costs_the_job():
    v = decide(_inc("compute_straggler", "verify", 12.0), FACTS)
    assert v.action_cost_gpuh == 0 and v.pays_off_after_h is None and v.next_rung == "cordon_node"
    assert v.escalate_after_h == pytest.approx(170.667 / 109.714, rel=1e-3)
    h = decide(_inc("hang", "checkpoint_and_restart", 100.0), FACTS)
    assert h.loss_gpuh_per_h == 1024 and h.action_cost_gpuh == pytest.approx(1024 * 1500 / 3600)
    o = decide(_inc("compute_straggler", "observe", 2.0), FACTS)
    assert o.action_cost_gpuh == 0 and o.next_rung is None and o.loss_gpuh_per_h == pytest.approx(1024 * 2 / 102)


@pytest.mark.parametrize("klass, evidence", [("host_stall", [{"kind": "stacks", "cause": "garbage_collection"}]),
                                             ("pipeline_imbalance", [{"kind": "pipeline", "origin_stage": 2}]),
                                             ("input_imbalance", [])])
def test_a_cause_in_the_job_is_priced_as_one_restart_to_deploy_its_fix_never_a_node(klass, evidence):
    d = decide(_inc(klass, "raise_trace_fidelity", 15.0, evidence), FACTS)
    assert d.action_cost_gpuh == pytest.approx(170.667, abs=1e-3) and d.next_rung is None
    assert "cordon" not in d.remedy and d.remedy
    if klass == "pipeline_imbalance":
        assert d.target["stage"] == 2


def test_job_facts_say_what_they_measured_and_what_they_assumed():
    f = job_facts(64, 0.5, [100, 200, 300], [9.0], None)
    assert f.checkpoint_interval_s == 50.0 and f.checkpoint_s == 4.0 and f.restart_s == DEFAULT_RESTART_S
    assert f.measured == ("checkpoint_interval_s", "checkpoint_s")
    g = job_facts(64, None, [], [], 95.0)
    assert g.restart_s == 95.0 and g.measured == ("restart_s",)


def test_the_restart_time_is_read_from_the_attempt_before(tmp_path, capsys):
    """A run restarted after a hang: the decision on the second attempt prices its restart with
    the gap the store saw between the two attempts, not the assumed 10 minutes."""
    store = tmp_path / "s"
    assert main(["simulate", "--scenario", "compute_straggler", "--out", str(store), "--ranks", "16",
                 "--steps", "30"]) == 0
    from argus.store import Store

    first = Store.open(store).attempt()
    import shutil

    second_dir = first.path.parent / "1"
    shutil.copytree(first.path, second_dir)
    meta = json.loads((second_dir / "attempt.json").read_text())
    meta["attempt_id"], meta["created_ns"] = "1", meta.get("created_ns", 0) + 1
    (second_dir / "attempt.json").write_text(json.dumps(meta))
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    last_end = max(pc.max(pq.read_table(f).column("end_ns")).as_py() for f in (first.path / "steps").rglob("*.parquet"))
    first_start = min(pc.min(pq.read_table(f).column("start_ns")).as_py() for f in (first.path / "steps").rglob("*.parquet"))
    shift = last_end - first_start + int(95e9)  # the second attempt starts 95 s after the first ended
    for f in (second_dir / "steps").rglob("*.parquet"):
        t = pq.read_table(f)
        for col in ("start_ns", "end_ns"):
            i = t.schema.get_field_index(col)
            t = t.set_column(i, col, pc.add(t.column(col), pc.cast(shift, t.column(col).type)))
        pq.write_table(t, f, compression="zstd")
    capsys.readouterr()
    assert main(["diagnose", str(store), "--run", first.identity.run_id, "--attempt", "1", "--json", "--no-store"]) == 0
    doc = json.loads(capsys.readouterr().out)
    basis = doc["incidents"][0]["decision"]["basis"]
    assert "restart_s" in basis["measured"] and basis["restart_s"] == pytest.approx(95.0, abs=1.0)
