"""Progressive diagnosis of one run attempt: L1 over the whole step series, then L2 and L3 on
every window (not only where L1 fires: a link slow from the first step never spikes), then
root cause into incidents, deepened by L4 (replay, pipeline, device gaps) and L5 (stacks),
stored in the store's ``incidents`` table.

Runs on any store a crash can leave: windows are the steps that exist (a gap of any size, or
a step number near 2⁶³, costs nothing), a window without phases is skipped, files the store
could not read are named in the document, and a read-only store keeps its diagnosis (only
storing the incidents is skipped)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.analysis.coverage import coverage_of
from argus.analysis.deepen import DeepenConfig, deepen
from argus.analysis.diagnosis import Diagnosis
from argus.analysis.frames import PhaseFrame, WindowFrames, load_steps
from argus.analysis.decision import JobFacts, decide, job_facts
from argus.analysis.incident import Incident, incidents_table
from argus.analysis.verification import apply as apply_verifications, load as load_verifications
from argus.analysis.l1_windows import L1Config, L1Result, detect_windows
from argus.analysis.l2_stragglers import L2Config, detect_stragglers, screen_candidates
from argus.analysis.collectives import p2p_transfers
from argus.analysis.links import LinkFinding, detect_link_shifts
from argus.analysis.l3_kernels import (L3_COLUMNS, L3_STRINGS, CollectiveCalls, L3Config, L3Result, collective_calls,
                                      detect_kernels, kernel_time_per_rank)
from argus.analysis.observations import observe
from argus.analysis.rollup import PhaseRollup, load_rollup
from argus.analysis.rootcause import RootCauseConfig, WindowAnalysis, build_incidents, reinstate_victims
from argus.analysis.arbiter import SLOW_CLASSES, arbitrate, candidate_label, fold_into_failures
from argus.analysis.attribution import AttributionConfig, StepBounds, WindowOutcome, attribute_window, sample_steps
from argus.analysis.attribution.subset import replay_ranks
from argus.analysis.job_log import with_job_log
from argus.analysis.sdc import checkpoints_from_log, sdc_incidents
from argus.analysis.signals import load_hw_signals
from argus.errors import ConfigError, StoreError
from argus.store import WINDOW_STEPS, Attempt
from argus.topology import Layout
from argus.vocab import KernelKind, PhaseCategory
from argus.uniques import sorted_unique

__all__ = ["DiagnoseConfig", "Diagnosis", "diagnose"]

log = logging.getLogger("argus.analysis")
#: Longest analysis window, in steps, taken from the store's kernel-summary windows. Real
#: windows are 5–100 steps; a hostile summary claiming steps 0..2⁶³ must not turn one window
#: into a loop over its span (windows hold only steps that exist, this bounds their length).
MAX_WINDOW_STEPS = 10_000


@dataclass(kw_only=True)
class DiagnoseConfig:
    window_steps: int | None = None  # default: the store's summary windows (at least 5 steps)
    steps: tuple[int, int] | None = None  # only windows inside this range (L1 always sees the whole series)
    exact_ranks: int = 2048  # up to this many ranks L2 analyses every rank exactly; above, screened candidates
    #: > 1: later windows' L3 and their screen and phase read in two threads beside this window's
    #: L2; attributions side by side (the reads and numpy give up the GIL). 1: one after the
    #: other; the same results.
    workers: int = 2
    store_incidents: bool = True
    l1: L1Config = field(default_factory=L1Config)
    l2: L2Config = field(default_factory=L2Config)
    l3: L3Config = field(default_factory=L3Config)
    rootcause: RootCauseConfig = field(default_factory=RootCauseConfig)
    deepen: DeepenConfig = field(default_factory=DeepenConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)

    def __post_init__(self) -> None:
        if self.window_steps is not None and self.window_steps < 1:
            raise ConfigError(f"window_steps must be at least 1, got {self.window_steps}")
        if self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers}")


def _job_facts(attempt: Attempt, l1: L1Result) -> JobFacts:
    """What the decisions are priced with: job size, healthy step, checkpoints, restart time."""
    ratios = [float(w.magnitude) for w in l1.windows if w.kind == "checkpoint"]
    return job_facts(attempt.layout.world_size, l1.baseline_s if np.isfinite(l1.baseline_s) else None,
                     sorted(l1.checkpoint_steps), ratios, _restart_gap_s(attempt))


def _restart_gap_s(attempt: Attempt) -> float | None:
    """Seconds between the previous attempt's last step and this one's first: the restart it took."""
    try:
        from argus.store import Store

        siblings = [a for a in Store.open(attempt.path.parents[2]).attempts()
                    if a.identity.run_id == attempt.identity.run_id]
        ids = [a.identity.attempt_id for a in siblings]
        i = ids.index(attempt.identity.attempt_id)
        if i == 0:
            return None
        prev_end = siblings[i - 1].sql("SELECT max(end_ns) FROM steps WHERE end_ns >= 0").column(0)[0].as_py()
        first = attempt.sql("SELECT min(start_ns) FROM steps").column(0)[0].as_py()
        if prev_end is None or first is None or first <= prev_end:
            return None
        return (first - prev_end) / 1e9
    except Exception:  # noqa: BLE001 - no history to learn from: the assumed figure, said so
        return None


def _windows(attempt: Attempt, steps: np.ndarray, window_steps: int | None) -> list[tuple[int, int]]:
    """Aligned windows of ``window_steps`` that hold at least one of ``steps``: a gap (what a
    ``kill -9`` of a processor leaves) or a huge step number adds no empty windows."""
    if len(steps) == 0:
        return []
    if window_steps is None:
        rows = attempt.sql("SELECT DISTINCT start_step, end_step FROM kernel_summaries").to_pylist()
        lengths = [r["end_step"] - r["start_step"] + 1 for r in rows
                   if r["start_step"] is not None and r["end_step"] is not None]
        window_steps = min(max([WINDOW_STEPS, *lengths]), MAX_WINDOW_STEPS)
    hi = int(np.max(steps))
    present = sorted_unique(np.asarray(steps, np.int64))
    if present.size > 1 and float(np.median(np.diff(present))) > 1:
        # steps sampled far apart (a profiler's few steps per hour): windows of that many steps
        # present, not of step numbers — one-step windows could judge nothing
        chunks = [present[i:i + window_steps] for i in range(0, present.size, window_steps)]
        if len(chunks) > 1 and chunks[-1].size < window_steps // 2 + 1:  # a short tail joins the last window
            chunks[-2:] = [np.concatenate(chunks[-2:])]
        return [(int(c[0]), int(c[-1])) for c in chunks]
    firsts = sorted_unique(present // window_steps) * window_steps
    return [(int(a), min(int(a) + window_steps - 1, hi)) for a in firsts]


@dataclass
class _WindowInputs:
    """What L2 needs of a window, prepared ahead: L3's result, the screened phases, the links."""

    l3: L3Result | None
    kernel_time: dict[int, float] | None
    frame: PhaseFrame
    links: list[LinkFinding]
    l3_s: float  # seconds L3 took (in whichever thread)
    l2_read_s: float  # seconds the screen and the phase read took


