"""L2 and L3 on simulated stores: who is blamed, who is not."""

import dataclasses

import numpy as np
import pytest

from argus.analysis.frames import load_phases, load_steps
from argus.analysis.l2_stragglers import detect_stragglers
from argus.analysis.l3_kernels import collective_calls, detect_kernels


def _l2(attempt, lo, hi):
    sf = load_steps(attempt)
    return detect_stragglers(load_phases(attempt, lo, hi), attempt.layout, attempt.topology().hosts,
                             dict(zip(sf.steps.tolist(), sf.job_step_time.tolist())))


def test_busy_time_excludes_the_collectives_a_phase_waited_in(diagnosed):
    attempt, truth, _ = diagnosed("compute_straggler")
    culprit = truth["faults"][0]["culprit_ranks"][0]
    f = load_phases(attempt, 6, 6)
    fwd = f.name == f.name_id("forward-compute")
    victim = [r for r in attempt.layout.group_of("ep", culprit).tolist() if r != culprit][0]
    v = fwd & (f.rank == victim)
    assert (f.dur[v] > 2 * f.busy[v]).mean() > 0.5  # the victim mostly waited for the culprit
    c = fwd & (f.rank == culprit)
    assert np.median(f.busy[c]) > 2 * np.median(f.busy[v])


def test_l2_blames_the_slow_ranks_and_not_those_that_waited(diagnosed):
    attempt, truth, _ = diagnosed("compute_straggler")
    culprits = set(truth["faults"][0]["culprit_ranks"])
    res = _l2(attempt, 10, 14)
    busy = {f.rank for f in res.findings if f.kind == "busy" and f.persistent}
    assert busy == culprits
    attn = [f for f in res.findings if f.name == "self_attention" and f.rank in culprits]
    assert attn and min(f.ratio for f in attn) > 3
    late = {f.rank for f in res.findings if f.kind == "arrival" and f.persistent}
    assert late <= culprits


def test_l2_findings_itemise_each_steps_excess(diagnosed):
    """A finding keeps each flagged step's own excess: the mean would let a small flagged step
    ride on a stalled one's (a one-off 12 s recompile listed with 1 ms steps)."""
    attempt, truth, _ = diagnosed("compute_straggler")
    res = _l2(attempt, 10, 14)
    for f in res.findings:
        assert len(f.step_excess_s) == len(f.steps)
        assert f.excess_s == pytest.approx(float(np.mean(f.step_excess_s)))
        assert [f.excess_at(s) for s in f.steps] == f.step_excess_s
    f = res.findings[0]
    lopsided = dataclasses.replace(f, steps=[1, 2, 3], step_excess_s=[12.0, 0.001, 0.001], excess_s=4.0)
    assert lopsided.excess_at(2) == 0.001 and lopsided.typical_excess_s == 0.001


def test_per_microbatch_comparison_finds_a_slow_backward_hidden_in_aligned_steps(diagnosed):
    attempt, truth, _ = diagnosed("pipeline_bubble")
    rank = truth["faults"][0]["culprit_ranks"][0]
    ends = attempt.sql("SELECT step, max(end_ns) - min(end_ns) AS spread, median(end_ns - start_ns) AS d "
                       "FROM steps WHERE step BETWEEN 10 AND 14 GROUP BY step").to_pylist()
    assert all(r["spread"] < 0.02 * r["d"] for r in ends)  # step totals align
    res = _l2(attempt, 10, 14)
    per_mb = [f for f in res.findings if f.rank == rank and f.name == "backward-compute" and f.microbatch >= 0]
    assert len({f.microbatch for f in per_mb}) >= 4 and all(f.ratio > 1.5 for f in per_mb)
    assert not [f for f in res.findings if f.kind == "busy" and f.rank != rank and f.persistent]


def test_l3_flags_the_culprits_kernels_and_only_theirs(diagnosed):
    attempt, truth, d = diagnosed("masked_compute_straggler")
    culprits = set(truth["faults"][0]["culprit_ranks"])
    w = [x for x in d.windows if x.lo == 10][0]
    slow = {o.rank for o in w.l3.outliers if o.slower}
    assert slow == culprits
    kernels = {o.kernel for o in w.l3.outliers if o.rank in culprits}
    assert "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n" in kernels  # the mlp GEMMs
    assert w.l3.shifts == []  # their peers wait, but no transfer got slower


