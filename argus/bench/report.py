"""``argus bench report``: wall time and size of ``argus report`` on one store (10,240 ranks
by default), diagnosis included — what a person waits for after typing the command."""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path

__all__ = ["run"]


def run(store: str | None = None, out: str | None = None, ranks: int = 10240, steps: int = 10,
        scenario: str = "compute_straggler", seed: int = 0) -> dict:
    """Report ``store`` (or a freshly simulated job) into ``out`` (or a temp file); returns
    the figures: total wall time, its diagnosis and rendering parts, file bytes, peak RSS."""
    from argus.report import build_report
    from argus.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="argus-br-"))
    sim_s = None
    try:
        if store is None:
            from argus.sim import SimConfig, simulate_to_store

            store = str(tmp / "store")
            t0 = time.perf_counter()
            simulate_to_store(SimConfig(ranks=ranks, steps=steps, seed=seed), scenario, store, baseline=False)
            sim_s = round(time.perf_counter() - t0, 1)
        attempt = Store.open(store).attempt()
        target = Path(out) if out else tmp / "report.html"
        res = build_report(attempt, target)
        return {"bench": "report", "ranks": attempt.layout.world_size, "layout": str(attempt.layout),
                "scenario": attempt.meta.get("scenario"), "wall_s": round(res.wall_s, 2),
                "diagnosis_s": round(res.diagnosis_s, 2), "render_s": round(res.render_s, 2),
                "file_bytes": res.bytes, "file_mb": round(res.bytes / 1e6, 2), "incidents": res.incidents,
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "simulate_s": sim_s, "out": str(target) if out else None}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