@dataclass
class _Kernels:
    """A window's first stage: L3's result."""

    l3: L3Result | None
    kernel_time: dict[int, float] | None
    l3_s: float


@dataclass
class _WindowPrep:
    """L3, the candidate screen and the phase read of one window: everything before L2's
    judgement, which alone needs the previous window's result. Two stages: ``kernels`` (L3),
    then ``phases`` (the window's totals, the screen — L3's slower-kernel ranks first — the
    phase read, the links)."""

    attempt: Attempt
    layout: Layout
    hosts: np.ndarray
    rollup: PhaseRollup
    frames: WindowFrames
    calls: list[CollectiveCalls]
    special_steps: np.ndarray
    step_time: dict[int, float]
    config: DiagnoseConfig
    index: dict[tuple[int, int], int]

    def kernels(self, lo: int, hi: int) -> _Kernels | None:
        t = time.perf_counter()  # L3 first: its slower-kernel ranks are wait-free candidates for L2
        if not self.rollup.holds(lo, hi):
            return None
        layout, config = self.layout, self.config
        summ = self.attempt.read("kernel_summaries", steps=(lo, hi),  # steps: only the files that may hold it
                                 filter=(pc.field("end_step") <= hi), columns=L3_COLUMNS, dictionaries=L3_STRINGS)
        special = int(((self.special_steps >= lo) & (self.special_steps <= hi)).sum())
        usable = summ.num_rows and special <= 0.25 * (hi - lo + 1)  # warm-up mixes regimes into every kernel
        l3 = detect_kernels(summ, layout, self.hosts, self.index[(lo, hi)], lo, hi, self.calls, config.l3) \
            if usable else None
        kernel_time = l3.busy_total_ns if l3 is not None else kernel_time_per_rank(summ, layout) if summ.num_rows \
            else None
        return _Kernels(l3, kernel_time, time.perf_counter() - t)

    def phases(self, lo: int, hi: int, k: _Kernels | None) -> _WindowInputs | None:
        if k is None:
            return None
        t = time.perf_counter()
        layout, config, l3 = self.layout, self.config, k.l3
        totals = self.rollup.totals(lo, hi)  # here, not beside L3: 4 s a window at 102,400 ranks
        if len(totals.rank) == 0:
            return None
        subset = None
        if layout.world_size > config.exact_ranks:
            slow = sorted({o.rank for o in (l3.outliers if l3 else []) if (o.slower or o.more_work)
                           and o.category in (PhaseCategory.COMPUTE, KernelKind.CPU_OP)})
            subset = screen_candidates(totals, layout, self.step_time, config.l2, priority=slow)
        frame = self.frames.phases(lo, hi, ranks=subset)
        # pipeline transfers from paired sends and receives where every rank's phases are loaded
        p2p = p2p_transfers(frame, layout, self.hosts) if subset is None and layout.pp > 1 else None
        links = detect_link_shifts(totals, layout, self.hosts, p2p)
        return _WindowInputs(l3, k.kernel_time, frame, links, k.l3_s, time.perf_counter() - t)

    def __call__(self, lo: int, hi: int) -> _WindowInputs | None:
        return self.phases(lo, hi, self.kernels(lo, hi))