def test_l3_finds_a_constant_link_degradation_that_l1_cannot_see(diagnosed):
    attempt, truth, d = diagnosed("link_degradation")
    assert d.l1.faults == []  # stable step time: no spike, no level shift
    hosts = set(truth["faults"][0]["culprit_hosts"])
    for w in d.windows:
        if w.l3 is None:
            continue
        shifted = [set(s.hosts) for s in w.l3.shifts]
        assert shifted and set.intersection(*shifted) == hosts


def test_kernels_are_mapped_to_their_communicator_by_call_rate():
    calls = collective_calls(["tp-allreduce", "grad-norm-allreduce", "dp-reduce-scatter", "pp-send", "pp-recv"],
                             ["tp", "world", "dp", "pp", "pp"], [128, 1, 1, 8, 8])
    from argus.analysis.l3_kernels import kinds_for

    assert kinds_for("all_reduce", 128, calls) == ("tp",)
    assert kinds_for("all_reduce", 1.05, calls) == ("world",)
    assert kinds_for("send_recv", 16, calls) == ("pp",)
    assert kinds_for("reduce_scatter", 1, calls) == ("dp",)
    assert len(kinds_for("all_gather", 1, [])) > 1  # nothing known: every kind is tried


def test_l3_without_summaries_is_skipped_and_l2_still_works(diagnosed):
    attempt, truth, _ = diagnosed("compute_straggler")
    empty = attempt.read("kernel_summaries").slice(0, 0)
    res = detect_kernels(empty, attempt.layout, attempt.topology().hosts, 0, 0, 4)
    assert res.outliers == [] and res.shifts == []


def _frame_with_gc(pause_steps: dict[int, int], world: int = 4, steps=range(5, 10)):
    """A window of 10 ms forward phases on ``world`` ranks, plus a 200 ms ``gc`` host phase on
    each rank of ``pause_steps`` (rank → step) that falls inside the window."""
    from argus.analysis.frames import PhaseFrame

    rows = []  # rank, step, name id, cat id, start, dur
    for s in steps:
        for r in range(world):
            t0 = s * 10**9
            rows.append((r, s, 0, 0, t0, 10**7))
            if pause_steps.get(r) == s:
                rows.append((r, s, 1, 1, t0 + 2 * 10**7, 2 * 10**8))
    rows.sort(key=lambda x: (x[0], x[4]))
    a = np.array(rows, np.int64)
    return PhaseFrame(min(steps), max(steps), a[:, 0], a[:, 1], np.full(len(a), -1), a[:, 2], a[:, 3],
                      np.zeros(len(a), np.int64), a[:, 4], a[:, 5], a[:, 5].astype(np.float64),
                      ["forward-compute", "gc"], ["compute", "host"], ["none"])


def test_a_pause_every_rank_takes_once_in_steps_of_its_own_blames_none_of_them():
    from argus.topology import Layout

    layout, hosts = Layout(dp=4), np.array(["h0"] * 4)
    step_s = {s: 0.02 for s in range(12)}
    # rank 0's full collection lands in this window, the others' in steps before and after it
    f = _frame_with_gc({0: 6, 1: 3, 2: 11, 3: 2})
    alone = detect_stragglers(f, layout, hosts, step_s)
    assert [(x.rank, x.name) for x in alone.findings] == [(0, "gc")]  # per step, it looks like rank 0's
    everyone = {"gc": np.array([0.2, 0.2, 0.2, 0.2])}
    assert detect_stragglers(f, layout, hosts, step_s, host_totals=everyone).findings == []
    only_rank0 = {"gc": np.array([0.2, 0.0, 0.0, 0.0])}
    found = detect_stragglers(f, layout, hosts, step_s, host_totals=only_rank0).findings
    assert [(x.rank, x.name) for x in found] == [(0, "gc")]


def _dp_totals(floors_ms: dict[int, float], layout):
    """One step's ``dp-allreduce`` totals: each rank's fastest transfer from ``floors_ms`` (by
    dp group index), ten transfers a step."""
    from argus.analysis.frames import PhaseTotals

    gi = layout.group_index("dp")
    ranks = np.arange(layout.world_size)
    mins = np.array([floors_ms[int(gi[r])] * 1e6 for r in ranks])
    n = len(ranks)
    return PhaseTotals(0, 0, ranks, np.zeros(n, np.int64), np.full(n, -1), np.zeros(n, np.int32),
                       np.zeros(n, np.int32), np.zeros(n, np.int32), mins * 10, mins, np.full(n, 10),
                       ["dp-allreduce"], ["comm"], ["dp"])


