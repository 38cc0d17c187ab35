"""Verdicts against the node's own baseline and its peers, on figures of our own making."""

from __future__ import annotations

import json

import pytest

from argus.healthcheck import HealthReport, Level, Measurement, Status, judge, load_baseline, save_baseline
from argus.healthcheck.collectives import busbw, default_sizes


def _report(values: dict[tuple[str, str, int], float], versions: dict | None = None) -> HealthReport:
    r = HealthReport("node-7", "cpu: test", versions or {"torch": "2.13.0"}, 1.0)
    for (metric, subject, size), v in values.items():
        level = Level.NET if "busbw" in metric or subject.startswith("rank") else Level.GPU
        r.measurements.append(Measurement(level, metric, subject, v, "GB/s", size))
    return r


def test_a_deficit_against_the_nodes_own_baseline_fails_and_says_by_how_much():
    base = _report({("gemm_fp32_gflops", "device", 0): 100.0, ("copy_gbs", "device", 1 << 26): 20.0})
    now = _report({("gemm_fp32_gflops", "device", 0): 88.0, ("copy_gbs", "device", 1 << 26): 19.0})
    v = {x.measurement.metric: x for x in judge(now, base)}
    assert v["gemm_fp32_gflops"].status == Status.FAIL and abs(v["gemm_fp32_gflops"].deficit - 0.12) < 1e-9
    assert "12% below this node's baseline" in v["gemm_fp32_gflops"].why
    assert v["copy_gbs"].status == Status.PASS  # 5%: within the 10% line
    assert judge(now, base, threshold=0.15)[0].status == Status.PASS


def test_the_slow_peer_is_named_and_its_peers_are_not():
    """One rank's CPU limited: its matrix products fall below the median of the others."""
    now = _report({("gemm_fp32_gflops", f"rank:{r}", 0): (50.0 if r == 2 else 80.0 + r) for r in range(4)})
    v = {x.measurement.subject: x for x in judge(now, None)}
    assert [s for s, x in v.items() if x.status == Status.FAIL] == ["rank:2"]
    assert "below its peers' median" in v["rank:2"].why and v["rank:0"].status == Status.PASS


def test_latency_bound_messages_fail_only_at_three_times_the_threshold():
    base = _report({("all_reduce_busbw_gbs", "ranks:0-3", 4096): 1.0, ("all_reduce_busbw_gbs", "ranks:0-3", 1 << 24): 1.0})
    now = _report({("all_reduce_busbw_gbs", "ranks:0-3", 4096): 0.8, ("all_reduce_busbw_gbs", "ranks:0-3", 1 << 24): 0.8})
    small, large = judge(now, base)
    assert small.status == Status.PASS and large.status == Status.FAIL
    assert judge(_report({("all_reduce_busbw_gbs", "ranks:0-3", 4096): 0.6}), base)[0].status == Status.FAIL


def test_nothing_to_compare_with_is_new_and_a_changed_stack_is_said():
    now = _report({("gemm_fp32_gflops", "device", 0): 80.0}, {"torch": "2.14.0"})
    (v,) = judge(now, None)
    assert v.status == Status.NEW and v.deficit == 0.0
    base = _report({("gemm_fp32_gflops", "device", 0): 100.0}, {"torch": "2.13.0"})
    (v,) = judge(now, base)
    assert v.status == Status.FAIL and "other torch" in v.why


