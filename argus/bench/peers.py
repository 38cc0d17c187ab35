"""``argus bench peers``: Argus beside Meta's Holistic Trace Analysis (HTA) on the same simulated jobs.

What is measured, per (scenario, seed) on a small job (HTA loads every rank's whole trace into
pandas, so jobs stay at tens of ranks):

1. the job is simulated with raw kernels into a temporary directory (``truth.json`` beside it);
2. **Argus** diagnoses the store (``diagnose``, nothing written back); its claims are the incidents
   of severity ``warning`` or ``critical`` (``info`` is an observation, as in ``argus bench
   accuracy``);
3. the store is exported as per-rank Kineto traces (``hta_compat=True``: HTA ≤ 0.5 counts only
   ``ncclKernel*`` names as communication) and **HTA** runs its straggler analysis as shipped:
   ``TraceAnalysis(trace_dir=…).get_potential_stragglers()`` with its defaults (every profiler step,
   ``num_candidates=2``, the late-start-of-the-last-long-NCCL-kernel metric);
4. both tools' named ranks are scored against the truth the same way: culprit precision
   ``|predicted ∩ truth| / |predicted|`` (0 when nothing is named on a faulty run), recall
   ``|predicted ∩ truth| / |truth|``; on healthy runs, whether the tool named any rank (a false
   alarm). Argus also gets class accuracy (an incident that overlaps the culprits has the truth's
   class, as in ``argus bench accuracy``); HTA has no classes, so its class accuracy is null.

HTA has no "nothing found" answer: it always returns its top-k ranks, so on a healthy job it
always names ``num_candidates`` ranks. That is its design, reported as it is.

When HTA as shipped cannot answer, the run escalates and records which variant produced the
numbers (``hta_variant``) and why (``hta_errors``):

* ``load_fix`` — HTA 0.5 on pandas 3 fails to load a rank trace with more than 32,767 events when
  the correlation ids fit in int16 (``transform_correlation_to_index`` writes row indices into a
  column of the correlation ids' downcast dtype); the retry widens that column to int64 first.
  The as-shipped load is tried on the largest rank file alone first, with HTA's own parser: HTA
  aborts the whole load when any rank fails, so that is the as-shipped answer at 1/N of the cost;
* ``widened_nccl`` — the straggler analysis raised or returned nothing; the retry widens its
  communication-kernel name test to ``ncclKernel*`` or ``ncclDevKernel*`` (upstream issue #360,
  the test that PR #361 proposes), on the already loaded traces.

Wall times are per tool: Argus's diagnosis; HTA's load plus analysis of the variant that answered
(the probe and failed attempts are reported apart, as ``hta_overhead_s``). HTA's peak memory is
the sampled PSS of this process and its forked parser workers above this process's PSS at the start
(PSS, not RSS: forked workers share the parent's pages, and summed RSS would count them thrice).
Argus's is left null: it runs in this long-lived process, whose allocators reuse the memory of
earlier runs, so its growth here means nothing (``argus bench analysis`` measures it). The export
is neither tool's cost and is reported apart. Cost per job at 16 ranks × 12 steps: HTA ≈ 1 s of
CPU per rank trace (≈ 8 MB of JSON each).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Self

import numpy as np

__all__ = ["HTA_CANDIDATES", "HtaAnswer", "PeerRun", "ToolResult", "culprit_scores", "hta_stragglers",
           "require_peers", "run_one", "summarize"]

HTA_CANDIDATES = 2  # get_potential_stragglers' default num_candidates
_WIDENED_PREFIXES = ("ncclKernel", "ncclDevKernel")
_PSS_SAMPLE_S = 0.1


@dataclass(slots=True)
class ToolResult:
    """One tool's answer on one run, scored against the truth."""

    predicted: list[int] | None  # ranks named; None when the tool failed to answer
    precision: float | None  # None on healthy runs and failed runs
    recall: float | None
    false_alarm: bool | None  # healthy runs only: named any rank
    class_ok: bool | None  # faulty runs, Argus only
    wall_s: float
    peak_extra_mb: float | None  # HTA only, see the module docstring
    claims: int | None = None  # Argus: incidents of severity warning or critical