def test_link_check_compares_each_stage_with_itself():
    """The last stage all-reduces 3× the bytes (its output layer): healthy, not a slow link; a
    group slower than its own stage's others is."""
    from argus.analysis.links import detect_link_shifts
    from argus.topology import Layout

    layout = Layout(tp=4, dp=2, pp=2)  # 4 dp groups per stage
    hosts = np.array([f"h{r // 4}" for r in range(16)])
    stage = layout.stage_of(layout.groups("dp")[:, 0])
    healthy = {g: (3.0 if stage[g] == 1 else 1.0) for g in range(8)}
    assert [f for f in detect_link_shifts(_dp_totals(healthy, layout), layout, hosts) if not f.narrow_only] == []
    slow = dict(healthy)
    slow[int(np.flatnonzero(stage == 1)[2])] = 9.0
    (finding,) = [f for f in detect_link_shifts(_dp_totals(slow, layout), layout, hosts) if not f.narrow_only]
    assert finding.ranks == layout.groups("dp")[np.flatnonzero(stage == 1)[2]].tolist()
    assert finding.per_step == 10 and abs(finding.extra_per_step_ns - 10 * 6e6) < 1e3


def test_a_slow_kernel_in_a_peer_set_of_three_is_an_outlier():
    """Tukey's fence cannot flag one of three values; the three-peer rule does."""
    from argus.analysis.l3_kernels import L3Config, _outliers
    from argus.compress import log_grid, mixture_cdf
    from argus.topology import Layout

    layout = Layout(dp=3)
    grid = log_grid(1e4, 1e7, 96)
    p50 = np.array([1.0e5, 1.02e5, 2.0e5])  # rank 2's kernel takes twice as long
    cdf = mixture_cdf(grid, np.arange(3), np.full(3, 100), p50, p50 * 1.1, n_dist=3, lo=p50 * 0.9, hi=p50 * 1.2,
                      dtype=np.float32)
    found = _outliers(cdf, np.arange(3), p50, np.full(3, 100.0), grid, layout, "gemm", 7, "compute", L3Config())
    assert [o.rank for o in found] == [2] and found[0].slower and found[0].extra_ns > 0


def test_two_slow_kernels_in_a_peer_set_of_six_are_outliers_and_healthy_spread_is_not():
    """Two of six peers slow (a host holding two ranks of a stage) put Q3 among them and the
    IQR fence above both: the minority far from the median CDF is flagged; a healthy peer
    set's few-percent spread is not."""
    from argus.analysis.l3_kernels import L3Config, _outliers
    from argus.compress import log_grid, mixture_cdf
    from argus.topology import Layout

    layout = Layout(dp=6)
    grid = log_grid(1e4, 1e7, 96)

    def flagged(p50):
        cdf = mixture_cdf(grid, np.arange(6), np.full(6, 100), p50, p50 * 1.1, n_dist=6, lo=p50 * 0.9,
                          hi=p50 * 1.2, dtype=np.float32)
        return [o.rank for o in _outliers(cdf, np.arange(6), p50, np.full(6, 100.0), grid, layout, "gemm", 7,
                                          "compute", L3Config())]

    assert flagged(np.array([4.3e5, 4.4e5, 4.38e5, 4.39e5, 14.7e5, 14.4e5])) == [4, 5]
    assert flagged(np.array([10.5e5, 10.3e5, 10.9e5, 10.4e5, 10.7e5, 10.2e5])) == []


def _frame(values_ms: np.ndarray, first_step: int = 5):
    """One ``forward`` compute phase per (step, rank), ``values_ms`` (S, N)."""
    from argus.analysis.frames import PhaseFrame

    rows = []
    S, N = values_ms.shape
    for i in range(S):
        for r in range(N):
            rows.append((r, first_step + i, 0, 0, (first_step + i) * 10**9, int(values_ms[i, r] * 1e6)))
    rows.sort(key=lambda x: (x[0], x[4]))
    a = np.array(rows, np.int64)
    return PhaseFrame(first_step, first_step + S - 1, a[:, 0], a[:, 1], np.full(len(a), -1), a[:, 2], a[:, 3],
                      np.zeros(len(a), np.int64), a[:, 4], a[:, 5], a[:, 5].astype(np.float64),
                      ["forward"], ["compute"], ["none"])


