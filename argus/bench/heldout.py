"""``argus bench accuracy --held-out N``: diagnosis judged on jobs the project was never tuned on.

The development benches and the tests use the simulator's default layout per size and seeds
0–99. This suite draws each job instead — a layout from a wide space (tp, ep, dp, pp), the
job's natural noise (MoE routing imbalance, sequence-length spread, kernel jitter, dataloader
hiccups) — from seeds ``HELD_OUT_SEED0`` onwards, which no test, threshold or benchmark of
the project has used. Faults are injected at magnitudes from the detection limit up, and each
run's **cost** is measured against the same job simulated without the fault, so recall can be
read per cost: the goal is P, R ≥ 0.95 for faults costing ≥ 5% of the step time, and ≤ 1%
false incidents on healthy jobs.

Draws where a scenario cannot be placed (a link fault needs two hosts; a host-wide fault
needs peers off that host) are counted as not applicable, never scored.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from argus.bench.accuracy import RunScore, score
from argus.vocab import GroupKind

__all__ = ["HELD_OUT_SEED0", "MAGNITUDES", "FAMILIES", "JobDraw", "HeldOutScore", "draw_job", "family", "run_draw",
           "summarize_held_out"]

#: First evaluation seed. Development (tests, tuning, docs/benchmarks.md's main figures) uses 0–99.
HELD_OUT_SEED0 = 10_000
#: The fault parameter swept per scenario, from near the detection limit to the default.
MAGNITUDES: dict[str, tuple[str, tuple[float, ...]]] = {
    "compute_straggler": ("factor", (1.1, 1.25, 1.5, 2.0, 6.0)),
    "masked_compute_straggler": ("factor", (1.25, 1.5, 2.0, 5.7)),
    "pipeline_bubble": ("factor", (1.1, 1.25, 1.5, 1.9)),
    "thermal_throttle": ("factor", (1.1, 1.25, 1.6)),
    "link_degradation": ("factor", (1.25, 1.5, 2.0, 3.0)),
    "group_link_degradation": ("factor", (1.25, 1.5, 2.0, 3.0)),
    "link_flap": ("factor", (1.5, 2.0, 5.0)),
    "gc_pause": ("pause_ms", (50.0, 150.0, 600.0)),
    "jit_stall": ("stall_ms", (300.0, 1500.0, 6000.0)),
}
COST_FLOOR_PCT = 5.0  # the faults the goal is stated for


@dataclass(frozen=True, slots=True)
class JobDraw:
    seed: int
    ranks: int
    layout: str
    moe_alpha: float
    seqlen_sigma: float
    jitter: float
    dataloader_spike_prob: float
    megatron_groups: bool = False  # Megatron's EMBEDDING and MODEL_PARALLEL groups at the step's tail
    virtual_stages: int = 1  # > 1: the interleaved 1F1B schedule (pipelined jobs, half of them)
    slow_group: str = GroupKind.DP  # the group kind ``group_link_degradation`` slows (cp jobs: their ring, half of them)


#: The layout families, drawn alike (a family the common draws rarely reach — data parallel
#: alone needs dp ≥ 16 — is scored as often as the others)
FAMILIES = ("dp", "tp·dp", "pp", "moe", "moe·pp", "cp")


def draw_job(seed: int, min_ranks: int = 16, max_ranks: int = 256) -> JobDraw:
    """A job's shape and noise, from ``seed`` alone: a family, then a layout of it (tp, pp,
    ep in 1–8, cp in 2–8 for the context-parallel family, dp in 2–32), the interleaved schedule
    for half the pipelined ones."""
    rng = np.random.default_rng(seed)
    fam = str(rng.choice(FAMILIES))
    while True:
        tp, pp, ep = (int(rng.choice(v)) for v in ((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)))
        cp = int(rng.choice((2, 4, 8))) if fam == "cp" else 1
        dp = int(rng.choice((2, 3, 4, 6, 8, 12, 16, 24, 32)))
        n = tp * cp * pp * ep * dp
        layout = f"tp={tp},cp={cp},pp={pp},ep={ep},dp={dp}" if cp > 1 else f"tp={tp},pp={pp},ep={ep},dp={dp}"
        if min_ranks <= n <= max_ranks and family(layout) == fam:
            break
    noise = (float(rng.choice((5.0, 15.0, 40.0, 100.0))), float(rng.choice((0.02, 0.08, 0.15))),
             float(rng.choice((0.01, 0.02, 0.04))), float(rng.choice((0.0, 0.01, 0.03))))
    megatron = bool(rng.random() < 0.5)
    virtual = 2 if pp > 1 and rng.random() < 0.5 else 1
    slow_group = GroupKind.CP if cp > 1 and rng.random() < 0.5 else GroupKind.DP
    return JobDraw(seed, n, layout, *noise, megatron, virtual, slow_group)


def family(layout: str) -> str:
    """The layout family a job belongs to, by the axes it parallelises over: ``dp`` (data
    parallel only), ``tp·dp``, ``pp`` (pipelined, dense), ``moe`` (experts, no pipeline),
    ``moe·pp``, ``cp`` (context parallel — ring attention — with any of the others). Scores are stated per family as well as pooled (and, across families, for
    the jobs that run Megatron's own groups, ``megatron-groups``, and the interleaved
    schedule, ``interleaved``): a detector tuned on the common shape must not carry a family
    it fails on."""
    sizes = {k: int(v) for k, v in (part.split("=") for part in layout.split(",") if "=" in part)}
    tp, pp, ep = sizes.get("tp", 1), sizes.get("pp", 1), sizes.get("ep", 1)
    if sizes.get("cp", 1) > 1:
        return "cp"
    if ep > 1:
        return "moe·pp" if pp > 1 else "moe"
    if pp > 1:
        return "pp"
    return "tp·dp" if tp > 1 else "dp"


@dataclass
class HeldOutScore:
    draw: JobDraw
    scenario: str
    magnitude: float | None
    cost_pct: float | None  # the fault's measured slowdown of the job from its first step to its last
    score: RunScore | None  # None: the scenario does not fit this job
    reason: str = ""
    cost_hit_pct: float | None = None  # … over the steps it hit alone (the definition before 2026-12-01)

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "magnitude": self.magnitude,
                "cost_pct": None if self.cost_pct is None else round(self.cost_pct, 2),
                "cost_hit_pct": None if self.cost_hit_pct is None else round(self.cost_hit_pct, 2), **asdict(self.draw),
                **(self.score.to_json() if self.score else {"not_applicable": self.reason})}


def _cost_pct(truth: dict, hit_only: bool = False) -> float | None:
    """The fault's cost: how much slower the job ran than without it, over the steps from
    its first to its last (an intermittent fault's cost spread over the steps between, as the
    incident's own impact is — ``deepen``); ``hit_only``: over the steps it hit alone (three
    GC pauses of 8% each in 20 steps "cost 8%" there, but the job 1%)."""
    faults = truth.get("faults") or []
    if not faults:
        return None
    steps = sorted({s for f in faults for s in f["steps"]})
    if steps and not hit_only:
        steps = list(range(steps[0], steps[-1] + 1))
    got, base = truth["step_time_s"], truth["baseline_step_time_s"]
    pairs = [(got[s], base[s]) for s in steps if s < len(got) and got[s] is not None and base[s]]
    if not pairs:
        return float("inf")  # a hang: the job stopped
    return 100.0 * (sum(g for g, _ in pairs) / sum(b for _, b in pairs) - 1.0)


def _without_peers(truth: dict, layout) -> str:
    """Why a fault cannot be found by comparing like with like, or "": every culprit's peers
    (same stage, same shard) are culprits too — a host-wide fault on a host that holds a whole
    stage leaves nothing doing the same work to compare with; a slow group that is its stage's
    only group of its kind has no other group to be compared with."""
    from argus.analysis.strata import group_strata

    for f in truth.get("faults") or []:
        kind = f["params"].get("group")
        if kind:
            strata = group_strata(layout, kind)
            row = int(layout.group_index(kind)[f["culprit_ranks"][0]])
            if (strata == strata[row]).sum() < 2:
                return f"the slow {kind} group is its stage's only one: no other group does the same work"
            continue
        if f["class"] in ("hang", "link_degradation"):
            continue
        culprits = set(f["culprit_ranks"])
        if culprits and all(set(layout.peer_set(r).tolist()) <= culprits for r in culprits):
            return "every culprit's peers are culprits too: nothing does the same work to compare with"
    return ""


def run_draw(scenario: str, seed: int, magnitude: float | None = None, steps: int = 20,
             workdir: Path | None = None) -> HeldOutScore:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.errors import ArgusError
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    draw = draw_job(seed)
    params: dict[str, object] | None = {MAGNITUDES[scenario][0]: magnitude} if magnitude is not None else None
    if scenario == "group_link_degradation" and draw.slow_group != GroupKind.DP:
        params = {**(params or {}), "group": draw.slow_group}
    tmp = Path(tempfile.mkdtemp(prefix="argus-heldout-", dir=workdir))
    try:
        config = SimConfig(ranks=draw.ranks, steps=steps, seed=seed, layout=draw.layout, moe_alpha=draw.moe_alpha,
                           seqlen_sigma=draw.seqlen_sigma, jitter=draw.jitter,
                           dataloader_spike_prob=draw.dataloader_spike_prob, megatron_groups=draw.megatron_groups,
                           virtual_stages=draw.virtual_stages)
        t0 = time.perf_counter()
        try:
            res = simulate_to_store(config, scenario, tmp / "s", params=params, baseline=True)
        except ArgusError as exc:  # the scenario cannot be placed in this job
            return HeldOutScore(draw, scenario, magnitude, None, None, str(exc)[:200])
        t1 = time.perf_counter()
        attempt = Store.open(tmp / "s").attempt()
        alone = _without_peers(res.truth, attempt.layout)
        if alone:
            return HeldOutScore(draw, scenario, magnitude, _cost_pct(res.truth), None, alone,
                                _cost_pct(res.truth, hit_only=True))
        d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
        t2 = time.perf_counter()
        s = score(scenario, draw.ranks, seed, res.truth, d, t1 - t0, t2 - t1)
        return HeldOutScore(draw, scenario, magnitude, _cost_pct(res.truth), s, "", _cost_pct(res.truth, hit_only=True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def summarize_held_out(scores: list[HeldOutScore]) -> list[dict]:
    """Per scenario: the goal's figures (faults costing ≥ 5%), then recall per magnitude."""
    def mean(xs: list) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(float(np.mean(xs)), 4) if xs else None

    rows = []
    by_scenario: dict[str, list[HeldOutScore]] = {}
    for s in scores:
        by_scenario.setdefault(s.scenario, []).append(s)
    for scenario, group in sorted(by_scenario.items()):
        scored = [(s, s.score) for s in group if s.score is not None]
        row: dict = {"bench": "accuracy-held-out", "scenario": scenario, "runs": len(group), "applicable": len(scored),
                     "seeds": f"{min(s.draw.seed for s in group)}–{max(s.draw.seed for s in group)}",
                     "layouts": len({s.draw.layout for s, _ in scored})}
        if scenario == "healthy":
            row["false_incident_rate"] = mean([float(r.false_incident) for _, r in scored])
            row["false_incidents"] = [r.predicted for _, r in scored if r.false_incident][:5]
        else:
            costly = [(s, r) for s, r in scored if s.cost_pct is not None and s.cost_pct >= COST_FLOOR_PCT]
            claimed = [r for _, r in scored if r.predicted]
            row.update({"claimed_runs": len(claimed), "claimed_precision": mean([r.precision for r in claimed]),
                        "costly_runs": len(costly), "precision": mean([r.precision for _, r in costly]),
                        "recall": mean([r.recall for _, r in costly]),
                        "class_accuracy": mean([float(bool(r.class_ok)) for _, r in costly]),
                        "delay_steps_mean": mean([r.delay_steps for _, r in costly])})
            # the earlier definition, for comparison: cost over the steps the fault hit alone
            hit = [r for s, r in scored if s.cost_hit_pct is not None and s.cost_hit_pct >= COST_FLOOR_PCT]
            row.update({"costly_runs_hit_steps": len(hit), "recall_hit_steps": mean([r.recall for r in hit])})
            curve = []
            for m in sorted({s.magnitude for s, _ in scored if s.magnitude is not None}):
                at = [(s, r) for s, r in scored if s.magnitude == m]
                costs = [s.cost_pct for s, _ in at if s.cost_pct is not None]
                curve.append({"magnitude": m, "runs": len(at),
                              "cost_pct_median": round(float(np.median(costs)), 2) if costs else None,
                              "recall": mean([r.recall for _, r in at]), "precision": mean([r.precision for _, r in at])})
            row["by_magnitude"] = curve
            row["misses"] = [f"{s.draw.layout} s{s.draw.seed} m{s.magnitude} cost {s.cost_pct:.1f}%: {r.predicted}"
                             for s, r in costly if (r.recall or 0) < 1 or (r.precision or 0) < 1][:6]
        rows.append(row)
    return rows + _by_family(scores, mean)


