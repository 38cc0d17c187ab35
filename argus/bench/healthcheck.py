"""``argus bench healthcheck``: how often ``argus healthcheck --quick`` fails this node when nothing
is wrong with it (issue 42: a check that fails healthy nodes is the one operators learn to ignore).

One baseline is taken (``--save-baseline``), then ``runs`` quick checks are judged against it, one
after another, each a fresh process as a Slurm prolog would run it. Per run: its exit code, wall
time and the figures that failed; then the false-fail rate (runs that failed, on a node assumed
healthy: say so if it is not) and which figures failed how often. ``load``: one process spins on
a CPU beside every run after the baseline — each run should then say the node is loaded (exit
3) or pass, never fail it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

__all__ = ["run"]


def _check(baseline: Path, save: bool, timeout_s: float) -> tuple[int, float, dict | None]:
    cmd = [sys.executable, "-m", "argus", "healthcheck", "--quick", "--json", "--baseline-dir", str(baseline)]
    if save:
        cmd.append("--save-baseline")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = None
    return done.returncode, wall, doc


def _failed(doc: dict | None) -> list[str]:
    if doc is None:
        return ["(no report)"]
    return [f"{v['metric']} {v['subject']}{' ' + str(v['size_bytes']) + ' B' if v.get('size_bytes') else ''}"
            for v in doc.get("verdicts", []) if v.get("status") == "fail"]


def _why(doc: dict | None) -> list[str]:
    return [str(v.get("why", ""))[:300] for v in (doc or {}).get("verdicts", []) if v.get("status") == "fail"]


def run(runs: int = 30, baseline_dir: str | None = None, timeout_s: float = 300.0, emit=print,
        load: bool = False) -> dict:
    """Emit one JSON line per run and the summary (also returned)."""
    from argus.cli.healthcheck import EXIT_LOADED

    spinner = None
    with tempfile.TemporaryDirectory(prefix="argus-hc-bench-") as tmp:
        base = Path(baseline_dir) if baseline_dir else Path(tmp)
        rc, wall, doc = _check(base, True, timeout_s)
        emit(json.dumps({"baseline": True, "rc": rc, "wall_s": round(wall, 2), "failed": _failed(doc) if rc else []}))
        per: Counter[str] = Counter()
        failed_runs = loaded_runs = 0
        walls: list[float] = []
        try:
            if load:
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for i in range(runs):
                rc, wall, doc = _check(base, False, timeout_s)
                failed = _failed(doc) if rc != 0 else []
                failed_runs += rc not in (0, EXIT_LOADED)
                loaded_runs += rc == EXIT_LOADED
                walls.append(wall)
                per.update(failed)
                share = (doc or {}).get("load") or {}
                emit(json.dumps({"run": i + 1, "rc": rc, "wall_s": round(wall, 2), "failed": failed,
                                 **({"why": _why(doc)} if failed else {}),
                                 "others_cpu_share": share.get("others_cpu_share"),
                                 "remeasured": len((doc or {}).get("remeasured") or [])}))
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    summary = {"summary": True, "runs": runs, "load": load, "failed_runs": failed_runs, "loaded_runs": loaded_runs,
               "false_fail_rate": round(failed_runs / runs, 4) if runs else None,
               "median_wall_s": round(sorted(walls)[len(walls) // 2], 2) if walls else None,
               "failed_figures": dict(per.most_common(20)),
               "note": ("one process spinning beside every run: a failed run (exit 1) is a false fail, a loaded one "
                        "(exit 3) the answer wanted" if load else
                        "a node assumed healthy and quiet: every failed run is a false fail")}
    emit(json.dumps(summary))
    return summary
