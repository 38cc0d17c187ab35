"""``argus bench whatif``: the attribution on real jobs' public per-op timelines, against the
numbers their authors published.

The three traces of ByteDance Seed's what-if artifact (``tests/data/stragglers``: one worker
slowed, a stage holding too much, uneven sequence lengths) are imported with ``argus ingest
ops``'s importer — with their microbatch labels and without (the attribution must not need
them) — and diagnosed whole. Per trace: the job's slowdown ``S`` (recorded over ideal step
time, summed over the modelled windows) beside theirs, the replay's fidelity, the incidents,
and whether they name the root cause the authors name (class and culprits), with the time the
diagnosis took."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from argus.errors import ConfigError

__all__ = ["run", "DEFAULT_DATA", "Expected", "expected_for", "score"]

#: The vendored traces, in a checkout.
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "stragglers"


@dataclass(frozen=True)
class Expected:
    """The authors' root cause as a verdict Argus can be held to."""

    klass: str
    culprits: tuple[int, ...]  # store ranks; empty: no culprit (variance on every worker)
    why: str
    #: a stage the authors' own what-if finds heavier (its stage fix ≥ ×STAGE_ALSO): naming it a
    #: stage imbalance beside their root cause agrees with them, it is not another claim
    also_stage: tuple[int, ...] = ()


#: A published per-stage what-if this large makes the stage's imbalance part of their finding.
STAGE_ALSO = 1.2


def expected_for(name: str, published: dict, dp: int) -> Expected:
    """Their root cause of trace ``name`` in the store's ranks (rank = stage × dp + dp_rank, the
    importer's layout): the worker their slowdown split points at, the stage, or nobody."""
    cause = published["root_cause"]
    by_stage = {int(k): float(v) for k, v in published["by_stage"].items()}
    by_dp = {int(k): float(v) for k, v in published["by_dp_rank"].items()}
    stage = max(by_stage, key=by_stage.get)  # type: ignore[arg-type]
    if "worker" in cause:
        worker = max(by_dp, key=by_dp.get)  # type: ignore[arg-type]
        return Expected("compute_straggler", (stage * dp + worker,),
                        f"{cause}: stage {stage} ×{by_stage[stage]:.2f}, dp rank {worker} ×{by_dp[worker]:.2f}")
    if "stage" in cause:
        return Expected("pipeline_imbalance", tuple(stage * dp + d for d in range(dp)),
                        f"{cause}: stage {stage} ×{by_stage[stage]:.2f}")
    also = tuple(stage * dp + d for d in range(dp)) if by_stage[stage] >= STAGE_ALSO else ()
    return Expected("input_imbalance", (), f"{cause}: M_W {published['Mw']:.3f} (no worker stands out)"
                    + (f"; their stage {stage} what-if ×{by_stage[stage]:.2f}" if also else ""), also)


def score(doc: dict, expected: Expected) -> dict:
    """Did the diagnosis name the authors' root cause, and claim nothing else?"""
    incidents = doc["incidents"]
    named = [i for i in incidents if i["class"] == expected.klass and
             (not expected.culprits or set(i["culprit_ranks"]) == set(expected.culprits))]
    agreed = [i for i in incidents if expected.also_stage and i["class"] == "pipeline_imbalance"
              and set(i["culprit_ranks"]) <= set(expected.also_stage)]
    others = [i for i in incidents if i not in named and i not in agreed and i["severity"] != "info"]
    seen = named or [o for o in doc.get("observations", []) if o.get("kind") == "variance"
                     and expected.klass == "input_imbalance"]
    return {"root_cause_named": bool(seen), "other_claims": [f"{i['class']}:{i['culprit_ranks'][:8]}" for i in others]}


def _slowdown(doc: dict) -> dict:
    """The job's slowdown over its modelled windows: Σ recorded / Σ ideal step time."""
    rec = ideal = 0.0
    errors = []
    for w in doc.get("attribution", []):
        if not w.get("modeled"):
            continue
        n = len(w["steps"])
        rec += w["recorded_step_s"] * n
        ideal += w["ideal_step_s"] * n
        errors.append(w["replay_error_pct"])
    return {"S": round(rec / ideal, 4) if ideal > 0 else None,
            "windows_modeled": len(errors), "windows": len(doc.get("attribution", [])),
            "replay_error_pct_max": round(max(errors), 3) if errors else None}


def _one(path: Path, meta: Path | None, published: dict, labels: bool, tmp: Path) -> dict:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.optrace import import_ops, read_meta, read_ops
    from argus.store import Store

    sizes = read_meta(meta) if meta is not None and meta.exists() else None
    store = tmp / f"{path.stem}-{'labels' if labels else 'nolabels'}"
    t0 = time.perf_counter()
    imp = import_ops(read_ops(path), store, sizes=sizes, microbatch_labels=labels)
    import_s = time.perf_counter() - t0
    attempt = Store.open(store).attempt()
    t0 = time.perf_counter()
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    diagnose_s = time.perf_counter() - t0
    doc = d.to_json()
    mine = _slowdown(doc)
    theirs = float(published["S"])
    exp = expected_for(path.stem.split("-", 1)[-1], published, attempt.layout.dp)
    out = {"trace": path.stem, "layout": imp.layout, "steps": imp.steps, "ops": imp.ops,
           "microbatch_labels": labels, "S_published": round(theirs, 4), **mine,
           "S_ratio": round(mine["S"] / theirs, 4) if mine["S"] else None,
           "expected": {"class": exp.klass, "culprits": list(exp.culprits), "why": exp.why,
                        "agrees_with_stage": list(exp.also_stage)},
           **score(doc, exp),
           "incidents": [{"class": i["class"], "severity": i["severity"], "culprits": i["culprit_ranks"][:16],
                          "slowdown_pct": i["impact"]["slowdown_pct"]} for i in doc["incidents"]],
           "observations": [o["kind"] for o in doc.get("observations", [])][:8],
           "import_s": round(import_s, 2), "diagnose_s": round(diagnose_s, 2),
           "attribution_s": round(d.timings_s.get("attribution", 0.0), 2)}
    shutil.rmtree(store, ignore_errors=True)
    return out


def run(data: str | Path | None = None, traces: list[str] | None = None, labels: tuple[bool, ...] = (True, False)):
    """One JSON record per trace and labelling, then a summary; yields them as they finish."""
    root = Path(data) if data is not None else DEFAULT_DATA
    pub_path = root / "published.json"
    if not pub_path.exists():
        raise ConfigError(f"{root}: no published.json (the public traces live in tests/data/stragglers of a "
                          f"checkout; give --data)")
    published = json.loads(pub_path.read_text())["traces"]
    names = traces or sorted(published)
    unknown = [n for n in names if n not in published]
    if unknown:
        raise ConfigError(f"unknown trace(s) {', '.join(unknown)}; {root} has {', '.join(sorted(published))}")
    tmp = Path(tempfile.mkdtemp(prefix="argus-bw-"))
    rows = []
    try:
        for name in names:
            for lab in labels:
                row = _one(root / f"trace-{name}.parquet", root / f"meta-{name}.yaml", published[name], lab, tmp)
                rows.append(row)
                yield row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = [r["S_ratio"] for r in rows if r["S_ratio"]]
    yield {"summary": True, "runs": len(rows), "root_cause_named": sum(r["root_cause_named"] for r in rows),
           "other_claims": sum(len(r["other_claims"]) for r in rows),
           "S_ratio_min": min(ratios) if ratios else None, "S_ratio_max": max(ratios) if ratios else None,
           "diagnose_s_max": max(r["diagnose_s"] for r in rows) if rows else None}
