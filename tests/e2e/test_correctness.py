"""Silent data corruption in a real gloo DDP job: one bit flipped on one rank, found from the
replicas' digests, confirmed by the next check, exposure from the step it happened.

The flip is the workload's test-only fault (``--fault flip_param|flip_grad``, off by default):
one bit of one value on rank 2 at step 5 — in a parameter, or in the all-reduced gradient the
optimizer is about to apply. Nothing raises; the job finishes. Timing plays no part in what is
asserted, so these run beside other tests."""

from __future__ import annotations


import pytest

pytest.importorskip("torch")

from argus.store import Store
from tests.e2e.jobs import STEPS, argus_run, diagnosis, job, results, run

pytestmark = pytest.mark.parallel_ok


def _sdc(store) -> list[dict]:
    return [i for i in diagnosis(store, "--no-store")["incidents"] if i["class"] == "silent_data_corruption"]


@pytest.mark.parametrize("where", ["param", "grad"])
def test_a_flipped_bit_on_one_replica_is_named_confirmed_and_dated(where, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    done = run([*argus_run(store), *job("ddp", out, 4, "--fault", f"flip_{where}", "--fault-rank", "2",
                                       "--fault-start", "5", "--save-every", "3")],
               ARGUS_SDC_EVERY="1")
    assert f"step 5: flipped bit 20 of {where}" in done.stdout + done.stderr
    res = results(out)
    assert len({res[r]["param_checksum_hex"] for r in (0, 1, 3)}) == 1  # the job really diverged on rank 2 only
    assert res[2]["param_checksum_hex"] != res[0]["param_checksum_hex"]
    (inc,) = _sdc(store)
    assert inc["culprit_ranks"] == [2] and inc["state"] == "confirmed" and inc["severity"] == "critical"
    assert inc["window"]["start_step"] == 5, inc["summary"]
    assert inc["action"] == "checkpoint_and_restart"
    seen = next(e for e in inc["evidence"] if e["kind"] == "replica_disagreement")
    assert seen["step"] == 5 and seen["sensor"] == ("params" if where == "param" else "grads")
    # saved after steps 2, 5, 8 and 11, as the job's log says (each line read in the step that
    # follows the save; the last, after the job's last step, in that step): the three saved from
    # step 5 on are suspect, by path; the one before is where to resume
    exposure = next(e for e in inc["evidence"] if e["kind"] == "exposure")
    assert exposure["checkpoints_after"] == [6, 9, 11] and exposure["resume_from_step"] == 3, exposure
    assert {p.rsplit("/", 1)[-1] for p in exposure["checkpoint_paths_after"]} == {
        f"ckpt-step{s:06d}-rank{r}.pt" for s in (5, 8, 11) for r in range(4)}
    assert {p.rsplit("/", 1)[-1] for p in exposure["resume_from_paths"]} == {f"ckpt-step000002-rank{r}.pt"
                                                                            for r in range(4)}
    assert len(list(out.glob("ckpt-step*-rank2.pt"))) == 4


def test_a_gemm_computed_wrong_on_one_rank_is_caught_on_that_rank_and_confirmed_by_its_rerun(tmp_path):
    """A wrong GEMM output on rank 1 goes into its local gradient, which the all-reduce averages
    into every replica alike: the replicas still agree, and only the GEMM check can see it."""
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    done = run([*argus_run(store), *job("ddp", out, 4, "--fault", "flip_gemm", "--fault-rank", "1",
                                       "--fault-start", "6")], ARGUS_SDC_EVERY="1", ARGUS_SDC_GEMMS="-1")
    assert "step 6: linear layer" in done.stdout + done.stderr
    res = results(out)
    assert len({res[r]["param_checksum_hex"] for r in range(4)}) == 1  # the replicas agree, wrong together
    (inc,) = _sdc(store)
    assert inc["culprit_ranks"] == [1] and inc["state"] == "confirmed" and inc["window"]["start_step"] == 6
    seen = next(e for e in inc["evidence"] if e["kind"] == "gemm_violation")
    assert seen["steps"] == [6] and seen["rerun"] == ["reproduced"]


def test_a_healthy_job_checked_every_step_raises_nothing(tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    out.mkdir()
    run([*argus_run(store), *job("ddp", out, 4)], ARGUS_SDC_EVERY="1", ARGUS_SDC_GEMMS="-1")
    fp = Store.open(store).attempt("e2e").read("checks", columns=["rank", "step", "sensor", "violations"]).to_pylist()
    assert {(r["rank"], r["step"], r["sensor"]) for r in fp} == {
        (r, s, k) for r in range(4) for s in range(STEPS) for k in ("grads", "params", "gemm")}  # every step checked
    assert sum(r["sensor"] == "gemm" for r in fp) > 4 * STEPS and not any(r["violations"] for r in fp)
    assert _sdc(store) == []
