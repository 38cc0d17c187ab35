"""``argus bench healthcheck``: how often ``argus healthcheck --quick`` fails this node when nothing
is wrong with it (issue 42: a check that fails healthy nodes is the one operators learn to ignore).

One baseline is taken (``--save-baseline``), then ``runs`` quick checks are judged against it, one
after another, each a fresh process as a Slurm prolog would run it. Per run: its exit code, wall
time and the figures that failed; then the false-fail rate (runs that failed, on a node assumed
healthy: say so if it is not) and which figures failed how often."""

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


def run(runs: int = 30, baseline_dir: str | None = None, timeout_s: float = 300.0, emit=print) -> dict:
    """Emit one JSON line per run and the summary (also returned)."""
    with tempfile.TemporaryDirectory(prefix="argus-hc-bench-") as tmp:
        base = Path(baseline_dir) if baseline_dir else Path(tmp)
        rc, wall, doc = _check(base, True, timeout_s)
        emit(json.dumps({"baseline": True, "rc": rc, "wall_s": round(wall, 2), "failed": _failed(doc) if rc else []}))
        per: Counter[str] = Counter()
        failed_runs, walls = 0, []
        for i in range(runs):
            rc, wall, doc = _check(base, False, timeout_s)
            failed = _failed(doc) if rc != 0 else []
            failed_runs += rc != 0
            walls.append(wall)
            per.update(failed)
            emit(json.dumps({"run": i + 1, "rc": rc, "wall_s": round(wall, 2), "failed": failed}))
    summary = {"summary": True, "runs": runs, "failed_runs": failed_runs,
               "false_fail_rate": round(failed_runs / runs, 4) if runs else None,
               "median_wall_s": round(sorted(walls)[len(walls) // 2], 2) if walls else None,
               "failed_figures": dict(per.most_common(20)),
               "note": "a node assumed healthy and quiet: every failed run is a false fail"}
    emit(json.dumps(summary))
    return summary
