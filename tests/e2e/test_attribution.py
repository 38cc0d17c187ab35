"""The what-if attribution on real jobs (gloo, CPU, under ``argus run``): work outside every
recorded phase on one rank, a persistent straggler in a pipeline, a pipeline stage holding more
layers, uneven inputs on every worker — each named for what it is, and nothing else claimed."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.e2e.jobs import argus_run, diagnose, job, launcher, only, pin_cpu, processor_status, run


def _evidence(inc: dict) -> dict:
    return {e["kind"]: e for e in inc["evidence"]}


def _ddp(tmp_path: Path, *fault: str, steps: int = 16) -> list[dict]:
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    run([*argus_run(store), *job("ddp", out, 4, "--steps", str(steps), "--fault-rank", "2", *fault)])
    assert processor_status(store)["ranks_seen"] == 4
    return diagnose(store)


def _pipeline(tmp_path: Path, *extra: str, steps: int = 16) -> list[dict]:
    """The 2-stage pipeline of ``argus.workloads.train_transformer`` (stage = rank // 2): manual
    sends and receives per microbatch, a data-parallel all-reduce per stage."""
    store = tmp_path / "store"
    cmd = [*launcher(4), "-m", "argus.workloads.train_transformer", "--mode", "pipeline", "--steps", str(steps),
           "--d-model", "64", "--batch", "4", *pin_cpu(4), *extra]
    run([*argus_run(store, "--layout", "pp=2,dp=2"), *cmd])
    return diagnose(store)


def test_a_checkpoint_save_outside_every_phase_is_that_ranks_with_its_stacks(tmp_path):
    """Rank 2 writes 100 MB and fsyncs after the optimizer of every third step: no phase covers
    it, the others wait for rank 2 at the next gradient all-reduce. It is the time between
    rank 2's recorded phases that the attribution charges."""
    inc = only(_ddp(tmp_path, "--fault", "save", "--fault-start", "4", "--save-mb", "100"))
    assert inc["class"] == "host_stall" and inc["culprit_ranks"] == [2]
    assert inc["phase"] == "outside the recorded phases"
    ev = _evidence(inc)
    assert ev["attribution"]["part"] == "host" and ev["attribution"]["culprits"] == [2]
    stacks = ev.get("stacks")
    if stacks is not None:  # sampled at low rate: the save's frames are what stands out where they were caught
        named = {c for c in stacks["by_cause"] if c != "unknown"}
        assert named <= {"checkpoint_io"}, stacks
        if stacks["by_cause"].get("checkpoint_io", 0) >= 5:
            assert stacks["cause"] == "checkpoint_io", stacks


def test_work_after_the_optimizer_on_one_rank_is_that_ranks(tmp_path):
    inc = only(_ddp(tmp_path, "--fault", "after_optimizer", "--fault-start", "4", "--extra-ms", "60"))
    assert inc["class"] == "host_stall" and inc["culprit_ranks"] == [2]
    assert inc["impact"]["slowdown_pct"] >= 5


def test_a_thread_holding_the_gil_on_one_rank_is_that_ranks(tmp_path):
    """From step 8 a background Python thread on rank 2 holds the GIL: its every phase runs slow
    and the others wait for it — rank 2 is named, nothing else is claimed."""
    inc = only(_ddp(tmp_path, "--fault", "gil_thread", "--fault-start", "8", steps=20))
    assert inc["culprit_ranks"] == [2] and inc["class"] in ("host_stall", "compute_straggler")
    assert inc["window"]["start_step"] >= 7


def test_a_persistent_straggler_in_a_pipeline_is_named_alone(tmp_path):
    """Rank 1 (stage 0) computes its attention 8 times from the first step: no healthy window to
    compare it with, and still named alone, with what it costs."""
    inc = only(_pipeline(tmp_path, "--fault", "compute", "--fault-rank", "1", "--fault-start", "0",
                         "--slowdown", "8"))
    assert inc["class"] in ("compute_straggler", "pipeline_imbalance") and inc["culprit_ranks"] == [1]
    assert inc["impact"]["slowdown_pct"] >= 5
    assert _evidence(inc)["critical_path"]["by_rank"][0]["rank"] == 1


def test_a_pipeline_stage_holding_more_layers_is_named_as_the_stage(tmp_path):
    """Stage 1 holds 4 blocks and stage 0 one: the stage of both replicas is named, with the
    remedy to move layers; no rank is blamed."""
    inc = only(_pipeline(tmp_path, "--stage-layers", "1,4"))
    assert inc["class"] == "pipeline_imbalance" and inc["phase"] == "stage 1"
    assert inc["culprit_ranks"] == [2, 3] and inc["action"] == "observe"
    assert "move layers" in inc["remedy"]


def test_uneven_inputs_on_every_worker_blame_no_rank(tmp_path):
    """Alone on the machine, as every serial test: 10 of 10 runs here name no rank. With a busy
    process beside it (one spinning Python loop), 1 run of 4 named rank 1 a host stall at +11% —
    its backward 2.8× its peers' in 3 steps, its CPU really taken: a noisy neighbour is a true
    host stall, not input variance. Its two earlier failures (2 of 4 full-suite runs, a rule's host
    stall on rank 2 in 4 steps) came from suite runs made while this machine did other work too;
    that they were such a neighbour is likely, not shown. A full-suite run on a quiet machine
    then named rank 0 a host stall in backward-compute at +14.5%: intermittent, one window,
    "unmistakable" by its ratio alone — a ratio of 2 in a short phase is a few ms descheduled, so
    such a finding now claims only where it costs more a step than a scheduling period. Skipped
    for a night as flaky (a deschedule of one rank read as its host stall; both dp peers of a
    stage called stragglers); with ranks and stages compared on their own work, the run-queue
    delay inside their phases taken off, 16 of 16 runs alone named no rank."""
    incidents = _pipeline(tmp_path, "--seq-jitter", "0.6")
    assert not [i for i in incidents if i["culprit_ranks"]], [i["summary"] for i in incidents]
    assert all(i["class"] == "input_imbalance" for i in incidents)


