"""Silent data corruption from replicas' digests: who, from when, confirmed or not."""

from __future__ import annotations

import numpy as np

from argus.analysis import DiagnoseConfig, diagnose
from argus.analysis.evidence import check_evidence
from argus.analysis.sdc import compare_replicas
from argus.sim import SimConfig, simulate_to_store
from argus.store import Store, conform
from argus.topology import parse_layout

GOOD, BAD, WORSE = 0x1111, 0x2222, 0x3333


def _checks(ranks: int, steps: int, bad: dict[int, int] | None = None, from_check: tuple[int, str] = (99, "params"),
            every: int = 1) -> dict:
    """Each step's grads and params checks of ``ranks`` replicas; from ``from_check`` on, each rank
    in ``bad`` holds its own digest (``bad``: rank → digest)."""
    out = {}
    for step in range(0, steps, every):
        for sensor in ("grads", "params"):
            late = (step, sensor == "params") >= (from_check[0], from_check[1] == "params")
            out[(step, sensor)] = {r: ((bad or {}).get(r, GOOD + step) if late else GOOD + step, 0)
                                   for r in range(ranks)}
    return out


def test_a_flipped_parameter_names_its_rank_from_its_step_and_is_confirmed_by_the_next_check():
    v = compare_replicas(_checks(4, 10, {2: BAD}, from_check=(5, "params")), [0, 1, 2, 3])
    assert v.suspects == [2] and v.majority
    assert (v.first_bad.step, v.first_bad.sensor) == (5, "params")
    assert (v.last_good.step, v.last_good.sensor) == (5, "grads")  # exposure: step 5 itself
    assert v.confirming and (v.confirming[0].step, v.confirming[0].sensor) == (6, "grads")


def test_healthy_replicas_and_ranks_that_never_agreed_say_nothing():
    assert compare_replicas(_checks(4, 10), [0, 1, 2, 3]).first_bad is None
    unsynced = {k: {r: (GOOD * (r + 1) + k[0], 0) for r in range(4)} for k in _checks(4, 10)}
    v = compare_replicas(unsynced, [0, 1, 2, 3])  # no gradient sync: not replicas
    assert v.first_bad is None and v.agreed == 0


def test_gradients_that_agree_do_not_make_replicas_of_parameters_that_never_did():
    """A pipeline's data-parallel copies never initialised alike: its all-reduced gradients agree
    every step, its parameters never — no finding (a real 6-host job read as 'stopped agreeing')."""
    checks = _checks(3, 10)
    for (step, sensor), by in checks.items():
        if sensor == "params":
            for r in by:
                by[r] = (GOOD * (r + 7) + step, 0)
    v = compare_replicas(checks, [0, 1, 2])
    assert v.first_bad is None and v.agreed == 10  # the gradients' checks


def test_two_replicas_have_no_majority_and_a_single_check_is_only_suspected():
    v = compare_replicas(_checks(2, 6, {1: BAD}, from_check=(3, "grads")), [0, 1])
    assert not v.majority and v.suspects == [0, 1]
    once = _checks(4, 6)
    once[(3, "grads")][1] = (BAD, 0)  # a digest miscomputed once: the next checks agree again
    v = compare_replicas(once, [0, 1, 2, 3])
    assert v.suspects == [1] and not v.confirming


def _store(tmp_path, layout: str, ranks: int, steps: int, rows: list[tuple[int, int, str, int, int]], ckpt: list[int]):
    cfg = SimConfig(ranks=ranks, steps=steps, seed=3, layout=parse_layout(layout, world_size=ranks))
    simulate_to_store(cfg, "healthy", tmp_path / "s")
    attempt = Store.open(tmp_path / "s").attempt()
    w = attempt.writer("sensors")
    r, s, sensor, d, nf = zip(*rows)
    w.write("checks", conform("checks", {"violations": np.zeros(len(r), np.int32), "rerun": ["none"] * len(r),
        "rank": np.array(r, np.int32), "gpu_uuid": [""] * len(r), "step": np.array(s, np.int64),
        "ts_ns": np.array(s, np.int64) * 10 + np.array([x == "params" for x in sensor]), "sensor": list(sensor),
        "tensors": np.full(len(r), 7, np.int32), "elements": np.full(len(r), 1000, np.int64),
        "digest": np.array(d, np.uint64).view(np.int64), "nonfinite": np.array(nf, np.int64)}), window=0)
    if ckpt:
        w.write("phases", conform("phases", {
            "rank": np.repeat(np.arange(ranks, dtype=np.int32), len(ckpt)), "step": np.tile(np.array(ckpt), ranks),
            "microbatch": np.full(ranks * len(ckpt), -1, np.int32), "name": ["checkpoint"] * (ranks * len(ckpt)),
            "category": ["host"] * (ranks * len(ckpt)), "group_kind": [""] * (ranks * len(ckpt)),
            "start_ns": np.zeros(ranks * len(ckpt), np.int64), "dur_ns": np.full(ranks * len(ckpt), 1000, np.int64),
            "wait_ns": np.zeros(ranks * len(ckpt), np.int64)}), window=0)
    return attempt


def _rows(checks: dict) -> list:
    return [(r, s, k, d, nf) for (s, k), by in checks.items() for r, (d, nf) in by.items()]


def test_the_incident_names_the_rank_its_exposure_and_the_checkpoints_it_taints(tmp_path):
    # pp=2 × dp=4: the corrupt rank's stage peers outvote it; the other stage stays clean
    layout = parse_layout("pp=2", world_size=8)
    checks = _checks(8, 20, every=2)
    for key, by in checks.items():
        for r in range(8):  # each stage holds its own bits
            by[r] = (by[r][0] + 1000 * int(layout.stage_of(r)), 0)
        if key >= (8, "grads"):
            by[5] = (BAD + key[0], 0)  # rank 5 (stage 1) from step 8's gradients on
    attempt = _store(tmp_path, "pp=2", 8, 20, _rows(checks), ckpt=[4, 9, 14])
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    (inc,) = [i for i in d.incidents if i.klass == "silent_data_corruption"]
    assert inc.culprit_ranks == [5] and inc.state == "confirmed" and inc.severity == "critical"
    assert inc.action == "checkpoint_and_restart"
    assert inc.start_step == 7  # the last agreement: step 6's parameters
    exposure = next(e for e in inc.evidence if e["kind"] == "exposure")
    # ours, and any the simulated job saved itself after step 7
    assert {9, 14} <= set(exposure["checkpoints_after"]) and min(exposure["checkpoints_after"]) >= 7
    assert exposure["resume_from_step"] == 4
    assert not check_evidence(inc.evidence)
    doc = inc.to_json()
    assert doc["remedy"] and "step 4" in doc["summary"] and "9" in doc["summary"]


def test_a_healthy_store_with_sensors_has_no_correctness_incident(tmp_path):
    attempt = _store(tmp_path, "", 4, 12, _rows(_checks(4, 12, every=3)), ckpt=[])
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert not [i for i in d.incidents if i.klass == "silent_data_corruption"]
    assert attempt.read("checks").num_rows == 4 * 4 * 2
