"""``argus verify``: an incident's hardware suspect judged from a health report's verdicts, the
outcome recorded with the attempt and shown by ``argus diagnose``."""

from __future__ import annotations

import json

import pytest

from argus.analysis.verification import Outcome, Verification, load
from argus.cli.main import main
from argus.cli.verify import EXIT_CONFIRMED, EXIT_INCONCLUSIVE, EXIT_REFUTED
from argus.healthcheck.baseline import judge as judge_health
from argus.healthcheck.model import HealthReport, Level, Measurement
from argus.healthcheck.verify import NotVerifiable, judge, plan, suspects, with_gpus
from tests.analysis.schema import validate


def health(values: dict[str, float], metric: str = "host_links_busbw_gbs", noise: float = 0.02) -> dict:
    """A health document as `argus healthcheck --json` prints it, verdicts from the real judge."""
    report = HealthReport("ns-host-0", "cpu", {"torch": "2.13.0"}, 0.0, 1.0,
                          [Measurement(Level.NET, metric, s, v, "GB/s", 1 << 20, noise) for s, v in values.items()])
    return {**report.to_json(), "verdicts": [v.to_json() for v in judge_health(report, None)]}


LINK = {"id": "inc-00000000aa", "class": "link_degradation", "culprit_ranks": [4], "hosts": ["h4"]}
COMPUTE = {"id": "inc-00000000bb", "class": "compute_straggler", "culprit_ranks": [1], "hosts": ["h0"]}


def test_a_slow_suspect_beside_healthy_peers_is_confirmed():
    v = judge(LINK, health({"host:h0": 1.0, "host:h1": 1.05, "host:h4": 0.05, "host:h5": 0.98}))
    assert v.outcome == Outcome.CONFIRMED and v.suspects == ["host:h4"]
    assert "host:h4" in v.reason and "95% down" in v.reason and sorted(v.peers) == ["host:h0", "host:h1", "host:h5"]


def test_a_suspect_that_measures_like_its_peers_is_refuted():
    v = judge(COMPUTE, health({"rank:0": 51.0, "rank:1": 50.0, "rank:2": 49.5, "rank:3": 50.5},
                              metric="gemm_fp32_gflops"))
    assert v.outcome == Outcome.REFUTED and v.suspects == ["rank:1"]
    assert "measure like their 3 peer(s)'" in v.reason


@pytest.mark.parametrize("values, why", [
    ({"host:h0": 1.0, "host:h1": 1.0}, "measured no links of host:h4"),  # the suspect was not measured
    ({"host:h4": 1.0}, "no healthy peer"),  # nothing beside it
    ({"host:h0": 0.05, "host:h1": 0.04, "host:h4": 0.05, "host:h5": 1.0}, "failed too"),  # half the peers down too
])
def test_what_cannot_single_the_suspect_out_is_inconclusive(values, why):
    v = judge(LINK, health(values))
    assert v.outcome == Outcome.INCONCLUSIVE and why in v.reason, v.reason


def gpu_health(gemm: dict[str, float], clock_share: dict[str, float] | None = None,
               host: str = "h0") -> dict:
    """What `argus healthcheck --level gpu --json` prints on a node of four GPUs: each GPU's
    matrix products, memory copies and burn figures under its UUID, judged by the real judge."""
    ms = []
    for uuid, gflops in gemm.items():
        share = (clock_share or {}).get(uuid, 1.0)
        ms += [Measurement(Level.GPU, "gemm_bf16_gflops", f"gpu:{uuid}", gflops, "GFLOP/s"),
               Measurement(Level.GPU, "copy_gbs", f"gpu:{uuid}", 3000.0, "GB/s", 256 << 20),
               Measurement(Level.GPU, "burn_clock_share", f"gpu:{uuid}", share, "of max"),
               Measurement(Level.NODE, "pcie_gen", f"gpu:{uuid}", 5.0, "gen", expected=5.0)]
    report = HealthReport(host, "4 × NVIDIA H100 80GB HBM3", {"torch": "2.13.0"}, 0.0, 1.0, ms)
    return {**report.to_json(), "verdicts": [v.to_json() for v in judge_health(report, None)]}


#: rank 1 ran on GPU-bbb of h0 (the store's topology says so; the incident as stored may not)
ON_GPU = with_gpus({**COMPUTE, "gpus": []}, {0: "GPU-aaa", 1: "GPU-bbb", 2: "GPU-ccc"})
NODE_GPUS = ["GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd"]


