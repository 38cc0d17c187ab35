"""``argus bench accuracy``: every scenario × seeds × sizes, diagnosed and scored against truth.

Scoring, per run, on incidents of severity ``warning`` or above (``info`` is an observation,
not a claim): culprit precision and recall over ranks (for link faults the truth's culprit
ranks are the ranks of the culprit hosts); class accuracy (an incident that overlaps the
truth's culprits has the truth's class); on healthy runs, whether any incident was raised;
detection delay in steps (the end of the first analysis window that flags the fault, minus
the truth's onset — what an online analysis would have waited).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

__all__ = ["run_one", "summarize", "RunScore"]


@dataclass
class RunScore:
    scenario: str
    ranks: int
    seed: int
    precision: float | None
    recall: float | None
    class_ok: bool | None
    false_incident: bool
    info_incidents: int
    delay_steps: float | None
    sim_s: float
    diagnose_s: float
    predicted: list[str]

    def to_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def run_one(scenario: str, ranks: int, seed: int, steps: int = 20, workdir: Path | None = None) -> RunScore:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="argus-acc-", dir=workdir))
    try:
        t0 = time.perf_counter()
        res = simulate_to_store(SimConfig(ranks=ranks, steps=steps, seed=seed), scenario, tmp / "s", baseline=False)
        t1 = time.perf_counter()
        d = diagnose(Store.open(tmp / "s").attempt(), DiagnoseConfig(store_incidents=False))
        t2 = time.perf_counter()
        return score(scenario, ranks, seed, res.truth, d, t1 - t0, t2 - t1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def score(scenario: str, ranks: int, seed: int, truth: dict, diagnosis, sim_s: float, diag_s: float) -> RunScore:
    claims = [i for i in diagnosis.incidents if i.severity != "info"]
    info = len(diagnosis.incidents) - len(claims)
    predicted = [f"{i.klass}:{len(i.culprit_ranks)}" for i in claims]
    faults = truth["faults"]
    if not faults:
        return RunScore(scenario, ranks, seed, None, None, None, bool(claims), info, None, sim_s, diag_s, predicted)
    true_ranks = {r for f in faults for r in f["culprit_ranks"]}
    pred_ranks = {r for i in claims for r in i.culprit_ranks}
    tp = len(true_ranks & pred_ranks)
    precision = tp / len(pred_ranks) if pred_ranks else 0.0
    recall = tp / len(true_ranks) if true_ranks else 0.0
    klass = faults[0]["class"]
    matching = [i for i in claims if set(i.culprit_ranks) & true_ranks]
    class_ok = bool(matching) and any(i.klass == klass for i in matching)
    onset = min(f["window"]["start_step"] for f in faults)
    delay = None
    hits = [i for i in matching if i.klass == klass]
    if hits:
        first = min(i.start_step for i in hits)
        window_end = next((w.hi for w in diagnosis.windows if w.lo <= first <= w.hi), first)
        delay = float(max(window_end - onset, 0))
    return RunScore(scenario, ranks, seed, precision, recall, class_ok, False, info, delay, sim_s, diag_s, predicted)


def summarize(scores: list[RunScore]) -> list[dict]:
    """One row per scenario and size, plus an overall row per size."""
    rows = []
    by_key: dict[tuple[str, int], list[RunScore]] = {}
    for s in scores:
        by_key.setdefault((s.scenario, s.ranks), []).append(s)
        by_key.setdefault(("ALL", s.ranks), []).append(s)
    for (scenario, ranks), group in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][0] == "ALL", kv[0][0])):
        faulty = [s for s in group if s.precision is not None]
        healthy = [s for s in group if s.precision is None]
        mean = lambda xs: round(float(np.mean(xs)), 4) if xs else None  # noqa: E731
        rows.append({
            "bench": "accuracy", "scenario": scenario, "ranks": ranks, "runs": len(group),
            "precision": mean([s.precision for s in faulty]), "recall": mean([s.recall for s in faulty]),
            "class_accuracy": mean([float(cast(bool, s.class_ok)) for s in faulty]),  # set when scored
            "false_incident_rate": mean([float(s.false_incident) for s in healthy]),
            "info_incidents": sum(s.info_incidents for s in group),
            "delay_steps_mean": mean([s.delay_steps for s in faulty if s.delay_steps is not None]),
            "sim_s_mean": mean([s.sim_s for s in group]), "diagnose_s_mean": mean([s.diagnose_s for s in group]),
        })
    return rows
