"""``argus demo``: the main job — real training with a real fault, traced and diagnosed.

A small transformer trains with ``torch.distributed`` (gloo, CPU) on several processes under
``argus run`` (producer injected, processor and store embedded); one rank gets a fault:

* ``compute`` (default): rank 1's attention does the same work ``--slowdown`` times over,
  from step 8 — a slow GPU;
* ``stall``: a 400 ms host-side stall in one microbatch's backward every third step;
* ``link``: one network namespace per rank, a two-stage pipeline, and rank 4's link limited
  to 20 Mbit/s with ``tc tbf`` (needs root and iproute2);
* ``none``: healthy; nothing should be reported.

Then ``argus diagnose`` runs on the store and its JSON is written next to it (the report).
``--simulated SCENARIO`` runs the simulator instead (no PyTorch needed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from argus import env as argus_env
from argus.cli.progress import progress_bar, stderr_console

__all__ = ["register"]

FAULTS = ("compute", "stall", "link", "none")
#: One intra-op thread per rank (ranks share the cores); CPU ops of one step in 5: a short job
#: needs kernel evidence in most windows (the always-on default is one in 50).
JOB_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", argus_env.OP_SAMPLE_EVERY: "5"}


def register(sub: argparse._SubParsersAction) -> None:
    from argus.sim import SCENARIOS

    p = sub.add_parser("demo", help="the main job: real distributed training with a fault, traced and diagnosed",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="store directory (default: ./argus-demo/run-<time>)")
    p.add_argument("--fault", choices=FAULTS, default="compute", help="fault to inject (default compute)")
    p.add_argument("--ranks", type=int, default=4, help="processes (default 4; the link fault uses 6)")
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--fault-rank", type=int, default=1, help="rank that gets the fault (default 1; link: 4)")
    p.add_argument("--slowdown", type=int, default=6, help="compute fault: attention work multiplier (default 6)")
    p.add_argument("--simulated", metavar="SCENARIO", choices=list(SCENARIOS),
                   help="simulate this scenario on 64 ranks instead of training (no PyTorch needed)")
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else Path("argus-demo") / time.strftime("run-%Y%m%d-%H%M%S")
    err = stderr_console()
    if args.simulated:
        return _simulated(args.simulated, out, args.steps)
    try:
        import torch  # noqa: F401
    except ImportError:
        err.print("argus demo: the real demo trains with PyTorch, which is not installed "
                  "(pip install 'argus-trace[torch]'); running the simulated demo instead")
        return _simulated("compute_straggler", out, args.steps)
    if args.steps < 15:
        err.print("argus demo: use at least 15 steps (the fault starts at step 8 and needs a few steps to show)")
        return 2
    if args.fault == "link":
        code = _train_link(args, out)
    else:
        if args.ranks < 3:
            err.print("argus demo: use at least 3 ranks (a rank is compared with its peers)")
            return 2
        if not 0 <= args.fault_rank < args.ranks:
            err.print(f"argus demo: --fault-rank {args.fault_rank} is not a rank of {args.ranks}")
            return 2
        code = _train_local(args, out)
    if code != 0:
        err.print(f"argus demo: training failed (exit code {code}); nothing to diagnose")
        return code
    return _diagnose(out)


def _job_args(args: argparse.Namespace, fault: str, fault_rank: int) -> list[str]:
    job = ["--steps", str(args.steps), "--microbatches", "2", "--progress", "--fault", fault,
           "--fault-rank", str(fault_rank), "--fault-start", "8", "--slowdown", str(args.slowdown)]
    if fault == "stall":
        job[job.index("--fault-start") + 1] = "6"
    return job


def _train_local(args: argparse.Namespace, out: Path) -> int:
    err = stderr_console()
    what = {"compute": f"a {args.slowdown}× slower attention on rank {args.fault_rank} from step 8",
            "stall": f"a 400 ms host stall on rank {args.fault_rank} every third step from step 6",
            "none": "no fault"}[args.fault]
    err.print(f"argus demo: training a transformer on {args.ranks} processes (torch.distributed, gloo, CPU) "
              f"with {what} → {out}")
    cmd = [sys.executable, "-m", "argus", "run", "--store", str(out), "--run-id", "demo", "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ranks}",
           "-m", "argus.workloads.train_transformer", *_job_args(args, args.fault, args.fault_rank)]
    return _follow(cmd, args.steps)


def _follow(cmd: list[str], steps: int, **popen: Any) -> int:
    """Run the job, advancing a progress bar on rank 0's ``{"step": n}`` lines."""
    env = {**os.environ, **JOB_ENV}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **popen)
    tail: list[str] = []
    with progress_bar("training", steps) as advance:
        import threading

        def drain_stderr() -> None:
            for line in proc.stderr:  # type: ignore[union-attr]
                tail.append(line)
                del tail[:-40]

        reader = threading.Thread(target=drain_stderr, daemon=True)
        reader.start()
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith('{"step"'):
                advance()
        code = proc.wait()
        reader.join(5)
    if code != 0:
        sys.stderr.write("".join(tail[-20:]))
    return code