def test_a_compute_stragglers_gpu_measured_below_the_nodes_other_gpus_is_confirmed():
    assert ON_GPU["gpus"] == ["GPU-bbb"] and "gpu:GPU-bbb" in suspects(ON_GPU)
    v = judge(ON_GPU, gpu_health({g: (420e3 if g == "GPU-bbb" else 700e3) for g in NODE_GPUS}))
    assert v.outcome == Outcome.CONFIRMED and v.suspects == ["gpu:GPU-bbb"], v.reason
    assert sorted(v.peers) == ["gpu:GPU-aaa", "gpu:GPU-ccc", "gpu:GPU-ddd"]
    assert "gemm_bf16_gflops 40% down" in v.reason and "3 peer(s) pass" in v.reason
    assert {c["metric"] for c in v.checks} == {"gemm_bf16_gflops", "copy_gbs", "burn_clock_share"}  # not pcie


def test_a_compute_stragglers_gpu_held_off_its_clocks_is_confirmed_by_the_burn():
    v = judge(ON_GPU, gpu_health({g: 700e3 for g in NODE_GPUS}, clock_share={"GPU-bbb": 0.7}))
    assert v.outcome == Outcome.CONFIRMED and "burn_clock_share 30% down" in v.reason, v.reason


def test_a_compute_stragglers_gpu_that_measures_like_the_others_is_refuted():
    v = judge(ON_GPU, gpu_health({g: 700e3 * (1 + 0.01 * i) for i, g in enumerate(NODE_GPUS)}))
    assert v.outcome == Outcome.REFUTED and v.suspects == ["gpu:GPU-bbb"], v.reason
    assert "the devices of gpu:GPU-bbb measure like their 3 peer(s)'" in v.reason


def test_a_gpu_check_of_another_node_or_a_cpu_nodes_one_device_cannot_settle_it():
    other = judge(ON_GPU, gpu_health({g: 700e3 for g in ["GPU-eee", "GPU-fff"]}, host="h9"))
    assert other.outcome == Outcome.INCONCLUSIVE and "measured no devices of gpu:GPU-bbb" in other.reason
    cpu = HealthReport("h0", "cpu: x", {}, 0.0, 1.0, [Measurement(Level.GPU, "gemm_fp32_gflops", "device", 50.0, "GFLOP/s")])
    doc = {**cpu.to_json(), "verdicts": [v.to_json() for v in judge_health(cpu, cpu)]}
    v = judge(COMPUTE, doc)  # the suspect host's one device: measured, but no peer beside it
    assert v.outcome == Outcome.INCONCLUSIVE and v.suspects == ["host:h0"] and "no healthy peer" in v.reason


def test_the_plan_for_a_compute_straggler_names_its_gpu_and_the_gpu_level():
    text = plan(ON_GPU, ["h0", "h1"])
    assert "argus healthcheck --level gpu" in text and "on h0" in text and "gpu:GPU-bbb" in text


def test_verify_finds_a_compute_stragglers_gpu_from_the_stores_topology(tmp_path, capsys):
    """A simulated job whose rank 2 computes slowly; a gpu-level check of its node kept in the
    store names the ranks' GPUs by UUID, as the store's topology has them from their HELLO."""
    from argus.healthcheck.records import save_health
    from argus.store import Store

    store = tmp_path / "s"
    assert main(["simulate", "--scenario", "compute_straggler", "--out", str(store), "--ranks", "4", "--layout",
                 "dp=4", "--steps", "30"]) == 0
    inc = _incident(store, capsys, klass="compute_straggler")
    attempt = Store.open(store).attempt()
    uuids = [str(u) for u in attempt.topology().gpu_uuids]
    assert inc["culprit_ranks"] == [2] and uuids[2].startswith("GPU-")
    assert main(["verify", str(store), inc["id"]]) == 0  # nothing kept: the plan names rank 2's GPU
    assert f"gpu:{uuids[2]}" in capsys.readouterr().out
    slow = gpu_health({u: (350e3 if r == 2 else 700e3) for r, u in enumerate(uuids)}, host=inc["hosts"][0])
    save_health(store, {**slow, "started_s": 1.0})
    assert main(["verify", str(store), inc["id"], "--json"]) == EXIT_CONFIRMED
    v = json.loads(capsys.readouterr().out)
    assert v["suspects"] == [f"gpu:{uuids[2]}"] and len(v["peers"]) == 3
    healthy = gpu_health({u: 700e3 for u in uuids}, host=inc["hosts"][0])
    save_health(store, {**healthy, "started_s": 2.0})  # the newer check
    assert main(["verify", str(store), inc["id"]]) == EXIT_REFUTED


