"""The arbiter's rules on incidents it is handed (the attribution's end-to-end checks are in
test_attribution.py and tests/e2e/test_attribution.py)."""

from __future__ import annotations

import pytest

from argus.analysis.arbiter import fold_into_failures
from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State


def _inc(klass: IncidentClass, lo: int, hi: int, severity: Severity = Severity.CRITICAL,
         ranks: list[int] | None = None) -> Incident:
    return Incident(klass, ranks or [], [], [], lo, hi, "step", [], State.SUSPECTED, severity, 20.0, 0.1,
                    Action.OBSERVE, [], [], f"{klass} {lo}-{hi}")


def test_a_whole_job_slowdown_into_a_failure_is_the_failures():
    """Steps 6–9 slower, rank 2 killed in step 8: one fault, one incident (the fail-stop's)."""
    slow, stop = _inc(IncidentClass.JOB_SLOWDOWN, 6, 9), _inc(IncidentClass.FAIL_STOP, 8, 8, ranks=[2])
    fold_into_failures([slow, stop])
    assert slow.severity == Severity.INFO and "fail_stop at step 8" in slow.summary
    assert stop.severity == Severity.CRITICAL


def test_a_whole_job_slowdown_long_before_a_failure_stands():
    slow, stop = _inc(IncidentClass.JOB_SLOWDOWN, 10, 20), _inc(IncidentClass.FAIL_STOP, 60, 60, ranks=[2])
    fold_into_failures([slow, stop])
    assert slow.severity == Severity.CRITICAL
    hang = _inc(IncidentClass.HANG, 22, 22)
    fold_into_failures([slow, hang])
    assert slow.severity == Severity.INFO


def test_a_stage_holding_a_slow_link_is_the_links_victim():
    """Host 4's link slowed: stage 1 (ranks 3–5) looks heavier for it — told in the link's incident."""
    from argus.analysis.arbiter import fold_stage_into_links

    link = _inc(IncidentClass.LINK_DEGRADATION, 0, 24, ranks=[4])
    stage = _inc(IncidentClass.PIPELINE_IMBALANCE, 0, 24, Severity.WARNING, ranks=[3, 4, 5])
    stage.phase = "stage 1"
    other = _inc(IncidentClass.PIPELINE_IMBALANCE, 0, 24, Severity.WARNING, ranks=[0, 1, 2])
    other.phase = "stage 0"
    fold_stage_into_links([link, stage, other])
    assert stage.severity == Severity.INFO and "slow link inside it" in stage.summary
    assert other.severity == Severity.WARNING and link.severity == Severity.CRITICAL


def test_a_stage_slowed_later_holding_a_slow_link_is_the_links_victim():
    """The CI run's case: stage 1 balanced in its first windows, then heavier from step 10 —
    told as its ranks' compute straggler, still the victim of the link inside it."""
    from argus.analysis.arbiter import fold_stage_into_links

    link = _inc(IncidentClass.LINK_DEGRADATION, 0, 24, ranks=[4])
    stage = _inc(IncidentClass.COMPUTE_STRAGGLER, 10, 24, Severity.WARNING, ranks=[3, 4, 5])
    stage.phase = "stage 1 (slowed from step 10)"
    ranks = _inc(IncidentClass.COMPUTE_STRAGGLER, 10, 24, Severity.WARNING, ranks=[4])
    ranks.phase = "forward-compute"  # a rank's own compute: not a stage, stands on its own
    fold_stage_into_links([link, stage, ranks])
    assert stage.severity == Severity.INFO and "slow link inside it" in stage.summary
    assert ranks.severity == Severity.WARNING


def test_a_claim_whose_cost_was_unknown_is_refuted_by_a_what_if_of_nothing_without_an_error():
    """A warning whose comparison stated no cost (None), replayed without its culprits' excess
    to no gain: inconclusive, the disagreement said — not a TypeError formatting None."""
    from argus.analysis.arbiter import _Cost, _set_impact

    inc = _inc(IncidentClass.LINK_DEGRADATION, 0, 9, Severity.WARNING, ranks=[0, 1])
    inc.evidence.append({"level": "hw", "kind": "pcie_degraded"})  # its cost unknown, a warning on the hardware's word
    inc.slowdown_pct = None
    inc.severity = Severity.WARNING
    assert inc.severity == Severity.WARNING and inc.slowdown_pct is None
    _set_impact(inc, _Cost(0.0, 10.0, list(range(10)), [], 0.1), 8, "measured")
    assert inc.severity == Severity.INFO and inc.state == State.INCONCLUSIVE
    assert any(e.get("kind") == "disagreement" and "not theirs" in e["note"] for e in inc.evidence)