@dataclass(slots=True)
class HtaAnswer:
    """What HTA returned, and what it took to get it."""

    ranks: list[int] | None
    variant: str  # "as_shipped", "load_fix", "widened_nccl", "load_fix+widened_nccl", or "failed"
    load_s: float
    analysis_s: float
    overhead_s: float  # the one-rank probe and attempts that failed
    errors: list[str] = field(default_factory=list)
    profiler_steps: int = 0


@dataclass(slots=True)
class PeerRun:
    """One (scenario, seed): the truth, both tools' scores and the costs around them."""

    scenario: str
    ranks: int
    steps: int
    seed: int
    truth_ranks: list[int]
    argus: ToolResult
    hta: ToolResult
    hta_variant: str
    hta_errors: list[str]
    hta_load_s: float
    hta_overhead_s: float
    hta_profiler_steps: int
    sim_s: float
    export_s: float
    trace_mb: float

    def to_json(self) -> dict[str, Any]:
        """Flat JSON: the tools' fields prefixed ``argus_`` and ``hta_``."""
        out: dict[str, Any] = {"bench": "peers-run"}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ToolResult):
                for g in fields(value):
                    out[f"{f.name}_{g.name}"] = _rounded(getattr(value, g.name))
            else:
                out[f.name] = _rounded(value)
        return out