class _Ahead:
    """Windows prepared ahead (``workers`` > 1) while the caller judges the current one: L3 in one
    thread, the screen and phase read (which wait for that window's L3) in another, each at most
    two windows ahead of L2 — three stages of a window at once, where one thread preparing both
    (L3 ≈ 1 s, the screen and read ≈ 0.8 s a window at 10,240 ranks) held L2 (≈ 0.7 s) up.
    In order, each prepared once; an exception is raised where its window is asked for."""

    AHEAD = 2

    def __init__(self, prep: _WindowPrep, spans: list[tuple[int, int]], workers: int) -> None:
        self.prep, self.spans = prep, spans
        threaded = workers > 1 and len(spans) > 1
        self.kernel_pool = ThreadPoolExecutor(1, thread_name_prefix="argus-window-l3") if threaded else None
        self.phase_pool = ThreadPoolExecutor(1, thread_name_prefix="argus-window-read") if threaded else None
        self.futures: dict[int, Future] = {}

    def _submit(self, i: int) -> None:
        if self.kernel_pool is None or self.phase_pool is None or i >= len(self.spans) or i in self.futures:
            return
        lo, hi = self.spans[i]
        kernels = self.kernel_pool.submit(self.prep.kernels, lo, hi)
        self.futures[i] = self.phase_pool.submit(lambda: self.prep.phases(lo, hi, kernels.result()))

    def get(self, i: int) -> _WindowInputs | None:
        if self.kernel_pool is None:
            return self.prep(*self.spans[i])
        for j in range(i, i + self.AHEAD + 1):  # queued in window order: at most AHEAD windows ahead
            self._submit(j)
        return self.futures.pop(i).result()

    def __enter__(self) -> _Ahead:
        return self

    def __exit__(self, *exc: object) -> None:
        for pool in (self.kernel_pool, self.phase_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)


def diagnose(attempt: Attempt, config: DiagnoseConfig | None = None,
             on_window: Callable[[int, int], None] | None = None) -> Diagnosis:
    """L1–L3 and root cause over ``attempt``; ``on_window(done, total)`` reports progress.

    A file whose data pages turn out corrupt while reading (its footer was fine) is found,
    set aside as damage, and the diagnosis runs again without it; if no such file explains
    the failure, it is a :class:`StoreError` naming the attempt."""
    import duckdb

    config = config or DiagnoseConfig()
    for _ in range(3):
        known = len(attempt.damage)
        try:
            return _diagnose(attempt, config, on_window)
        except (duckdb.Error, pa.ArrowException, OSError) as exc:
            if not attempt.scan_data() and len(attempt.damage) == known:
                raise StoreError(f"{attempt.path}: cannot read the attempt ({type(exc).__name__}: {exc})"[:500]) \
                    from None
    raise StoreError(f"{attempt.path}: damaged files keep failing the diagnosis: "
                     + "; ".join(d.reason for d in attempt.damage[:3]))