def test_a_windows_short_tail_neither_clears_nor_moves_a_stages_imbalance():
    """A ×1.12 partition over steps 0–14 and the job's last step alone in its window, which read
    ×1.05–×1.19 in four runs (CI's read ×1.04): too short to find an imbalance, so too short to
    say it ended — a 5-step window balanced after does."""
    from types import SimpleNamespace

    from argus.analysis.arbiter import _balanced_after, _balanced_before
    from argus.analysis.attribution import WindowOutcome

    def outcome(lo: int, hi: int, s_stage: float) -> WindowOutcome:
        return WindowOutcome(lo, hi, SimpleNamespace(s_stage=s_stage, steps=list(range(lo, hi + 1))))  # type: ignore[arg-type]

    stage = SimpleNamespace(windows=[(5, 9), (10, 14)])
    heavy = {(5, 9): outcome(5, 9, 1.127), (10, 14): outcome(10, 14, 1.105)}
    short = {**heavy, (0, 1): outcome(0, 1, 1.01), (15, 15): outcome(15, 15, 1.04)}
    assert not _balanced_after(stage, short) and not _balanced_before(stage, short)  # type: ignore[arg-type]
    long = {**heavy, (0, 4): outcome(0, 4, 1.01), (15, 19): outcome(15, 19, 1.02)}
    assert _balanced_after(stage, long) and _balanced_before(stage, long)  # type: ignore[arg-type]


def test_one_ranks_spike_in_one_window_is_weather_unless_it_dwarfs_the_other_ranks_spikes():
    """Every rank's work spikes now and then on a shared host: rank 1's worst step (68 ms over its
    peers, the CI job's) is under three times the others' worst (36 ms) — weather; a 400 ms
    compile beside the same weather is the rank's own. Persistent findings are not weather."""
    from types import SimpleNamespace

    import numpy as np

    from argus.analysis.arbiter import _Merged, _weather
    from argus.analysis.attribution import Finding, Part, Shape, WindowOutcome

    def outcome(lo: int, hi: int, excess_ms: list[list[float]]) -> WindowOutcome:
        wa = SimpleNamespace(ranks=np.arange(4), work_excess_steps_s=np.array(excess_ms) / 1e3)
        return WindowOutcome(lo, hi, wa)  # type: ignore[arg-type]

    def merged(persistent: bool) -> _Merged:
        f = Finding(Part.WORKER, Shape.RANKS, "host_stall", [1], "backward-compute", 0.4, 1.09, 0.025, [5, 8], 5, 9,
                    "rank 1", {"persistent": persistent, "ratio": 2.91})
        return _Merged("host_stall", Part.WORKER, Shape.RANKS, [1], "backward-compute", "rank 1", [f])

    calm = outcome(10, 14, [[0.2, 4.2, 29.4], [2.3, 24.5, 15.6], [-2.2, 5.7, 29.6], [-3.5, 5.1, 25.5]])
    spiky = {(5, 9): outcome(5, 9, [[-7.7, 16.5, 5.3], [24.1, 68.0, 10.2], [-16.0, 13.6, 22.5], [35.3, 26.3, 12.1]]),
             (10, 14): calm}
    assert _weather(merged(False), spiky) == (0.068, 0.0353)
    assert _weather(merged(True), spiky) is None
    stall = {(5, 9): outcome(5, 9, [[-7.7, 16.5, 5.3], [24.1, 400.0, 10.2], [-16.0, 13.6, 22.5],
                                    [35.3, 26.3, 12.1]]), (10, 14): calm}
    assert _weather(merged(False), stall) is None


@pytest.mark.parametrize("shape, klass, culprits, gain_s, first", [
    ("communicator", "link_degradation", [1, 4], 0.01, 0),
    ("spread", "input_imbalance", [], 0.07, 20)], ids=["link", "inputs"])