def test_baselines_round_trip_per_host_and_a_foreign_file_is_refused(tmp_path):
    r = _report({("gemm_fp32_gflops", "device", 0): 80.0, ("all_reduce_busbw_gbs", "ranks:0-1", 8): 1e-5})
    r.skipped.append(("node", "skipped: no CUDA device"))
    path = save_baseline(r, tmp_path)
    assert path.name == "node-7.json" and not list(tmp_path.glob("*.tmp"))
    back = load_baseline(tmp_path, "node-7")
    assert back is not None and back.to_json() == r.to_json()
    assert load_baseline(tmp_path, "elsewhere") is None
    path.write_text(json.dumps({**r.to_json(), "schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version"):
        load_baseline(tmp_path, "node-7")


def test_bus_bandwidth_follows_nccl_tests():
    # 1 GB in 1 s on 8 ranks: all-reduce moves 2·7/8 of it per rank, all-gather 7/8, broadcast all
    assert busbw("all_reduce", 10**9, 1.0, 8) == pytest.approx(1.75)
    assert busbw("all_gather", 10**9, 1.0, 8) == pytest.approx(0.875)
    assert busbw("reduce_scatter", 10**9, 2.0, 4) == pytest.approx(0.375)
    assert busbw("broadcast", 10**9, 1.0, 8) == pytest.approx(1.0)
    assert default_sizes(False)[0] == 8 and default_sizes(False)[-1] == 4 << 20
    assert default_sizes(True)[-1] == 1 << 30


def test_a_deficit_inside_the_measured_noise_of_its_peers_is_no_verdict_and_one_beyond_it_is():
    """On a shared VM a healthy link's rounds differ up to 2×: a 30% deficit among links whose
    rounds spread 25% is noise; a throttled link 99% below fails whatever the noise."""
    def links(values, noise):
        r = HealthReport("n", "cpu", {}, 1.0)
        r.measurements = [Measurement(Level.NET, "link_busbw_gbs", f"link:{i}", v, "GB/s", 1 << 20, noise)
                          for i, v in enumerate(values)]
        return r

    noisy = judge(links([0.21, 0.30, 0.31, 0.33], 0.25), None)
    assert all(v.status == Status.PASS for v in noisy)
    quiet = judge(links([0.21, 0.30, 0.31, 0.33], 0.02), None)
    assert [v.measurement.subject for v in quiet if v.status == Status.FAIL] == ["link:0"]
    throttled = judge(links([0.002, 0.30, 0.31, 0.33], 0.6), None)
    assert [v.measurement.subject for v in throttled if v.status == Status.FAIL] == ["link:0"]


def _rounds(metric: str, subject: str, size: int, rounds, higher: bool = True, level: Level = Level.NET) -> Measurement:
    import statistics

    return Measurement(level, metric, subject, statistics.median(rounds), "GB/s" if higher else "µs", size,
                       1.0 - min(rounds) / max(rounds), samples=tuple(rounds), higher_is_better=higher)


def _with(*ms: Measurement) -> HealthReport:
    r = HealthReport("node-7", "cpu: test", {"torch": "2.13.0"}, 1.0)
    r.measurements = list(ms)
    return r


def test_rounds_fail_only_a_deficit_beyond_the_line_with_confidence():
    """Figures measured in rounds: 12% below in the medians but rounds that overlap the baseline's
    is no verdict (a quiet node's rounds spread ~15%); 20% below in every round fails; an
    erratic figure does not hide a deficit its every round shows."""
    from dataclasses import replace

    # a baseline whose runs agreed within 2% (``with_runs``: its noise is their spread)
    base = _with(replace(_rounds("copy_gbs", "device", 1 << 26, [10.0, 10.4, 9.6, 11.2, 9.1], level=Level.GPU),
                         noise=0.02))
    overlap = _with(_rounds("copy_gbs", "device", 1 << 26, [8.8, 9.9, 8.5, 9.4, 7.9], level=Level.GPU))
    (v,) = judge(overlap, base)
    assert v.status == Status.PASS and v.deficit > 0.1
    slow = _with(_rounds("copy_gbs", "device", 1 << 26, [7.6, 8.0, 7.9, 7.7, 8.1], level=Level.GPU))
    (v,) = judge(slow, base)
    assert v.status == Status.FAIL and "below this node's baseline" in v.why
    # the same distributions as single values (an older baseline, no rounds) keep the noise rule
    (v,) = judge(_with(Measurement(Level.GPU, "copy_gbs", "device", 7.9, "GB/s", 1 << 26)),
                 _with(Measurement(Level.GPU, "copy_gbs", "device", 10.0, "GB/s", 1 << 26)))
    assert v.status == Status.FAIL


def test_small_messages_are_judged_as_latency_with_their_own_tolerance():
    """Below 1 MiB a collective is latency: 1.3× slower calls pass, 2× in every round fails, and
    the verdict says it in latency, not as a bandwidth deficit."""
    base = _with(_rounds("all_reduce_latency_us", "ranks:0-1", 64, [40.0, 42, 45, 39, 41], higher=False))
    ok = _with(_rounds("all_reduce_latency_us", "ranks:0-1", 64, [52.0, 55, 50, 58, 53], higher=False))
    assert judge(ok, base)[0].status == Status.PASS
    slow = _with(_rounds("all_reduce_latency_us", "ranks:0-1", 64, [80.0, 85, 90, 83, 88], higher=False))
    (v,) = judge(slow, base)
    assert v.status == Status.FAIL and "× this node's baseline latency" in v.why
    assert v.measurement.to_json()["higher_is_better"] is False
    back = Measurement.from_json(v.measurement.to_json())
    assert back == v.measurement


def test_a_slow_peer_in_rounds_is_named_and_noisy_equal_peers_are_not():
    ranks = [_rounds("gemm_fp32_gflops", f"rank:{r}", 0, [30.0 + r, 34, 29, 33, 31 + r]) for r in range(3)]
    assert all(v.status == Status.PASS for v in judge(_with(*ranks), None))
    limited = _rounds("gemm_fp32_gflops", "rank:3", 0, [12.0, 14, 13, 12.5, 13.5])
    v = {x.measurement.subject: x for x in judge(_with(*ranks, limited), None)}
    assert [s for s, x in v.items() if x.status == Status.FAIL] == ["rank:3"]


def test_a_figure_measured_again_is_the_one_judged():
    first = _with(_rounds("copy_gbs", "device", 1 << 26, [7.0, 7.2, 7.1, 6.9, 7.3], level=Level.GPU),
                  _rounds("gemm_fp32_gflops", "device", 0, [30.0, 31, 29, 30, 32], level=Level.GPU))
    again = _with(_rounds("copy_gbs", "device", 1 << 26, [10.0, 10.1, 9.9, 10.2, 9.8], level=Level.GPU),
                  _rounds("gemm_fp32_gflops", "device", 0, [20.0, 21, 19, 20, 22], level=Level.GPU))
    key = first.measurements[0].key
    assert first.remeasured(again, {key}) == [key]
    assert first.measurements[0].value == 10.0 and first.measurements[1].value == 30.0  # only what was asked


def test_a_failing_figure_is_measured_again_over_seconds_and_fails_only_if_it_fails_every_time():
    """A shared machine's memory copies drift in phases of tens of seconds: measured again after
    pauses until it passes, a figure slowed by its neighbours passes once they pause; a degraded
    one fails every time, its last measurement judged."""
    from argus.healthcheck import AGAIN_PAUSES_S, measure_again

    base = _with(_rounds("copy_gbs", "device", 1 << 26, [10.0, 10.4, 9.6, 10.2, 9.9], level=Level.GPU))
    slow = _with(_rounds("copy_gbs", "device", 1 << 26, [7.0, 7.2, 7.1, 6.9, 7.3], level=Level.GPU))
    healthy = _with(_rounds("copy_gbs", "device", 1 << 26, [9.9, 10.1, 10.0, 9.8, 10.2], level=Level.GPU))

    def fails(rep: HealthReport) -> bool:
        return any(v.status == Status.FAIL for v in judge(rep, base))

    assert fails(slow) and not fails(healthy)
    for runs, want_n in (([slow, healthy, slow], 2), ([slow, slow, slow], 3), ([healthy], 1)):
        queue, slept = list(runs), []
        for r in runs:
            r.seconds = 2.0
        got, n = measure_again(lambda q=queue: q.pop(0), fails, sleep=slept.append)
        assert n == want_n and got is runs[want_n - 1]
        assert slept == [p for p in AGAIN_PAUSES_S[:want_n] if p > 0]  # the pauses before each run made
        assert got.seconds == 2.0 * n + sum(slept)
    assert sum(AGAIN_PAUSES_S) >= 10  # spread over seconds, not one moment
    got, n = measure_again(lambda: None, fails, sleep=lambda _s: None)  # a launched rank but rank 0
    assert got is None and n == 0


def test_a_deficit_while_others_load_the_node_is_the_nodes_state_not_a_fault():
    from argus.healthcheck.load import NodeLoad, mark_loaded

    base = _with(_rounds("copy_gbs", "device", 1 << 26, [10.0, 10.4, 9.6, 10.2, 9.9], level=Level.GPU))
    slow = _with(_rounds("copy_gbs", "device", 1 << 26, [6.0, 6.4, 6.1, 6.2, 5.9], level=Level.GPU))
    (v,) = mark_loaded(judge(slow, base), NodeLoad(0.5, 10.0, 2))
    assert v.status == Status.LOADED and "50% of the node's CPUs" in v.why
    (v,) = mark_loaded(judge(slow, base), NodeLoad(0.02, 10.0, 2))
    assert v.status == Status.FAIL


def test_the_load_meter_counts_another_process_not_the_check_itself():
    import subprocess
    import sys
    import time

    from argus.healthcheck.load import LoadMeter

    with LoadMeter() as quiet:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.5:  # the check's own work
            pass
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        with LoadMeter() as busy:
            time.sleep(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    q, b = quiet.result(), busy.result()
    assert q is not None and b is not None
    assert b.others_share > q.others_share and b.loaded, (q, b)


def test_a_baseline_of_several_runs_keeps_their_spread():
    """Three runs of one check: the rounds pooled, the runs' spread as the baseline's noise — a
    later run inside that spread passes though every round of it is below the baseline's median."""
    runs = [_with(_rounds("gemm_fp32_gflops", "device", 0, [v, v * 1.02, v * 0.98, v * 1.01, v * 0.99],
                          level=Level.GPU)) for v in (100.0, 80.0, 95.0)]
    base = runs[0].with_runs(runs[1:])
    (m,) = base.measurements
    assert len(m.samples) == 15 and m.noise == pytest.approx(0.2) and 80 <= m.value <= 100
    later = _with(_rounds("gemm_fp32_gflops", "device", 0, [79.0, 80, 81, 78.5, 80.5], level=Level.GPU))
    assert judge(later, base)[0].status == Status.PASS
    halved = _with(_rounds("gemm_fp32_gflops", "device", 0, [40.0, 41, 39, 40.5, 39.5], level=Level.GPU))
    assert judge(halved, base)[0].status == Status.FAIL


def _links_doc(slow_host: int | None, factor: float, rounds: int = 10, seed: int = 0) -> dict:
    """The net level's document of four hosts: each round the whole machine runs at its own speed
    (±25%, shared by every link of the round), each link ±4% on its own; ``slow_host``'s links
    at ``factor`` of the rest."""
    import numpy as np

    rng = np.random.default_rng(seed)
    machine = rng.uniform(0.75, 1.25, rounds)
    size, pairs = 1 << 20, []
    for a in range(4):
        for b in range(a + 1, 4):
            gbs = 0.4 * machine * rng.uniform(0.96, 1.04, rounds) * (factor if slow_host in (a, b) else 1.0)
            t = [size / (g * 1e9) for g in gbs]
            pairs.append([f"h{a}", f"h{b}", float(np.median(t)), 1 - min(t) / max(t), t])
    return {"world": 4, "rows": [], "pairs": pairs, "pair_bytes": size, "gemm": [], "gemm_noise": [],
            "gemm_samples": []}


def _hosts_judged(doc: dict, base: HealthReport | None = None) -> dict[str, object]:
    from argus.healthcheck.collectives import to_measurements

    r = HealthReport("h0", "4 ranks", {}, 1.0, measurements=to_measurements(doc))
    return {v.measurement.subject: v for v in judge(r, base) if v.measurement.metric == "host_links_busbw_gbs"}


def test_a_host_whose_every_link_is_a_fifth_slower_is_named_round_by_round_and_its_victims_are_not():
    """Rounds the whole machine ran up to 25% slower or faster cancel out: the throttled host's
    links against the links between its peers, round by round, fail it alone — the healthy hosts
    that share one slow link with it read low against the baseline, and are not named."""
    from argus.healthcheck.collectives import host_contrast, to_measurements

    base = HealthReport("h0", "4 ranks", {}, 1.0, measurements=to_measurements(_links_doc(None, 1.0, seed=1)))
    for seed in range(5):
        v = _hosts_judged(_links_doc(2, 0.8, seed=seed), base)
        assert {s for s, x in v.items() if x.status == Status.FAIL} == {"host:h2"}, {s: x.why for s, x in v.items()}
        assert "round by round, 10 rounds" in v["host:h2"].why and abs(v["host:h2"].deficit - 0.2) < 0.05
        healthy = _hosts_judged(_links_doc(None, 1.0, seed=seed), base)
        assert all(x.status == Status.PASS for x in healthy.values()), {s: x.why for s, x in healthy.items()}
    # a peer sharing one throttled link reads above 1: the links between the others hold two of them
    ratios = host_contrast([(p[0], p[1], [1.0 / x for x in p[4]]) for p in _links_doc(2, 0.8)["pairs"]])
    assert all(abs(r - 0.8) < 0.05 for r in ratios["h2"]) and all(r > 1.0 for r in ratios["h0"])


def test_a_slight_slowdown_inside_the_line_passes_however_many_rounds_say_it():
    v = _hosts_judged(_links_doc(1, 0.95))
    assert all(x.status == Status.PASS for x in v.values()), {s: x.why for s, x in v.items()}


def test_a_crawling_hosts_links_measured_three_rounds_still_fail_it_round_by_round():
    """A link so slow that each call outlasts its whole budget is measured in three rounds, not
    ten: the host's ratios come from the rounds its links were measured in."""
    doc = _links_doc(2, 0.01)
    for p in doc["pairs"]:
        if "h2" in p[:2]:
            p[4] = p[4][:3]
    v = _hosts_judged(doc)
    assert {s for s, x in v.items() if x.status == Status.FAIL} == {"host:h2"}, {s: x.why for s, x in v.items()}
    assert "3 rounds" in v["host:h2"].why and len(v["host:h0"].measurement.paired) == 10


def test_a_baseline_of_several_runs_judges_a_host_on_every_runs_rounds():
    """``--save-baseline`` measures three runs and nothing again: a host one run's ten rounds put a
    fifth below its peers (a moment of a shared machine) and the next two like them is judged on
    the thirty rounds together and passes; slow in every run, it fails."""
    from argus.healthcheck.collectives import to_measurements

    def report(doc: dict) -> HealthReport:
        return HealthReport("h0", "4 ranks", {}, 1.0, measurements=to_measurements(doc))

    def hosts(r: HealthReport) -> dict[str, object]:
        return {v.measurement.subject: v for v in judge(r, None) if v.measurement.metric == "host_links_busbw_gbs"}

    once = report(_links_doc(0, 0.8, seed=3))
    assert hosts(once)["host:h0"].status == Status.FAIL  # that run alone would fail it
    base = once.with_runs([report(_links_doc(None, 1.0, seed=s)) for s in (4, 5)])
    v = hosts(base)
    assert len(v["host:h0"].measurement.paired) == 30
    assert all(x.status == Status.PASS for x in v.values()), {s: x.why for s, x in v.items()}
    slow = report(_links_doc(0, 0.8, seed=3)).with_runs([report(_links_doc(0, 0.8, seed=s)) for s in (4, 5)])
    assert {s for s, x in hosts(slow).items() if x.status == Status.FAIL} == {"host:h0"}

