"""Running the real workloads of ``argus.workloads.stacks`` with and without Argus, for e2e tests."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from argus.workloads.affinity import usable_cpus

STEPS = 12
#: steps of ~50–150 ms on 2 cores: real steps take 0.1–10 s; 20 ms ones are all scheduler noise
MODEL = ["--d-model", "64", "--seq", "64", "--batch", "8"]
JOB_ENV = {"OMP_NUM_THREADS": "1", "ARGUS_OP_SAMPLE_EVERY": "4"}  # short jobs: CPU ops of one step in 4


def _one_cpu(nproc: int) -> int | None:
    cpus = usable_cpus()
    return cpus[-1] if cpus and nproc <= len(cpus) else None


def pin_cpu(nproc: int = 1) -> list[str]:
    """``--pin-cpu N`` (``argus.workloads``) for a job whose ranks could each own a vCPU, so that
    every rank trains on the same one. On these shared VMs a vCPU's speed for identical work
    varies up to 2× for seconds at a time, independently per vCPU and invisibly to the guest (no
    steal, no run-queue delay; ``docs/diagnosis.md``): two ranks on two vCPUs are two devices of
    different speeds — what Argus is there to report, and the reason a healthy 2-rank job got a
    compute straggler in 1 run of 4. Ranks sharing one vCPU (or more ranks than vCPUs) share its
    speed. The workload pins itself once it is set up, not from its start (``taskset``): six
    ranks' imports queued on one vCPU took 12 s of a netns test while the other idled. The
    default ``nproc`` 1 pins whatever the number of ranks (jobs of more ranks than vCPUs, whose
    ranks float otherwise)."""
    cpu = _one_cpu(nproc)
    return [] if cpu is None else ["--pin-cpu", str(cpu)]


def launcher(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def job(stack: str, out: Path, nproc: int, *extra: str) -> list[str]:
    return [*launcher(nproc), "-m", "argus.workloads.stacks", "--stack", stack, "--out", str(out), "--steps",
            str(STEPS), *MODEL, *pin_cpu(nproc), *extra]


def argus_run(store: Path, *argus_args: str) -> list[str]:
    return [sys.executable, "-m", "argus", "run", "--store", str(store), "--run-id", "e2e", *argus_args, "--"]


def env(**extra: str) -> dict:
    return {**os.environ, **JOB_ENV, **extra}


def run(cmd: list[str], timeout: float = 400, ok: bool = True, cache: Path | None = None,
        **extra_env: str) -> subprocess.CompletedProcess:
    """``cmd`` with the job environment and a cold inductor cache of its own: how long a
    compilation or a recompile stalls depends on the cache the runs before left, and a fault
    test means a cold one. ``cache``: this inductor cache instead (the one a run before warmed:
    dynamo traces, breaks and recompiles the same either way; only inductor's code generation
    is skipped)."""
    with tempfile.TemporaryDirectory(prefix="argus-inductor-") as cold:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=env(**{"TORCHINDUCTOR_CACHE_DIR": str(cache or cold), **extra_env}))
    if ok:
        assert done.returncode == 0, f"{' '.join(cmd[-12:])}\n{done.stderr[-4000:]}"
    return done


def results(out: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def diagnosis(store: Path, *flags: str) -> dict:
    """``argus diagnose STORE --json FLAGS``'s document, run in this process through the CLI's
    own ``main`` (a subprocess paid ~1 s of imports a call, ~25 calls in the serial tests)."""
    from argus.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["diagnose", str(store), "--json", *flags])
    assert rc == 0, err.getvalue()[-3000:]
    return json.loads(out.getvalue())


def diagnose(store: Path, keep: bool = False) -> list[dict]:
    """Incidents worth a person's attention (warning or critical); ``keep``: written into the
    store too (what ``argus verify`` reads)."""
    doc = diagnosis(store) if keep else diagnosis(store, "--no-store")
    _SHOWN[:] = [i for i in doc["incidents"] if i["severity"] not in ("warning", "critical")]
    return [i for i in doc["incidents"] if i["severity"] in ("warning", "critical")]


#: the last diagnosis's incidents below warning: a failed check prints them too (a fault found but
#: graded info is told apart from one not found at all)
_SHOWN: list[dict] = []


def _headline(i: dict) -> str:
    return (f"{i['class']} {i['severity']} ranks {i['culprit_ranks']} steps {i['window']['start_step']}-"
            f"{i['window']['end_step']} {i['impact']}: {i['summary']}")


def none(incidents: list[dict]) -> None:
    """No incident worth attention; else every headline (shown ones too), then the records."""
    assert not incidents, ("\n".join(map(_headline, incidents)) + "\n"
                           + "\n".join("(shown) " + _headline(i) for i in _SHOWN) + "\n"
                           + json.dumps(incidents, indent=1)[:4000])


def only(incidents: list[dict]) -> dict:
    """The one incident; else every incident's headline first (CI prints only the message's
    start), then the records."""
    heads = "\n".join(map(_headline, incidents))
    shown = "\n".join("(shown) " + _headline(i) for i in _SHOWN)
    assert len(incidents) == 1, heads + "\n" + shown + "\n" + json.dumps(incidents, indent=1)[:4000]
    return incidents[0]


def processor_status(store: Path) -> dict:
    (doc,) = [json.loads(p.read_text()) for p in (store / "processors").glob("*.json")]
    return doc
