"""``argus bench analysis``: the full diagnosis (L1–L3, root cause, attribution, L4, L5) over one
window of a large simulated job.

A store is simulated once (or given with ``--store``); the diagnosis then runs in a fresh
process so its peak RSS is its own. Reported: wall time per level, the process's CPU-seconds
(wall time on a shared machine measures the neighbours too), peak memory, whether the incident
names the injected culprits, what the attribution measured (the what-if, or why it was skipped)
and how well its replay reproduced the window.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from argus.errors import ConfigError

__all__ = ["run", "diagnose_window"]


def diagnose_window(store: str, lo: int, hi: int) -> dict:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.store import Store

    attempt = Store.open(store).attempt()
    t0, c0 = time.perf_counter(), time.process_time()
    d = diagnose(attempt, DiagnoseConfig(steps=(lo, hi), store_incidents=False))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    truth_path = Path(store) / "truth.json"
    found = None
    if truth_path.exists():
        truth = json.loads(truth_path.read_text())
        culprits = {r for f in truth["faults"] for r in f["culprit_ranks"]}
        claimed = {r for i in d.incidents if i.severity != "info" for r in i.culprit_ranks}
        found = bool(culprits) and claimed == culprits
    l4 = []
    for i in d.incidents:
        for e in i.evidence:
            if e.get("kind") == "what_if":
                l4.append({"what_if_slowdown_pct": e["slowdown_pct"], "replayed_steps": e["steps"],
                           "replay_error_pct": e["replay_error_pct"]})
            elif e.get("kind") == "what_if_skipped":
                l4.append({"what_if_skipped": e["note"][:120]})
            elif e.get("kind") in ("pipeline", "gpu_idle", "stacks", "agreement"):
                l4.append({e["kind"]: e.get("origin_rank", e.get("with", e.get("cause", e.get("idle_pct"))))})
    order = ("l1", "l2", "l3", "windows", "rootcause", "attribution", "l4", "l5", "l4_l5", "observations", "total")
    levels = {k: round(d.timings_s[k], 2) for k in order if k in d.timings_s}
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "levels_s": levels,
            "incidents": [f"{i.klass}:{len(i.culprit_ranks)}" for i in d.incidents], "culprits_found": found,
            "l4_l5": l4, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def run(ranks: int = 10240, steps: int = 10, window: tuple[int, int] = (5, 9), store: str | None = None,
        scenario: str = "compute_straggler", seed: int = 0) -> dict:
    from argus.sim import SimConfig, simulate_to_store

    tmp = None
    sim_s = None
    if store is None:
        tmp = Path(tempfile.mkdtemp(prefix="argus-ba-"))
        store = str(tmp / "store")
        t0 = time.perf_counter()
        simulate_to_store(SimConfig(ranks=ranks, steps=steps, seed=seed), scenario, store, baseline=False)
        sim_s = round(time.perf_counter() - t0, 1)
    backfill_s = None
    if tmp is None:  # a store written before phases files had their totals beside them: written now, timed apart
        from argus.store import Store
        from argus.store.phase_totals import backfill

        t0 = time.perf_counter()
        if backfill(Store.open(store).attempt()):
            backfill_s = round(time.perf_counter() - t0, 1)
    try:
        code = ("import json; from argus.bench.analysis import diagnose_window; "
                f"print(json.dumps(diagnose_window({store!r}, {window[0]}, {window[1]})))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode != 0:
            raise ConfigError(f"analysis benchmark failed:\n{out.stderr.strip()[-2000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        from argus.store import Store

        attempt = Store.open(store).attempt()
        rows = attempt.sql(f"SELECT count(*) AS n FROM phases WHERE step BETWEEN {window[0]} AND {window[1]}")
        return {"bench": "analysis", "ranks": attempt.layout.world_size, "layout": str(attempt.layout),
                "scenario": attempt.meta.get("scenario"), "window_steps": [window[0], window[1]],
                "phase_rows_in_window": rows.column("n")[0].as_py(), "simulate_s": sim_s,
                "phase_totals_backfill_s": backfill_s, **result}
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