def test_a_stall_on_a_rank_whose_work_differs_from_its_peers_all_along_is_found_against_its_own_usual():
    """The real DLRM job's ranks run forwards of 3–10 ms: a 10 ms pause on the 10 ms rank (half
    a 20 ms step) stands at z < 4 among its peers, but doubles its own usual forward."""
    from argus.topology import Layout

    layout, hosts = Layout(dp=4), np.array(["h0"] * 4)
    rng = np.random.default_rng(3)
    usual = np.array([4.5, 10.0, 3.4, 8.9])
    vals = usual + rng.normal(0, 0.05, (5, 4))
    vals[:, :] += np.array([0.0, 1.0, 0.0, 2.0, 0.5])[:, None]  # the job's own steps differ, every rank alike
    step_s = {s: 0.02 for s in range(20)}
    assert detect_stragglers(_frame(vals), layout, hosts, step_s).findings == []  # healthy: nothing
    vals[2, 1] += 10.0  # rank 1 stalls in step 7
    found = detect_stragglers(_frame(vals), layout, hosts, step_s).findings
    assert [(f.rank, f.steps, f.persistent, f.peer_kind) for f in found] == [(1, [7], False, "own")]
    assert abs(found[0].excess_s - 0.010) < 0.001  # the pause itself, not its distance from the peers


def test_a_window_too_short_for_a_usual_of_its_own_takes_the_last_full_windows():
    from argus.topology import Layout

    layout, hosts = Layout(dp=4), np.array(["h0"] * 4)
    usual = np.array([4.5, 10.0, 3.4, 8.9])
    step_s = {s: 0.02 for s in range(20)}
    full = detect_stragglers(_frame(np.tile(usual, (5, 1))), layout, hosts, step_s)
    tail = np.tile(usual, (2, 1))
    tail[0, 1] += 10.0  # the job's last two steps, rank 1 stalls in the first
    assert detect_stragglers(_frame(tail, 10), layout, hosts, step_s).findings == []  # no usual to judge by
    found = detect_stragglers(_frame(tail, 10), layout, hosts, step_s, prior=full).findings
    assert [(f.rank, f.steps) for f in found] == [(1, [10])]


def test_l3_codes_of_dictionary_chunks_are_those_of_the_strings():
    """L3 reads a window's names as dictionaries, chunk by chunk with dictionaries of their own
    (nulls included): the strings its codes index are those of the plain column, null as ""."""
    import pyarrow as pa

    from argus.analysis.l3_kernels import _codes

    values = [["gemm", None, "nccl:all_reduce", "gemm"], ["flash", "gemm", None], [], ["nccl:all_reduce"]]
    plain = pa.chunked_array([pa.array(v, pa.string()) for v in values], pa.string())
    coded = pa.chunked_array([pa.array(v, pa.string()).dictionary_encode() for v in values],
                             pa.dictionary(pa.int32(), pa.string()))
    (pc_, pv), (dc, dv) = _codes(plain), _codes(coded)
    assert dv[dc].tolist() == pv[pc_].tolist() == ["gemm", "", "nccl:all_reduce", "gemm", "flash", "gemm", "",
                                                   "nccl:all_reduce"]


def test_l3_names_the_ranks_that_launch_a_kernel_more_often_by_group_then_rank():
    """Two data-parallel groups of 8 (tp=2): ranks launching a GEMM 2× (and 1.5×) as often as
    their group's median, at the same durations, are more work, not slower work; 1.2× is not."""
    import pyarrow as pa

    from argus.topology import Layout

    layout = Layout(tp=2, dp=8)
    counts = {r: 100 for r in range(16)}
    counts.update({13: 200, 3: 150, 5: 200, 6: 120})  # group of tp 1: 3, 5, 13 (6 is tp 0 and 1.2×)
    n = 16
    t = pa.table({"rank": pa.array(range(n), pa.int32()), "stream": pa.array([7] * n, pa.int32()),
                  "count": pa.array([counts[r] for r in range(n)], pa.int64()),
                  "p50_ns": [1e6] * n, "p99_ns": [1.1e6] * n, "min_ns": [0.9e6] * n, "max_ns": [1.2e6] * n,
                  "kernel": ["gemm"] * n, "category": ["compute"] * n, "op": [""] * n})
    res = detect_kernels(t, layout, np.array([f"h{r // 8}" for r in range(n)]), 0, 0, 4)
    more = [(o.rank, o.launches_ratio) for o in res.outliers if o.launches_ratio > 1]
    assert more == [(3, 1.5), (5, 2.0), (13, 2.0)]
    assert all(o.extra_ns > 0 and not o.slower for o in res.outliers if o.launches_ratio > 1)
