"""Healthy jobs checked at every step by every correctness sensor: how many checks, how many
false findings (the answer must be none).

Runs real gloo jobs of ``argus.workloads.stacks`` under ``argus run`` with
``ARGUS_SDC_EVERY=1 ARGUS_SDC_GEMMS=-1`` — DDP, activation checkpointing, a pipeline (pp=2 × dp=2),
forked DataLoader workers — then counts the ``checks`` rows and the ``silent_data_corruption``
incidents of ``argus diagnose``. Prints one JSON line per job and a total.

    python scripts/sdc_soak.py --steps 800
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

JOBS = [("ddp", 4, []), ("checkpoint", 4, []), ("pipeline", 4, ["--layout", "pp=2,dp=2"]),
        ("dataloader", 2, [])]
MODEL = ["--d-model", "64", "--seq", "64", "--batch", "8"]


def soak(stack: str, nproc: int, argus_args: list[str], steps: int) -> dict:
    from argus.store import Store

    with tempfile.TemporaryDirectory(prefix="argus-sdc-soak-") as tmp:
        store, out = Path(tmp) / "store", Path(tmp) / "out"
        out.mkdir()
        cmd = [sys.executable, "-m", "argus", "run", "--store", str(store), "--run-id", "soak", *argus_args, "--",
               sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "argus.workloads.stacks", "--stack", stack, "--out", str(out), "--steps", str(steps), *MODEL]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ARGUS_SDC_EVERY": "1", "ARGUS_SDC_GEMMS": "-1",
               "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0:
            raise SystemExit(f"{stack}: the job failed ({done.returncode}): {done.stderr[-2000:]}")
        checks = Store.open(store).attempt("soak").read("checks", columns=["sensor", "violations"]).to_pylist()
        diag = subprocess.run([sys.executable, "-m", "argus", "diagnose", str(store), "--json", "--no-store"],
                              capture_output=True, text=True, timeout=1800)
        if diag.returncode != 0:
            raise SystemExit(f"{stack}: diagnose failed: {diag.stderr[-2000:]}")
        found = [i for i in json.loads(diag.stdout)["incidents"] if i["class"] == "silent_data_corruption"]
    return {"stack": stack, "ranks": nproc, "steps": steps, "rank_steps": nproc * steps,
            "digests": sum(c["sensor"] != "gemm" for c in checks),
            "gemm_checks": sum(c["sensor"] == "gemm" for c in checks),
            "gemm_violations": sum(c["violations"] for c in checks if c["sensor"] == "gemm"),
            "sdc_incidents": len(found)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--stacks", default=",".join(s for s, _, _ in JOBS), help="comma list")
    a = p.parse_args()
    chosen = set(a.stacks.split(","))
    rows = [soak(s, n, extra, a.steps) for s, n, extra in JOBS if s in chosen]
    for row in rows:
        print(json.dumps(row), flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("rank_steps", "digests", "gemm_checks", "gemm_violations",
                                                    "sdc_incidents")}
    print(json.dumps({"total": total}))
    return 1 if total["sdc_incidents"] or total["gemm_violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