def _rounded(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


def require_peers(scenarios: list[str]) -> None:
    """Fail before the first simulation: HTA and psutil importable, every scenario known."""
    from argus.errors import ConfigError
    from argus.sim import get_scenario

    for module in ("hta.trace_analysis", "psutil"):
        try:
            __import__(module)
        except ImportError as exc:
            raise ConfigError(f"argus bench peers needs {module.split('.')[0]} ({exc}); "
                              "install it with: pip install 'argus-trace[peers]'") from exc
    for name in scenarios:
        get_scenario(name)


def culprit_scores(predicted: set[int], truth: dict) -> tuple[float | None, float | None, bool | None]:
    """(precision, recall, false_alarm) of ``predicted`` ranks against ``truth.json``'s faults.

    Faulty runs: precision and recall over ranks, false_alarm None. Healthy runs: precision and
    recall None, false_alarm = any rank named."""
    faults = truth["faults"]
    if not faults:
        return None, None, bool(predicted)
    true_ranks = {int(r) for f in faults for r in f["culprit_ranks"]}
    tp = len(true_ranks & predicted)
    precision = tp / len(predicted) if predicted else 0.0
    recall = tp / len(true_ranks) if true_ranks else 0.0
    return precision, recall, None


class _PeakPss:
    """Samples the PSS of this process and its children in a thread (≈0.5 ms a sample);
    ``extra_mb`` is the peak above the start."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._start = self._sample()
        self._peak = self._start
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil

        total = self._proc.memory_full_info().pss
        for child in self._proc.children(recursive=True):
            try:
                total += child.memory_full_info().pss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(_PSS_SAMPLE_S):
            self._peak = max(self._peak, self._sample())

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._sample())

    @property
    def extra_mb(self) -> float:
        return (self._peak - self._start) / 1e6


@contextmanager
def _quiet_hta() -> Iterator[None]:
    """HTA logs every parsed file at WARNING and pandas warns about HTA's deprecated calls; silence
    both for the duration (forked parser workers inherit the state)."""
    log = logging.getLogger("hta")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning, PendingDeprecationWarning, UserWarning):
                warnings.simplefilter("ignore", category)
            yield
    finally:
        log.setLevel(level)


@contextmanager
def _int64_correlation() -> Iterator[None]:
    """HTA's parser with the ``correlation`` column widened to int64 before it is used as the dtype
    of row indices (pandas 3 refuses HTA's lossy int16 setitem). Patched in the module that calls
    it, restored on exit."""
    import hta.common.trace as hta_trace

    original = hta_trace.transform_correlation_to_index

    def widened(df: Any, symbol_table: Any) -> Any:
        if "correlation" in df.columns:
            df["correlation"] = df["correlation"].astype("int64")
        return original(df, symbol_table)

    hta_trace.transform_correlation_to_index = widened
    try:
        yield
    finally:
        hta_trace.transform_correlation_to_index = original


class _WidenedNcclNames:
    """HTA's symbol table as its straggler metric sees it: every ``ncclDevKernel*`` name gets the
    ``ncclKernel`` prefix (kept unique), so ``startswith("ncclKernel")`` accepts both spellings."""

    def __init__(self, table: Any) -> None:
        ids = table.get_sym_id_map()
        self._names = [s if s.startswith("ncclKernel") or not s.startswith(_WIDENED_PREFIXES) else "ncclKernel:" + s
                       for s in table.get_sym_table()]
        self._ids = {shown: ids[s] for shown, s in zip(self._names, table.get_sym_table())}

    def get_sym_table(self) -> list[str]:
        return self._names

    def get_sym_id_map(self) -> dict[str, int]:
        return self._ids


def _widened_impl(df: Any, symbol_table: Any, n_stragglers: int, visualize: bool) -> Any:
    from hta.analyzers.straggler import find_stragglers_with_late_start_comm_kernels

    return find_stragglers_with_late_start_comm_kernels(df, _WidenedNcclNames(symbol_table), n_stragglers, visualize)


def _is_dtype_load_error(exc: BaseException) -> bool:
    return isinstance(exc, TypeError) and "for dtype" in str(exc)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:160]}"


def _probe_one_rank(trace_dir: Path) -> tuple[BaseException | None, str, float]:
    """HTA's own ``parse_trace_file`` on the largest rank trace alone. HTA parses every rank and a
    failure on any one aborts the whole load, so a failure here is the as-shipped load's failure,
    found at a sixteenth of the cost."""
    from hta.common.trace import parse_trace_file

    biggest = max(trace_dir.glob("*.json*"), key=lambda p: p.stat().st_size)
    t0 = time.perf_counter()
    try:
        parse_trace_file(str(biggest))
    except Exception as exc:  # noqa: BLE001 - HTA's failure is a result here
        return exc, biggest.name, time.perf_counter() - t0
    return None, biggest.name, time.perf_counter() - t0


def _load(trace_dir: Path, errors: list[str], fixes: list[str]) -> tuple[Any, float, float]:
    """(TraceAnalysis or None, load_s of the load that worked, overhead_s of probe and failed loads)."""
    from hta.trace_analysis import TraceAnalysis

    exc, probed, overhead_s = _probe_one_rank(trace_dir)
    if exc is not None:
        errors.append(f"load as shipped ({probed} parsed alone): {_short(exc)}")
    else:
        t0 = time.perf_counter()
        try:
            return TraceAnalysis(trace_dir=str(trace_dir)), time.perf_counter() - t0, overhead_s
        except Exception as exc_all:  # noqa: BLE001
            overhead_s += time.perf_counter() - t0
            errors.append(f"load as shipped: {_short(exc_all)}")
            exc = exc_all
    if not _is_dtype_load_error(exc):
        return None, 0.0, overhead_s
    fixes.append("load_fix")
    t0 = time.perf_counter()
    try:
        with _int64_correlation():
            return TraceAnalysis(trace_dir=str(trace_dir)), time.perf_counter() - t0, overhead_s
    except Exception as exc_fixed:  # noqa: BLE001
        errors.append(f"load with load_fix: {_short(exc_fixed)}")
        return None, 0.0, overhead_s + time.perf_counter() - t0


def _stragglers(analysis: Any, num_candidates: int, errors: list[str], fixes: list[str]
                ) -> tuple[list[int] | None, float, float]:
    """(ranks or None, analysis_s of the attempt that answered, overhead_s of a failed as-shipped one)."""
    t0 = time.perf_counter()
    try:
        ranks = [int(r) for r in analysis.get_potential_stragglers(num_candidates=num_candidates)]
        if ranks:
            return ranks, time.perf_counter() - t0, 0.0
        errors.append("stragglers as shipped: returned no rank")
    except Exception as exc:  # noqa: BLE001
        errors.append(f"stragglers as shipped: {_short(exc)}")
    overhead_s = time.perf_counter() - t0
    fixes.append("widened_nccl")
    t0 = time.perf_counter()
    try:
        ranks = [int(r) for r in analysis.get_potential_stragglers(
            num_candidates=num_candidates, straggler_identification_impl=_widened_impl)]
    except Exception as exc:  # noqa: BLE001
        errors.append(f"stragglers widened_nccl: {_short(exc)}")
        return None, 0.0, overhead_s + time.perf_counter() - t0
    if not ranks:
        errors.append("stragglers widened_nccl: returned no rank")
        return None, 0.0, overhead_s + time.perf_counter() - t0
    return ranks, time.perf_counter() - t0, overhead_s


def hta_stragglers(trace_dir: Path, num_candidates: int = HTA_CANDIDATES) -> HtaAnswer:
    """HTA's ``get_potential_stragglers`` on ``trace_dir``: as shipped first, escalating as the module
    docstring says. Never raises for HTA's own failures (variant ``failed``)."""
    errors: list[str] = []
    fixes: list[str] = []
    with _quiet_hta():
        analysis, load_s, load_overhead_s = _load(trace_dir, errors, fixes)
        if analysis is None:
            return HtaAnswer(None, "failed", 0.0, 0.0, load_overhead_s, errors)
        steps = len(analysis.get_profiler_steps())
        ranks, analysis_s, overhead_s = _stragglers(analysis, num_candidates, errors, fixes)
    if ranks is None:
        return HtaAnswer(None, "failed", load_s, 0.0, load_overhead_s + overhead_s, errors, steps)
    return HtaAnswer(ranks, "+".join(fixes) or "as_shipped", load_s, analysis_s, load_overhead_s + overhead_s,
                     errors, steps)


def _argus_result(truth: dict, incidents: list[Any], wall_s: float) -> ToolResult:
    claims = [i for i in incidents if i.severity in ("warning", "critical")]
    predicted = {int(r) for i in claims for r in i.culprit_ranks}
    precision, recall, false_alarm = culprit_scores(predicted, truth)
    class_ok = None
    if truth["faults"]:
        true_ranks = {int(r) for f in truth["faults"] for r in f["culprit_ranks"]}
        klass = truth["faults"][0]["class"]
        class_ok = any(i.klass == klass for i in claims if set(i.culprit_ranks) & true_ranks)
    return ToolResult(sorted(predicted), precision, recall, false_alarm, class_ok, wall_s, None, len(claims))


def _hta_result(truth: dict, answer: HtaAnswer, peak_mb: float) -> ToolResult:
    wall_s = answer.load_s + answer.analysis_s
    if answer.ranks is None:
        return ToolResult(None, None, None, None, None, wall_s, peak_mb)
    precision, recall, false_alarm = culprit_scores(set(answer.ranks), truth)
    return ToolResult(sorted(answer.ranks), precision, recall, false_alarm, None, wall_s, peak_mb)


def run_one(scenario: str, seed: int, ranks: int = 16, steps: int = 12, workdir: Path | None = None,
            num_candidates: int = HTA_CANDIDATES) -> PeerRun:
    """Simulate, diagnose with Argus, export, run HTA, score both; the temp dir is always removed."""
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.kineto import export_kineto
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="argus-peers-", dir=workdir))
    try:
        t0 = time.perf_counter()
        sim = simulate_to_store(SimConfig(ranks=ranks, steps=steps, seed=seed, kernels=True), scenario,
                                tmp / "store", baseline=False)
        sim_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        diagnosis = diagnose(Store.open(tmp / "store").attempt(), DiagnoseConfig(store_incidents=False))
        argus = _argus_result(sim.truth, diagnosis.incidents, time.perf_counter() - t0)
        del diagnosis

        t0 = time.perf_counter()
        export = export_kineto(tmp / "store", tmp / "kineto", hta_compat=True)
        export_s = time.perf_counter() - t0

        with _PeakPss() as pss:
            answer = hta_stragglers(tmp / "kineto", num_candidates)
        hta = _hta_result(sim.truth, answer, pss.extra_mb)

        truth_ranks = sorted({int(r) for f in sim.truth["faults"] for r in f["culprit_ranks"]})
        return PeerRun(scenario, ranks, steps, seed, truth_ranks, argus, hta, answer.variant, answer.errors,
                       answer.load_s, answer.overhead_s, answer.profiler_steps, sim_s, export_s,
                       export.bytes_written / 1e6)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _mean(xs: list[float]) -> float | None:
    return round(float(np.mean(xs)), 4) if xs else None