def _by_family(scores: list[HeldOutScore], mean) -> list[dict]:
    """Per layout family: false incidents on the healthy jobs, and the goal's figures over
    every fault that cost ≥ 5%."""
    out = []
    across = {"megatron-groups": lambda d: d.megatron_groups, "interleaved": lambda d: d.virtual_stages > 1}
    families = {family(s.draw.layout) for s in scores} | {k for k, has in across.items() if any(
        has(s.draw) for s in scores)}
    for fam in sorted(families):
        scored = [(s, s.score) for s in scores if s.score is not None and (
            across[fam](s.draw) if fam in across else family(s.draw.layout) == fam)]
        healthy = [r for s, r in scored if s.scenario == "healthy"]
        costly = [(s, r) for s, r in scored if s.scenario != "healthy" and s.cost_pct is not None
                  and s.cost_pct >= COST_FLOOR_PCT]
        out.append({"bench": "accuracy-held-out-family", "family": fam,
                    "layouts": len({s.draw.layout for s, _ in scored}),
                    "healthy_jobs": len(healthy), "false_incidents": sum(bool(r.false_incident) for r in healthy),
                    "costly_runs": len(costly), "precision": mean([r.precision for _, r in costly]),
                    "recall": mean([r.recall for _, r in costly]),
                    "misses": [f"{s.scenario} {s.draw.layout} s{s.draw.seed} cost {s.cost_pct:.1f}%: {r.predicted}"
                               for s, r in costly if (r.recall or 0) < 1 or (r.precision or 0) < 1][:6]})
    return out
