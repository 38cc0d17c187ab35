"""Faults injected into a real PyTorch Profiler trace: detectors meet a real kernel mix and real noise.

The simulator's kernels and noise are Argus's own idea of a job. This bench starts from a
real trace instead (by default the 2-rank DDP ResNet job of ``tests/data/kineto``: ~900
kernels per step — cuDNN, CUTLASS, element-wise — and NCCL all-reduces overlapping the
backward) and builds an N-rank data-parallel job from it: rank *r*'s step *k* is the real
step ``(k + r) mod S``, so ranks differ exactly as the real job's steps did. A fault is then
injected *consistently*:

* **compute straggler** — rank *c*'s compute kernels from the onset take ``factor``× longer;
  everything after a slowed kernel on its GPU moves later, so its collectives *arrive*
  later; each collective ends on every rank when the last member has arrived plus the
  transfer (the shortest real duration of that collective), so the peers' collectives
  *wait* longer; every rank's step ends together (DDP's last all-reduce synchronises them).
* **healthy** — the same job without a fault: real step-to-step variation only.

The traces are written as per-rank Kineto JSON, imported with ``argus ingest kineto``'s
importer, diagnosed and scored like the simulated suites.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFAULT_TRACE", "FACTORS", "RealTraceJob", "RealTraceScore", "load_real_steps", "write_job", "run_real_trace",
           "real_trace_jobs", "score_real_trace", "summarize_real_traces"]

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "tests" / "data" / "kineto" / "ddp_nccl_rank-0.json.gz"
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")


@dataclass
class _Step:
    """One real profiler step: its events with times relative to the step's CPU start (µs)."""

    cpu: list[dict]  # CPU-side events (annotations, ops, runtime calls), ProfilerStep excluded
    gpu: list[dict]  # device events launched in this step
    length: float  # the ProfilerStep span


def load_real_steps(path: Path = DEFAULT_TRACE) -> tuple[list[_Step], dict]:
    """The trace's profiler steps (device events assigned by their launch's correlation) and
    its top-level metadata."""
    with gzip.open(path) if str(path).endswith(".gz") else open(path, "rb") as fh:
        doc = json.load(fh)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep")), key=lambda e: e["ts"])
    if not steps:
        raise ValueError(f"{path}: no ProfilerStep#N spans to build steps from")
    starts = np.array([float(s["ts"]) for s in steps])
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in events
              if e.get("cat") == "cuda_runtime" and isinstance((e.get("args") or {}).get("correlation"), int)}
    out = [_Step([], [], float(s["dur"])) for s in steps]
    for e in events:
        if str(e.get("name", "")).startswith("ProfilerStep"):
            continue
        device = e.get("cat") in _DEVICE_CATS
        anchor = launch.get((e.get("args") or {}).get("correlation"), float(e["ts"])) if device else float(e["ts"])
        i = int(np.searchsorted(starts, anchor, side="right")) - 1
        if i < 0 or (not device and anchor > starts[i] + out[i].length):
            continue
        rel = dict(e, ts=float(e["ts"]) - starts[i])
        (out[i].gpu if device else out[i].cpu).append(rel)
    for s in out:
        s.gpu.sort(key=lambda e: e["ts"])
    meta = {k: v for k, v in doc.items() if k not in ("traceEvents", "distributedInfo")}
    return out, meta


def _is_collective(e: dict) -> bool:
    return e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()


@dataclass(frozen=True)
class RealTraceJob:
    ranks: int = 8
    steps: int = 12
    culprit: int | None = None  # None: healthy
    factor: float = 1.0
    onset: int = 4


def _slow(gpu: list[dict], factor: float) -> list[dict]:
    """A slower GPU: compute kernels ``factor``× longer, every later device event moved by the
    extra so far (one compute stream: work runs in launch order), GPU annotation spans
    stretched over the kernels they hold."""
    ends, extras, out, extra = [], [], [], 0.0
    for e in gpu:
        if e.get("cat") == "kernel" and not _is_collective(e):
            extra += float(e.get("dur", 0.0)) * (factor - 1.0)
            ends.append(e["ts"] + float(e.get("dur", 0.0)))
            extras.append(extra)
    ends_a, extras_a = np.array(ends), np.array(extras)

    def moved(t: float) -> float:  # the extra of every compute kernel that ended by t
        i = int(np.searchsorted(ends_a, t, side="right"))
        return t + (float(extras_a[i - 1]) if i else 0.0)

    for e in gpu:
        start, dur = float(e["ts"]), float(e.get("dur", 0.0))
        if e.get("cat") == "kernel" and not _is_collective(e):
            new = moved(start)
            out.append(dict(e, ts=new, dur=dur * factor))
        else:
            new = moved(start)
            out.append(dict(e, ts=new, dur=max(moved(start + dur) - new, 0.0)))
    return out