def _one_or_all(values: list[int]) -> int | list[int]:
    uniq = sorted(set(values))
    return uniq[0] if len(uniq) == 1 else uniq


def _tool_row(prefix: str, results: list[ToolResult], classes: bool) -> dict[str, Any]:
    answered = [r for r in results if r.predicted is not None]
    faulty = [r for r in answered if r.precision is not None]
    healthy = [r for r in answered if r.false_alarm is not None]
    peaks = [r.peak_extra_mb for r in results if r.peak_extra_mb is not None]
    mean_of: Callable[[Callable[[ToolResult], Any]], float | None] = (  # noqa: E731
        lambda get: _mean([float(get(r)) for r in faulty]))
    return {
        f"{prefix}_precision": mean_of(lambda r: r.precision),
        f"{prefix}_recall": mean_of(lambda r: r.recall),
        f"{prefix}_class_accuracy": mean_of(lambda r: r.class_ok) if classes else None,
        f"{prefix}_false_alarm_rate": _mean([float(bool(r.false_alarm)) for r in healthy]),
        f"{prefix}_ranks_named_mean": _mean([float(len(r.predicted or [])) for r in answered]),
        f"{prefix}_failed_runs": len(results) - len(answered),
        f"{prefix}_wall_s_mean": _mean([r.wall_s for r in results]),
        f"{prefix}_peak_extra_mb_max": round(max(peaks), 1) if peaks else None,
    }