def _diagnose(attempt: Attempt, config: DiagnoseConfig, on_window: Callable[[int, int], None] | None) -> Diagnosis:
    t0 = time.perf_counter()
    layout, topology = attempt.layout, attempt.topology()
    sf = load_steps(attempt)
    job = sf.job_step_time
    step_time = {int(s): float(t) for s, t in zip(sf.steps, job)}
    rollup = load_rollup(attempt)  # every whole-run and per-window aggregate below, from one scan
    # steps in which every rank ran a checkpoint/save host phase
    l1 = detect_windows(sf.steps, job, rollup.steps_all_ran(layout.world_size, ("checkpoint", "save")), config.l1)
    timings = {"l1": time.perf_counter() - t0}
    calls = collective_calls(*rollup.calls_per_rank_step(int((~np.isnan(sf.dur_s)).sum())))
    windows: list[WindowAnalysis] = []
    # L2 judges steady steps only: a warm-up step (first compilation, cache fills) differs
    # between ranks by nature, and its excess would dominate a window's few steps
    steady_time = {s: (t if l1.is_normal_step(s) or s in l1.checkpoint_steps else float("nan"))
                   for s, t in step_time.items()}
    finished = sf.steps[~np.isin(sf.steps, l1.hung_steps)]
    spans = _windows(attempt, finished, config.window_steps)
    if config.steps is not None:
        spans = [(lo, hi) for lo, hi in spans if lo >= config.steps[0] and hi <= config.steps[1]]
    t_l2 = t_l3 = 0.0
    host_totals = rollup.host_totals(layout.world_size, np.flatnonzero((~np.isnan(sf.dur_s)).any(axis=0)))
    special_steps = np.array([s_ for s_ in sf.steps.tolist() if not l1.is_normal_step(s_)], np.int64)
    skipped: list[tuple[int, int]] = []
    # each window's phases are read once, here, and shared by L2 and L4 (replay, pipeline, GPU idle)
    frames = WindowFrames(attempt, spans)
    t_windows = time.perf_counter()
    prep = _WindowPrep(attempt, layout, topology.hosts, rollup, frames, calls, special_steps, step_time, config,
                       {sp: i for i, sp in enumerate(spans)})
    with _Ahead(prep, spans, config.workers) as ahead:
        for i, (lo, hi) in enumerate(spans):
            inputs = ahead.get(i)
            if inputs is None:  # steps without phases (a table lost, a window cut short): nothing to compare
                skipped.append((lo, hi))
                if on_window is not None:
                    on_window(i + 1, len(spans))
                continue
            t_l3 += inputs.l3_s
            t = time.perf_counter()
            l2 = detect_stragglers(inputs.frame, layout, topology.hosts, steady_time, config.l2, host_totals,
                                   prior=windows[-1].l2 if windows else None)
            l2.links = inputs.links
            t_l2 += time.perf_counter() - t + inputs.l2_read_s
            windows.append(WindowAnalysis(lo, hi, l2, inputs.l3, inputs.kernel_time))
            del inputs
            if on_window is not None:
                on_window(i + 1, len(spans))
    # l2 and l3: each level's own seconds (side by side in two threads they add up to more than
    # the windows' wall time)
    timings.update(l2=t_l2, l3=t_l3, windows=time.perf_counter() - t_windows)
    t = time.perf_counter()
    first_step = {}
    st = attempt.read("steps", columns=["rank", "step", "start_ns"])
    if st.num_rows:
        r, s, ts = (st.column(c).to_numpy() for c in ("rank", "step", "start_ns"))
        order = np.lexsort((ts, r))
        first_step = {"rank": r[order], "step": s[order], "ts": ts[order]}

    def step_of_ts(rank: int, ts: int) -> int:
        if not first_step:
            return -1
        m = first_step["rank"] == rank
        idx = np.searchsorted(first_step["ts"][m], ts, side="right") - 1
        return int(first_step["step"][m][max(idx, 0)]) if m.any() else -1

    hw = load_hw_signals(attempt, step_of_ts)
    candidates = build_incidents(attempt, topology, l1, windows, hw, step_time, config.rootcause)
    timings["rootcause"] = time.perf_counter() - t
    t = time.perf_counter()
    outcomes = _attribute(attempt, topology, frames, windows, candidates, l1, config, step_time)
    incidents, measured = arbitrate(candidates, outcomes, topology, l1, step_time)
    timings["attribution"] = time.perf_counter() - t
    t = time.perf_counter()
    deepen(attempt, topology, incidents, step_time, l1.is_normal_step, config.deepen, frames, timings)
    frames.close()
    incidents = reinstate_victims(incidents)  # a culprit the attribution dismissed explains no victim
    from argus.flight_recorder import with_kept_dumps

    incidents = with_kept_dumps(attempt, topology, incidents)  # dumps argus ingest kept: one hang with ours
    incidents = with_job_log(attempt, topology, incidents, step_of_ts)  # argus run's logs table
    incidents = fold_into_failures(incidents)  # a whole-job slowdown into a failure is the failure's
    checkpoints = checkpoints_from_log(attempt, step_of_ts)  # saves the job's log reported, with their paths
    for s_ in l1.checkpoint_steps:  # and the steps of its checkpoint phases
        checkpoints.add(s_)
    incidents += sdc_incidents(attempt, topology, checkpoints, int(sf.steps.max()) if len(sf.steps) else -1)
    apply_verifications(incidents, load_verifications(getattr(attempt, "path", None)))  # argus verify's outcomes
    facts = _job_facts(attempt, l1)
    for inc in incidents:
        inc.decision = decide(inc.to_json(), facts).to_json()
    incidents.sort(key=lambda i: (-i.severity_rank, -(i.slowdown_pct or 0.0), i.start_step))
    timings["l4_l5"] = time.perf_counter() - t
    note = _store_incidents(attempt, incidents) if config.store_incidents and incidents else ""
    t = time.perf_counter()
    coverage = coverage_of(attempt)
    steady = [int(s_) for s_, v in step_time.items() if np.isfinite(v) and l1.is_normal_step(s_)]
    depth, observations = observe(attempt, steady, coverage.comparable, rollup)
    observations += measured
    timings["observations"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    return Diagnosis(attempt, l1, windows, incidents, hw, timings, coverage, note, skipped, depth, observations,
                     outcomes)


#: Without a rule's culprit, at most this many of L2's and L3's ranks choose the replicas replayed …
MAX_SUSPECTS = 8
#: … from at most this many replicas (those holding the most of them): eight ranks over eight
#: replicas replayed 4,096 of 10,240 ranks for a window no rule had a culprit in (12.5 s of 32).
MAX_SUSPECT_REPLICAS = 2


def _suspects(layout, flagged: set[int]) -> list[int]:
    """L2's and L3's ranks in the replicas that hold the most of them (then the lowest), at most
    ``MAX_SUSPECTS``."""
    if not flagged:
        return []
    ranks = np.array(sorted(flagged), np.int64)
    replica = layout.coords(ranks)["dp"]
    kinds, counts = np.unique(replica, return_counts=True)
    keep = kinds[np.argsort(-counts, kind="stable")[:MAX_SUSPECT_REPLICAS]]
    return [int(r) for r in ranks[np.isin(replica, keep)][:MAX_SUSPECTS]]


def _attribute(attempt: Attempt, topology, frames: WindowFrames, windows: list[WindowAnalysis],
               candidates: list[Incident], l1: L1Result, config: DiagnoseConfig,
               step_time: dict[int, float]) -> list[WindowOutcome]:
    """Each window's what-if attribution over its steady steps, the rules' culprits evaluated too."""
    if not config.attribution.enabled or attempt.meta.get("phase_detail") == "aggregated":
        return []  # phases read back from a TSDB are per-step totals: no events to replay
    layout = attempt.layout
    st = attempt.read("steps", columns=["rank", "step", "start_ns", "end_ns"])
    bounds = StepBounds.of(*(st.column(c).to_numpy() for c in ("rank", "step", "start_ns", "end_ns"))) \
        if st.num_rows else None
    del st
    plans: list[_Plan] = []
    for w in windows:
        steps = [s for s in range(w.lo, w.hi + 1) if s in step_time and l1.is_normal_step(s)]
        if len(steps) < 2:
            steps = [s for s in range(w.lo, w.hi + 1) if s in step_time and np.isfinite(step_time[s])]
        if not steps:
            continue
        extra = [(candidate_label(i), list(inc.culprit_ranks)) for i, inc in enumerate(candidates)
                 if inc.klass in SLOW_CLASSES and inc.culprit_ranks and inc.start_step <= w.hi and inc.end_step >= w.lo]
        ranks = None
        if layout.world_size > config.exact_ranks:  # the replicas holding a suspect, and a few healthy ones
            # the rules' culprits; without any, the first few ranks L2 or L3 set apart (every
            # rank L2 flagged — victims included — made thousands of ranks to replay at 10,240)
            suspects = sorted({r for _, rs in extra for r in rs}) or _suspects(
                layout, {f.rank for f in w.l2.findings} | {o.rank for o in (w.l3.outliers if w.l3 else [])})
            ranks = replay_ranks(layout, suspects, full=config.exact_ranks)
        anomalies = tuple(k for k, a in enumerate(l1.faults) if a.start_step <= w.hi and a.end_step >= w.lo)
        plan = _Plan(w.lo, w.hi, steps, extra, ranks, anomalies)
        if plans and plans[-1].joins(plan):
            plans[-1] = plans[-1].joined(plan)
        else:
            plans.append(plan)
    prefer = {s for inc in candidates if inc.klass in SLOW_CLASSES and inc.culprit_ranks for s in (inc.steps or [])}

    def one(p: _Plan) -> WindowOutcome:
        steps = p.steps
        if p.ranks is None:
            frame = frames.phases(p.lo, p.hi)
        else:  # a few steps, the candidates' own first
            steps = sample_steps(steps, prefer, config.attribution.scale_steps)
            frame = frames.sampled(p.lo, p.hi, steps, p.ranks)
        try:
            return attribute_window(frame, layout, topology.hosts, bounds, p.lo, p.hi, p.extra, config.attribution,
                                    steps)
        except (ValueError, IndexError, MemoryError) as exc:  # a window we cannot model says so; the rest stand
            return WindowOutcome(p.lo, p.hi, None, f"attribution failed ({type(exc).__name__}: {exc})"[:300])

    workers = min(config.workers, len(plans))
    if workers <= 1:
        return [one(p) for p in plans]
    with ThreadPoolExecutor(workers, thread_name_prefix="argus-attribution") as pool:  # in plan order
        out = list(pool.map(one, plans))
    return out


@dataclass(frozen=True)
class _Plan:
    """The steps one attribution replays: a window, or at scale a run of windows that replay the
    same replicas for the same candidates inside the same L1 anomalies (a persistent straggler's
    four windows were four replays of the same 1,536 ranks, 17 of 41 s at 10,240 ranks)."""

    lo: int
    hi: int
    steps: list[int]
    extra: list[tuple[str, list[int]]]
    ranks: np.ndarray | None  # None: every rank (the window is attributed alone)
    anomalies: tuple[int, ...]  # the L1 regressions and jitter it overlaps

    def joins(self, other: _Plan) -> bool:
        return (self.ranks is not None and other.ranks is not None and np.array_equal(self.ranks, other.ranks)
                and self.extra == other.extra and self.anomalies == other.anomalies)

    def joined(self, other: _Plan) -> _Plan:
        return _Plan(self.lo, other.hi, self.steps + other.steps, self.extra, self.ranks, self.anomalies)


def _store_incidents(attempt: Attempt, incidents: list[Incident]) -> str:
    """Append the incidents to the store; on a store we may not write (read-only mount, full
    disk) the diagnosis stands and the returned note says why they were not stored."""
    try:
        n = len(attempt.files("incidents"))
        attempt.writer("diagnose").write("incidents", incidents_table(incidents), window=n)
    except (OSError, StoreError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        log.warning("incidents not stored in %s: %s", attempt.path, reason)
        return f"incidents not stored in {attempt.path / 'incidents'}: {reason}"
    return ""