def test_a_class_without_a_hardware_suspect_is_not_verified():
    with pytest.raises(NotVerifiable, match="host_stall incident: no hardware suspect"):
        judge({"id": "inc-1", "class": "host_stall", "culprit_ranks": [2], "hosts": ["h0"]}, health({"host:h0": 1}))


@pytest.fixture()
def link_store(tmp_path):
    store = tmp_path / "s"
    assert main(["simulate", "--scenario", "link_flap", "--out", str(store), "--ranks", "16", "--steps", "30"]) == 0
    return store


def _incident(store, capsys, klass="link_degradation") -> dict:
    capsys.readouterr()
    assert main(["diagnose", str(store), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    validate(doc)
    return next(i for i in doc["incidents"] if i["class"] == klass)


def test_verify_records_the_outcome_and_diagnose_acts_on_it(link_store, tmp_path, capsys):
    inc = _incident(link_store, capsys)
    suspect = inc["hosts"][0]
    others = ["node-0001", "node-0002", "node-0003"]
    doc = tmp_path / "health.json"

    doc.write_text(json.dumps(health({f"host:{suspect}": 1.0, **{f"host:{h}": 1.02 for h in others}})))
    assert main(["verify", str(link_store), inc["id"], "--health", str(doc)]) == EXIT_REFUTED
    assert "refuted" in capsys.readouterr().out
    after = _incident(link_store, capsys)
    assert after["action"] == "observe" and "the hardware checked healthy" in after["summary"]
    (ev,) = [e for e in after["evidence"] if e["kind"] == "verification"]
    assert ev["outcome"] == "refuted" and ev["level"] == "active"

    doc.write_text(json.dumps(health({f"host:{suspect}": 0.02, **{f"host:{h}": 1.0 for h in others}})))
    assert main(["verify", str(link_store), inc["id"], "--health", str(doc), "--json"]) == EXIT_CONFIRMED
    assert json.loads(capsys.readouterr().out)["outcome"] == "confirmed"
    after = _incident(link_store, capsys)
    assert (after["state"], after["action"]) == ("confirmed", "cordon_node") and "verified:" in after["summary"]
    (attempt_dir,) = (link_store / "runs").glob("*/*")
    assert [v.outcome for v in load(attempt_dir).values()] == [Outcome.CONFIRMED]  # the latest replaces


def test_verify_plans_then_refuses_bad_input(link_store, tmp_path, capsys):
    inc = _incident(link_store, capsys)
    assert main(["verify", str(link_store), inc["id"]]) == 0
    out = capsys.readouterr().out
    assert "argus healthcheck --level net" in out and f"argus verify STORE {inc['id']} --health" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a health report"}')
    assert main(["verify", str(link_store), inc["id"], "--health", str(bad)]) == 2
    assert "not the output of `argus healthcheck --json`" in capsys.readouterr().err
    assert main(["verify", str(link_store), "inc-0000000000", "--health", str(bad)]) == 2
    assert "no incident inc-0000000000" in capsys.readouterr().err
    empty = health({"host:x": 1.0, "host:y": 1.0})
    bad.write_text(json.dumps(empty))
    assert main(["verify", str(link_store), inc["id"], "--health", str(bad), "--no-store"]) == EXIT_INCONCLUSIVE
    (attempt_dir,) = (link_store / "runs").glob("*/*")
    assert load(attempt_dir) == {}


def test_a_damaged_verification_file_costs_only_itself(tmp_path):
    d = tmp_path / "verifications"
    d.mkdir()
    (d / "inc-bad.json").write_text("{")
    good = Verification("inc-good", "link_degradation", Outcome.REFUTED, "fine", ["host:a"], ["host:b"])
    (d / "inc-good.json").write_text(json.dumps(good.to_json()))
    assert list(load(tmp_path)) == ["inc-good"]
