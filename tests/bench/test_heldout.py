"""The held-out accuracy suite: its jobs are drawn from seeds development never used, its
faults are costed against the same job without them, and it scores what diagnosis says."""

from argus.bench.heldout import HELD_OUT_SEED0, MAGNITUDES, draw_job, family, run_draw, summarize_held_out
from argus.sim import SCENARIOS


def test_draws_are_reproducible_varied_and_valid_layouts():
    draws = [draw_job(HELD_OUT_SEED0 + i) for i in range(40)]
    assert draws == [draw_job(HELD_OUT_SEED0 + i) for i in range(40)]
    assert len({d.layout for d in draws}) >= 20 and len({d.moe_alpha for d in draws}) > 1
    for d in draws:
        sizes = dict(kv.split("=") for kv in d.layout.split(","))
        assert 16 <= d.ranks <= 256 and d.ranks == eval("*".join(sizes.values()))
    assert set(MAGNITUDES) <= set(SCENARIOS)


def test_every_family_is_drawn_and_pipelined_jobs_interleave_half_the_time():
    from collections import Counter

    from argus.bench.heldout import FAMILIES

    draws = [draw_job(HELD_OUT_SEED0 + i) for i in range(200)]
    by = Counter(family(d.layout) for d in draws)
    assert set(by) == set(FAMILIES) and min(by.values()) >= 20  # data parallel alone too (dp 16–32)
    piped = [d for d in draws if "pp=1," not in d.layout]
    assert all(d.virtual_stages == 1 for d in draws if "pp=1," in d.layout)
    assert 0.25 < sum(d.virtual_stages > 1 for d in piped) / len(piped) < 0.75
    assert max(int(d.layout.split("dp=")[1]) for d in draws) == 32


def test_a_run_is_costed_and_scored(tmp_path):
    s = run_draw("compute_straggler", HELD_OUT_SEED0 + 3, 6.0, steps=12, workdir=tmp_path)
    assert s.score is not None and s.cost_pct is not None and s.cost_pct > 5  # a 6× attention is not free
    healthy = run_draw("healthy", HELD_OUT_SEED0 + 3, steps=12, workdir=tmp_path)
    assert healthy.cost_pct is None and healthy.score.precision is None
    rows = summarize_held_out([s, healthy])
    by = {r["scenario"]: r for r in rows if "scenario" in r}
    assert by["healthy"]["false_incident_rate"] in (0.0, 1.0)
    assert by["compute_straggler"]["by_magnitude"][0]["magnitude"] == 6.0
    assert by["compute_straggler"]["costly_runs"] == 1
    fams = {r["family"]: r for r in rows if r["bench"] == "accuracy-held-out-family"}
    assert set(fams) == {family(s.draw.layout)} | ({"megatron-groups"} if s.draw.megatron_groups else set()) | (
        {"interleaved"} if s.draw.virtual_stages > 1 else set())  # one job: its family, and what it runs across them
    fam = fams[family(s.draw.layout)]
    assert fam["healthy_jobs"] == 1 and fam["costly_runs"] == 1
    assert fam["recall"] == s.score.recall


def test_layout_families_follow_the_axes_a_job_parallelises_over():
    assert [family(x) for x in ("tp=1,pp=1,ep=1,dp=8", "tp=4,pp=1,ep=1,dp=4", "tp=2,pp=4,ep=1,dp=2",
                                "tp=1,pp=1,ep=4,dp=4", "tp=8,pp=2,ep=2,dp=2", "tp=2,cp=4,pp=2,ep=2,dp=2")] == [
        "dp", "tp·dp", "pp", "moe", "moe·pp", "cp"]


def test_context_parallel_jobs_slow_their_ring_or_their_data_parallel_group():
    """The cp family's jobs (cp 2–8) put the slow group on the cp ring about half the time; the
    others slow a data-parallel group, as every other family does."""
    cps = [d for d in (draw_job(HELD_OUT_SEED0 + i) for i in range(200)) if family(d.layout) == "cp"]
    assert len(cps) >= 20 and {int(d.layout.split("cp=")[1].split(",")[0]) for d in cps} == {2, 4, 8}
    assert 0.25 < sum(d.slow_group == "cp" for d in cps) / len(cps) < 0.75
    assert all(d.slow_group == "dp" for d in (draw_job(HELD_OUT_SEED0 + i) for i in range(60)) if "cp=" not in d.layout)


def test_an_intermittent_fault_is_costed_over_the_steps_from_its_first_to_its_last():
    """Two 10% pauses four steps apart cost the job those pauses over five steps (4%), not 10%."""
    from argus.bench.heldout import _cost_pct

    base = [1.0] * 10
    got = list(base)
    got[3] = got[7] = 1.1
    truth = {"faults": [{"steps": [3, 7]}], "step_time_s": got, "baseline_step_time_s": base}
    assert abs(_cost_pct(truth) - 100 * 0.2 / 5) < 1e-9
    assert abs(_cost_pct(truth, hit_only=True) - 10.0) < 1e-9
    assert _cost_pct({"faults": []}) is None