def summarize(runs: list[PeerRun]) -> list[dict[str, Any]]:
    """One row per scenario (in first-seen order), then an ``ALL`` row. Means are over runs where
    the tool answered; precision/recall/class over faulty runs, false-alarm rate over healthy ones."""
    groups: dict[str, list[PeerRun]] = {}
    for r in runs:
        groups.setdefault(r.scenario, []).append(r)
    if runs:
        groups["ALL"] = list(runs)
    rows = []
    for scenario, group in groups.items():
        rows.append({
            "bench": "peers", "scenario": scenario, "ranks": _one_or_all([r.ranks for r in group]),
            "steps": _one_or_all([r.steps for r in group]), "runs": len(group),
            "truth_ranks_mean": _mean([float(len(r.truth_ranks)) for r in group]),
            **_tool_row("argus", [r.argus for r in group], classes=True),
            **_tool_row("hta", [r.hta for r in group], classes=False),
            "hta_variants": dict(Counter(r.hta_variant for r in group)),
            "hta_load_s_mean": _mean([r.hta_load_s for r in group]),
            "hta_overhead_s_mean": _mean([r.hta_overhead_s for r in group]),
            "sim_s_mean": _mean([r.sim_s for r in group]), "export_s_mean": _mean([r.export_s for r in group]),
            "trace_mb_mean": _mean([r.trace_mb for r in group]),
        })
    return rows