def _train_link(args: argparse.Namespace, out: Path) -> int:
    from argus.workloads.netns import NamespaceCluster, available, cleanup_stale

    err = stderr_console()
    why = available()
    if why is not None:
        err.print(f"argus demo: the link fault builds network namespaces, but {why}; "
                  "try --fault compute or --fault stall")
        return 2
    hosts, slow = 6, 4
    err.print(f"argus demo: a two-stage pipeline on {hosts} hosts (one network namespace each, gloo), host {slow}'s "
              f"link limited to 20 Mbit/s with tc tbf → {out}")
    cleanup_stale()
    with NamespaceCluster(hosts) as cluster:
        cluster.throttle(slow, rate="20mbit", burst="32kbit", latency="400ms")
        procs = []
        port = 29000 + os.getpid() % 1000
        for rank in range(hosts):
            env = {"RANK": str(rank), "WORLD_SIZE": str(hosts), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "MASTER_ADDR": cluster.ip(0), "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": cluster.ifname(rank),
                   argus_env.HOST: cluster.host_name(rank), **JOB_ENV}
            cmd = [sys.executable, "-m", "argus", "run", "--store", str(out), "--run-id", "demo", "--layout",
                   "pp=2,dp=3", "--", sys.executable, "-m", "argus.workloads.train_transformer", "--mode", "pipeline",
                   "--d-model", "64", "--layers", "1", "--vocab", "256", *_job_args(args, "none", 0)]
            procs.append(cluster.run(rank, cmd, env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True))
        with progress_bar("training", args.steps) as advance:
            for line in procs[0].stdout:  # type: ignore[union-attr]
                if line.startswith('{"step"'):
                    advance()
        codes = [p.wait(timeout=600) for p in procs]
    return next((c for c in codes if c != 0), 0)


def _diagnose(out: Path) -> int:
    from argus.analysis import diagnose
    from argus.cli.diagnose import print_diagnosis
    from argus.cli.info import print_store_summary
    from argus.store import Store

    print_store_summary(out)
    print()
    diagnosis = diagnose(Store.open(out).attempt())
    print_diagnosis(diagnosis)
    from argus.report import build_report

    report = out / "report.json"
    report.write_text(json.dumps(diagnosis.document(), indent=2, default=str))
    html = build_report(diagnosis.attempt, out / "report.html", diagnosis)
    print(f"\nreport: {html.path}  (open it in a browser; {report} has the JSON)\nstore: {out}   "
          f"(argus diagnose {out} --json · argus serve {out})")
    return 0


def _simulated(scenario: str, out: Path, steps: int) -> int:
    from argus.sim import SimConfig, simulate_to_store

    err = stderr_console()
    config = SimConfig(ranks=64, steps=steps)
    err.print(f"argus demo: simulating '{scenario}' on {config.ranks} ranks × {config.steps} steps → {out}")
    with progress_bar("simulating", config.steps) as advance:
        result = simulate_to_store(config, scenario, out, on_step=lambda rec: advance())
    err.print(f"wrote {result.bytes_written / 1e6:.1f} MB ({result.phase_events:,} phase events) in {result.wall_s:.1f} s\n")
    return _diagnose(out)