_ID_STRIDE = 10_000_000  # a real step reused as step k gets its launch and annotation ids moved by k·this
_ID_ARGS = ("correlation", "External id", "external id")


def _placed(e: dict, t0: float, k: int) -> dict:
    """An event of a reused real step, placed at ``t0`` as step ``k``: ids that tie kernels to
    their launches and GPU spans to CPU spans stay unique per step."""
    out = dict(e, ts=t0 + e["ts"])
    args = e.get("args")
    if isinstance(args, dict) and any(a in args for a in _ID_ARGS):
        out["args"] = {a: (v + k * _ID_STRIDE if a in _ID_ARGS and isinstance(v, int) else v) for a, v in args.items()}
    return out


def write_job(job: RealTraceJob, out: Path, trace: Path = DEFAULT_TRACE) -> dict:
    """Write ``job.ranks`` Kineto traces into ``out``; returns the truth (culprit, steps, cost)."""
    real, meta = load_real_steps(trace)
    S = len(real)
    per_rank: list[list[dict]] = [[] for _ in range(job.ranks)]
    t0 = 1_000_000.0
    step_times, base_times = [], []
    for k in range(job.steps):
        chosen = [real[(k + r) % S] for r in range(job.ranks)]
        faulty = job.culprit is not None and k >= job.onset
        gpus = [_slow(s.gpu, job.factor) if faulty and r == job.culprit else [dict(e) for e in s.gpu]
                for r, s in enumerate(chosen)]
        colls = [[e for e in g if _is_collective(e)] for g in gpus]
        n_coll = min(len(c) for c in colls)
        last_end = [c[n_coll - 1]["ts"] + float(c[n_coll - 1].get("dur", 0.0)) if n_coll else 0.0 for c in colls]
        real_coll = [[e for e in s_.gpu if _is_collective(e)] for s_ in chosen]
        for j in range(n_coll):
            # the collective ends everywhere once its last member arrived, plus the transfer
            done = max(c[j]["ts"] for c in colls) + min(float(rc[j].get("dur", 0.0)) for rc in real_coll)
            for c in colls:
                c[j]["dur"] = done - c[j]["ts"]
        # each collective's GPU annotation spans its kernel (the phase Argus reads is the kernel's time)
        for g, c in zip(gpus, colls):
            spans = [e for e in g if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("nccl:")]
            for a, kern in zip(spans, c):
                a["ts"], a["dur"] = kern["ts"], kern["dur"]
        # work after the last collective waits for it (the optimizer needs the reduced gradients)
        delay = [max(0.0, c[n_coll - 1]["ts"] + c[n_coll - 1]["dur"] - e) if n_coll else 0.0
                 for c, e in zip(colls, last_end)]
        for r, g in enumerate(gpus):
            for e in g:
                if not _is_collective(e) and n_coll and e["ts"] >= last_end[r] and not (
                        e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("nccl:")):
                    e["ts"] += delay[r]
        # the step ends together: after every rank's own work
        own = [max([s.length] + [e["ts"] + float(e.get("dur", 0.0)) for e in g]) for s, g in zip(chosen, gpus)]
        length = float(max(own))
        step_times.append(length)
        base_times.append(max(s.length for s in chosen))
        for r in range(job.ranks):
            per_rank[r] += [_placed(e, t0, k) for e in chosen[r].cpu]
            per_rank[r] += [_placed(e, t0, k) for e in gpus[r]]
            per_rank[r].append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": t0,
                                "dur": length, "pid": 1, "tid": 1})
        t0 += length + 50.0
    out.mkdir(parents=True, exist_ok=True)
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": job.ranks,
               "ranks": list(range(job.ranks))}]
    for r, evs in enumerate(per_rank):
        doc = {**meta, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": job.ranks, "pg_count": 1,
                                           "pg_config": groups},
               "traceEvents": evs}
        (out / f"rank-{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    faulty_steps = list(range(job.onset, job.steps)) if job.culprit is not None else []
    healthy = [b for k, b in enumerate(base_times) if k not in faulty_steps]
    hit = [t for k, t in enumerate(step_times) if k in faulty_steps]
    cost = 100.0 * (float(np.mean(hit)) / float(np.mean(healthy)) - 1.0) if hit and healthy else 0.0
    return {"faults": [{"class": "compute_straggler", "culprit_ranks": [job.culprit], "steps": faulty_steps,
                        "window": {"start_step": job.onset, "end_step": job.steps - 1}}] if job.culprit is not None
            else [], "cost_pct": cost, "real_steps": S}


def run_real_trace(job: RealTraceJob, trace: Path = DEFAULT_TRACE, workdir: Path | None = None) -> tuple[dict, Any]:
    """Write, import and diagnose one job; returns (truth, RunScore)."""
    import time

    from argus.analysis import DiagnoseConfig, diagnose
    from argus.bench.accuracy import score
    from argus.kineto.importer import import_kineto
    from argus.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="argus-realtrace-", dir=workdir))
    try:
        t = time.perf_counter()
        truth = write_job(job, tmp / "traces", trace)
        import_kineto([tmp / "traces"], tmp / "s", run_id="real")
        t1 = time.perf_counter()
        d = diagnose(Store.open(tmp / "s").attempt(), DiagnoseConfig(store_incidents=False))
        t2 = time.perf_counter()
        name = "healthy" if job.culprit is None else "compute_straggler"
        return truth, score(name, job.ranks, job.culprit or 0, truth, d, t1 - t, t2 - t1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: Compute slowdowns injected, from near the detection limit up.
FACTORS = (1.25, 1.5, 2.0, 3.0)
SIZES = (4, 8, 16)


def real_trace_jobs(sizes: tuple[int, ...] = SIZES) -> list[RealTraceJob]:
    """Per size: the healthy job and one straggler per factor (culprit ranks spread over the job)."""
    jobs = []
    for n in sizes:
        jobs.append(RealTraceJob(ranks=n))
        jobs += [RealTraceJob(ranks=n, culprit=(3 * i + n // 2) % n, factor=f) for i, f in enumerate(FACTORS)]
    return jobs


@dataclass
class RealTraceScore:
    job: RealTraceJob
    cost_pct: float
    score: Any  # accuracy.RunScore

    def to_json(self) -> dict:
        return {"bench": "accuracy-real-trace", "ranks": self.job.ranks, "culprit": self.job.culprit,
                "factor": self.job.factor, "cost_pct": round(self.cost_pct, 2), **self.score.to_json()}


def score_real_trace(job: RealTraceJob) -> RealTraceScore:
    truth, s = run_real_trace(job)
    return RealTraceScore(job, float(truth["cost_pct"]), s)


def summarize_real_traces(scores: list[RealTraceScore], cost_floor_pct: float = 5.0) -> list[dict]:
    """The healthy jobs' false-incident rate; per factor, the measured cost and P/R/class; the
    goal's figures over the faults costing at least ``cost_floor_pct``."""
    def mean(xs: list) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(float(np.mean(xs)), 4) if xs else None

    healthy = [s for s in scores if s.job.culprit is None]
    faulty = [s for s in scores if s.job.culprit is not None]
    rows = [{"bench": "accuracy-real-trace", "scenario": "healthy", "runs": len(healthy),
             "false_incident_rate": mean([float(s.score.false_incident) for s in healthy])}]
    for f in sorted({s.job.factor for s in faulty}):
        at = [s for s in faulty if s.job.factor == f]
        rows.append({"bench": "accuracy-real-trace", "scenario": "compute_straggler", "factor": f, "runs": len(at),
                     "cost_pct_median": round(float(np.median([s.cost_pct for s in at])), 2),
                     "precision": mean([s.score.precision for s in at]), "recall": mean([s.score.recall for s in at]),
                     "class_accuracy": mean([float(bool(s.score.class_ok)) for s in at])})
    costly = [s for s in faulty if s.cost_pct >= cost_floor_pct]
    rows.append({"bench": "accuracy-real-trace", "scenario": "compute_straggler", "costly_runs": len(costly),
                 "cost_floor_pct": cost_floor_pct, "precision": mean([s.score.precision for s in costly]),
                 "recall": mean([s.score.recall for s in costly]),
                 "class_accuracy": mean([float(bool(s.score.class_ok)) for s in costly])})
    return rows