def test_a_finding_in_one_window_only_is_shown_not_claimed(shape, klass, culprits, gain_s, first):
    """CI's unthrottled netns pipeline: one pipeline line's sends 1.5× the others' in steps 1–4
    (+3%; loopback transfers are CPU work on a shared host, like a rank's), and variance on every
    worker, its stages moving together, +22% in steps 20–24 alone (inputs are uneven in every
    window). One window is shown; the same finding in two windows claims."""
    from types import SimpleNamespace

    import numpy as np

    from argus.analysis.arbiter import _from_finding, _merge
    from argus.analysis.attribution import Finding, Part, Shape, WindowOutcome

    topology = SimpleNamespace(world_size=6, hosts=np.array([f"h{r}" for r in range(6)]),
                               gpu_uuids=np.array([f"g{r}" for r in range(6)]))

    def window(lo: int) -> WindowOutcome:
        steps = list(range(lo, lo + 5))
        wa = SimpleNamespace(error_pct=0.0, steps=np.array(steps), recorded_s=np.full(5, 0.3e9), of=lambda *_: [],
                             to_json=dict)
        f = Finding(Part.WORKER, Shape(shape), klass, culprits, "transfers", 0.91, 1.034, gain_s, steps, lo, lo + 4,
                    "some group", {"persistent": True, "inputs_told": True})
        return WindowOutcome(lo, lo + 4, wa, findings=[f])  # type: ignore[arg-type]

    step_time = {s: 0.3 for s in range(25)}
    for outcomes, claimed in (([window(first)], False), ([window(first), window(first + 5)], True)):
        (m,) = _merge(outcomes)
        inc = _from_finding(m, {(o.lo, o.hi): o for o in outcomes}, topology, step_time, lambda s: True)  # type: ignore[arg-type]
        assert inc is not None and inc.klass == klass and inc.slowdown_pct > 3.0
        assert (inc.severity != "info") == claimed, inc.summary


def test_variance_on_every_worker_inside_a_links_slowdown_is_the_links():
    """CI's drill: host 4 throttled from step 7, its transfers named from step 13 with L1's
    regression over steps 7–23, and "uneven inputs" over steps 5–14 (a slow pipeline link delays
    its whole line together): one fault, the link's. Before the regression, variance stands."""
    from argus.analysis.arbiter import fold_spread_into_links

    link = _inc(IncidentClass.LINK_DEGRADATION, 13, 23, ranks=[4])
    link.evidence.append({"level": "L1", "kind": "regression", "start_step": 7, "end_step": 23})
    inside = _inc(IncidentClass.INPUT_IMBALANCE, 5, 14, Severity.WARNING)
    before = _inc(IncidentClass.INPUT_IMBALANCE, 0, 5, Severity.WARNING)
    fold_spread_into_links([link, inside, before])
    assert inside.severity == Severity.INFO and "told in the link's incident" in inside.summary
    assert before.severity == Severity.WARNING and link.severity == Severity.CRITICAL


def test_the_critical_path_of_a_stall_is_read_on_its_own_steps():
    """Rank 2 stalls in step 6 only; in the window's other steps whoever happens to arrive last
    (rank 3) holds the path. Averaged over the window rank 3 would lead (0.8 vs 0.2, as a real
    4-rank job once showed); over the stall's own step rank 2 holds it all."""
    from argus.analysis.arbiter import _critical
    from argus.analysis.attribution import WindowOutcome
    from argus.analysis.attribution.attribute import WindowAttribution

    wa = WindowAttribution.__new__(WindowAttribution)
    wa.lo, wa.hi = 5, 9
    wa.critical = {5: {3: 1.0}, 6: {2: 0.9, 3: 0.1}, 7: {3: 1.0}, 8: {3: 0.7, 1: 0.3}, 9: {3: 1.0}}
    crit = _critical([WindowOutcome(5, 9, wa)], [6])
    assert [r["rank"] for r in crit["by_rank"]] == [2, 3] and crit["by_rank"][0]["share"] == 0.9
    # a stall whose steps were not replayed (irregular) is read on its windows' steps
    del wa.critical[7]
    crit = _critical([WindowOutcome(5, 9, wa)], [7])
    assert crit["by_rank"][0] == {"rank": 3, "share": round((1 + 0.1 + 0.7 + 1) / 4, 4)}
    assert _critical([WindowOutcome(5, 9, wa)], [11]) is None  # no window holds it
