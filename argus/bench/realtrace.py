"""Faults injected into real PyTorch Profiler traces: detectors meet a real kernel mix and real noise.

The simulator's kernels and noise are Argus's own idea of a job. This bench starts from real
traces instead and builds an N-rank data-parallel job from them. Two bases:

* ``ddp`` — the 2-rank DDP ResNet job of ``tests/data/kineto`` (rank 0's three profiled steps:
  ~900 kernels per step — cuDNN, CUTLASS, element-wise — and NCCL all-reduces overlapping the
  backward): rank *r*'s step *k* is the real step ``(k + r) mod S``;
* ``dlrm`` — all 8 ranks of a real DLRM job (V100, NCCL all-reduces and all-to-alls on their
  own streams, one profiled step each): rank *r* is real rank ``r mod 8``, whose ranks differ
  as a real job's do (NCCL time 1.7–11.3 ms of a 12.5–19.9 ms step).

A fault is then injected *consistently*:

* **compute** — rank *c*'s compute kernels from the onset take ``factor``× longer; everything
  after a slowed kernel on its GPU moves later, so its collectives *arrive* later; each
  collective (the *j*-th launch of one NCCL kernel in the step, on every rank) ends on every
  rank when its last member has arrived plus the transfer (the shortest real duration), so the
  peers' collectives *wait* longer; every rank's step ends together;
* **host** — the same on every rank of one host (``GPUS_PER_HOST`` ranks): case 5, their
  collectives look *short* because the others wait for them;
* **stall** — rank *c*'s host stops for ``stall_ms`` inside its forward in every third step from
  the onset (a collection, a recompile): its later CPU and device work moves by that much, the
  others wait in the next collective; its kernels are normal;
* **healthy** — the same job without a fault: real variation only.

A slow communicator cannot be injected into these bases: each has one (the world), which every
rank crosses alike. The traces are written as per-rank Kineto JSON, imported with ``argus
ingest kineto``'s importer, diagnosed and scored like the simulated suites, per family.
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

__all__ = ["BASES", "DEFAULT_TRACE", "FACTORS", "GPUS_PER_HOST", "RealTraceJob", "RealTraceScore", "load_real_steps",
           "load_base", "write_job", "run_real_trace", "real_trace_jobs", "score_real_trace", "summarize_real_traces"]

_DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "kineto"
DEFAULT_TRACE = _DATA / "ddp_nccl_rank-0.json.gz"
#: Real bases: one trace (its steps reused across ranks) or a directory of one job's ranks.
BASES = {"ddp": DEFAULT_TRACE, "dlrm": _DATA / "dlrm_8ranks"}
#: Ranks per host in the jobs written (the ``host`` fault slows one host's).
GPUS_PER_HOST = 2
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
    meta["_rank"] = (doc.get("distributedInfo") or {}).get("rank", 0)
    return out, meta


def load_base(base: str | Path) -> tuple[list[list[_Step]], dict]:
    """A base's real ranks (each a list of its profiler steps, by ``distributedInfo.rank``) and
    the first one's top-level metadata."""
    path = BASES.get(str(base), Path(base))
    files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"{path}: no Kineto traces")
    loaded = sorted((load_real_steps(f) for f in files), key=lambda sm: int(sm[1]["_rank"] or 0))
    meta = {k: v for k, v in loaded[0][1].items() if k != "_rank"}
    return [steps for steps, _ in loaded], meta


def _is_collective(e: dict) -> bool:
    return e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()


@dataclass(frozen=True)
class RealTraceJob:
    ranks: int = 8
    steps: int = 12
    culprit: int | None = None  # None: healthy; "host": the first rank of the host
    factor: float = 1.0
    onset: int = 4
    kind: str = "compute"  # compute | host | stall
    base: str = "ddp"  # a key of BASES
    stall_ms: float = 0.0

    @property
    def culprits(self) -> list[int]:
        if self.culprit is None:
            return []
        if self.kind == "host":
            first = self.culprit - self.culprit % GPUS_PER_HOST
            return list(range(first, min(first + GPUS_PER_HOST, self.ranks)))
        return [self.culprit]

    @property
    def family(self) -> str:
        return "healthy" if self.culprit is None else {"compute": "compute_straggler", "host": "masked_compute",
                                                       "stall": "host_stall"}[self.kind]


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


class _Shift:
    """A rank's device timeline pushed later: piecewise constant, non-decreasing in time. After
    a collective ends later than it did, everything the rank runs after it waits (the step's
    later work needs its result): the shift from its old end on is at least the delay."""

    def __init__(self) -> None:
        self.at: list[float] = []
        self.by: list[float] = []

    def __call__(self, t: float) -> float:
        i = int(np.searchsorted(self.at, t, side="right"))
        return self.by[i - 1] if i else 0.0

    def raise_from(self, t: float, value: float) -> None:
        if value <= self(t):
            return
        i = int(np.searchsorted(self.at, t, side="right"))
        self.at.insert(i, t)
        self.by.insert(i, value)
        for k in range(i + 1, len(self.by)):  # non-decreasing
            self.by[k] = max(self.by[k], value)


def _stall(cpu: list[dict], gpu: list[dict], ms: float) -> tuple[list[dict], list[dict], float]:
    """The host stops for ``ms`` inside the forward (a collection, a recompile): every CPU event
    after that instant starts later and every range around it lasts longer; device work
    launched after it starts later. Returns the events and the stall's instant (µs)."""
    fwd = [e for e in cpu if e.get("cat") == "user_annotation" and "forward" in str(e.get("name", "")).lower()]
    t = (min(fwd, key=lambda e: e["ts"])["ts"] if fwd else min(e["ts"] for e in cpu)) + 1.0
    x = ms * 1000.0
    out_cpu = []
    for e in cpu:
        a, b = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
        out_cpu.append(dict(e, ts=a + (x if a >= t else 0.0), dur=(b + (x if b >= t else 0.0)) - (a + (x if a >= t else 0.0))))
    out_gpu = [dict(e, ts=float(e["ts"]) + (x if float(e["ts"]) >= t else 0.0)) for e in gpu]
    return out_cpu, out_gpu, t


def write_job(job: RealTraceJob, out: Path, trace: Path | None = None) -> dict:
    """Write ``job.ranks`` Kineto traces into ``out``; returns the truth (culprits, steps, cost)."""
    base, meta = load_base(trace if trace is not None else job.base)
    B = len(base)
    per_rank: list[list[dict]] = [[] for _ in range(job.ranks)]
    t0 = 1_000_000.0
    step_times, base_times = [], []
    culprits = set(job.culprits)
    faulty_steps = []
    for k in range(job.steps):
        chosen = [base[r % B][(k + r // B) % len(base[r % B])] for r in range(job.ranks)]
        faulty = job.culprit is not None and k >= job.onset
        cpus = [[dict(e) for e in s_.cpu] for s_ in chosen]
        gpus = [[dict(e) for e in s_.gpu] for s_ in chosen]
        lengths = [s_.length for s_ in chosen]
        if faulty and job.kind in ("compute", "host"):
            for r in culprits:
                gpus[r] = _slow(gpus[r], job.factor)
            faulty_steps.append(k)
        elif faulty and job.kind == "stall" and (k - job.onset) % 3 == 0:
            for r in culprits:
                cpus[r], gpus[r], _ = _stall(cpus[r], gpus[r], job.stall_ms)
                lengths[r] += job.stall_ms * 1000.0
            faulty_steps.append(k)
        _synchronise(gpus, chosen)
        own = [max([n] + [e["ts"] + float(e.get("dur", 0.0)) for e in g] + [e["ts"] + float(e.get("dur", 0.0))
                                                                             for e in c])
               for n, g, c in zip(lengths, gpus, cpus)]
        length = float(max(own))  # the step ends together: after every rank's own work
        step_times.append(length)
        base_times.append(max(s_.length for s_ in chosen))
        for r in range(job.ranks):
            per_rank[r] += [_placed(e, t0, k) for e in cpus[r]]
            per_rank[r] += [_placed(e, t0, k) for e in gpus[r]]
            per_rank[r].append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": t0,
                                "dur": length, "pid": 1, "tid": 1})
        t0 += length + 50.0
    out.mkdir(parents=True, exist_ok=True)
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": job.ranks,
               "ranks": list(range(job.ranks))}]
    for r, evs in enumerate(per_rank):
        doc = {**meta, "host_name": f"host{r // GPUS_PER_HOST}",
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": job.ranks, "pg_count": 1,
                                   "pg_config": groups},
               "traceEvents": evs}
        (out / f"rank-{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    healthy = [b for k, b in enumerate(base_times) if k not in faulty_steps]
    hit = [t for k, t in enumerate(step_times) if k in faulty_steps]
    # what the fault cost the job over the run (a stall in every third step: over the steps from
    # its first, as the diagnosis charges an intermittent stall)
    span = [t for k, t in enumerate(step_times) if k >= job.onset] if job.kind == "stall" else hit
    span_base = [b for k, b in enumerate(base_times) if k >= job.onset] if job.kind == "stall" else healthy
    cost = 100.0 * (float(np.mean(span)) / float(np.mean(span_base)) - 1.0) if hit and span_base else 0.0
    klass = {"compute": "compute_straggler", "host": "compute_straggler", "stall": "host_stall"}[job.kind]
    return {"faults": [{"class": klass, "culprit_ranks": sorted(culprits), "steps": faulty_steps,
                        "window": {"start_step": min(faulty_steps), "end_step": max(faulty_steps)}}]
            if job.culprit is not None and faulty_steps else [], "cost_pct": cost, "real_steps": len(base[0])}


def _synchronise(gpus: list[list[dict]], chosen: list[_Step]) -> None:
    """Collectives end together: the j-th launch of an NCCL kernel in the step, on every rank,
    ends when its last member has arrived plus the transfer (its shortest real duration); a
    rank's later device work waits for it. Instances are taken in time order, so a delay
    carries into the arrivals of the next ones."""
    R = len(gpus)
    by_name: list[dict[str, list[dict]]] = []
    real: list[dict[str, list[dict]]] = []
    for g, s_ in zip(gpus, chosen):
        by_name.append({})
        for e in sorted((e for e in g if _is_collective(e)), key=lambda e: e["ts"]):
            by_name[-1].setdefault(e["name"], []).append(e)
        real.append({})
        for e in sorted((e for e in s_.gpu if _is_collective(e)), key=lambda e: e["ts"]):
            real[-1].setdefault(e["name"], []).append(e)
    names = set.intersection(*(set(b) for b in by_name)) if R else set()
    instances = [(n, j) for n in names for j in range(min(len(b[n]) for b in by_name))]
    instances.sort(key=lambda nj: float(np.median([b[nj[0]][nj[1]]["ts"] for b in by_name])))
    shifts = [_Shift() for _ in range(R)]
    orig = [{id(e): (e["ts"], e["ts"] + float(e.get("dur", 0.0))) for e in g} for g in gpus]
    for n, j in instances:
        kern = [b[n][j] for b in by_name]
        arrive = [orig[r][id(e)][0] + shifts[r](orig[r][id(e)][0]) for r, e in enumerate(kern)]
        done = max(arrive) + min(float(rl[n][j].get("dur", 0.0)) for rl in real)
        for r, e in enumerate(kern):
            e["ts"], e["dur"] = arrive[r], done - arrive[r]
            shifts[r].raise_from(orig[r][id(e)][1], done - orig[r][id(e)][1])
    matched = {id(b[n][j]) for b in by_name for n, j in instances}
    for r, g in enumerate(gpus):
        for e in g:
            if id(e) in matched:
                continue
            a, b = orig[r][id(e)]
            e["ts"] = a + shifts[r](a)
            if e.get("cat") == "gpu_user_annotation":  # a range stretches over the waits inside it
                e["dur"] = max((b + shifts[r](b)) - e["ts"], 0.0)
            # a kernel (or copy) runs as long as it did: on its own stream, whatever started after it


def run_real_trace(job: RealTraceJob, trace: Path | None = None, workdir: Path | None = None) -> tuple[dict, Any]:
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
        return truth, score(job.family, job.ranks, job.culprit or 0, truth, d, t1 - t, t2 - t1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: Compute slowdowns injected, from near the detection limit up.
FACTORS = (1.25, 1.5, 2.0, 3.0)
SIZES = (4, 8, 16)
#: Host stalls injected (every third step from the onset), against steps of ~15–75 ms.
STALLS_MS = (10.0, 30.0)


def real_trace_jobs(sizes: tuple[int, ...] = SIZES, bases: tuple[str, ...] = ("ddp", "dlrm"),
                    steps: int = 12) -> list[RealTraceJob]:
    """Per base and size: the healthy job, a straggler per factor, a slowed host per factor ≥ 1.5
    (culprits spread over the job) and a host stall per length."""
    jobs = []
    for base in bases:
        for n in sizes:
            jobs.append(RealTraceJob(ranks=n, steps=steps, base=base))
            jobs += [RealTraceJob(ranks=n, steps=steps, culprit=(3 * i + n // 2) % n, factor=f, base=base)
                     for i, f in enumerate(FACTORS)]
            if n >= 4 * GPUS_PER_HOST:  # a host among at least four (half a peer set has no majority)
                jobs += [RealTraceJob(ranks=n, steps=steps, culprit=(5 * i + GPUS_PER_HOST) % n, factor=f,
                                      kind="host", base=base) for i, f in enumerate(FACTORS) if f >= 1.5]
            jobs += [RealTraceJob(ranks=n, steps=steps, culprit=(2 * i + 1) % n, kind="stall", stall_ms=ms, base=base)
                     for i, ms in enumerate(STALLS_MS)]
    return jobs


@dataclass
class RealTraceScore:
    job: RealTraceJob
    cost_pct: float
    score: Any  # accuracy.RunScore

    def to_json(self) -> dict:
        return {"bench": "accuracy-real-trace", "base": self.job.base, "family": self.job.family,
                "ranks": self.job.ranks, "culprits": self.job.culprits, "factor": self.job.factor,
                "stall_ms": self.job.stall_ms, "cost_pct": round(self.cost_pct, 2), **self.score.to_json()}


def score_real_trace(job: RealTraceJob) -> RealTraceScore:
    truth, s = run_real_trace(job)
    return RealTraceScore(job, float(truth["cost_pct"]), s)


def summarize_real_traces(scores: list[RealTraceScore], cost_floor_pct: float = 5.0) -> list[dict]:
    """Per base: the healthy jobs' false-incident rate; per family, P/R/class over the faults
    costing at least ``cost_floor_pct`` (and how many cheaper ones there were)."""
    def mean(xs: list) -> float | None:
        xs = [x for x in xs if x is not None]
        return round(float(np.mean(xs)), 4) if xs else None

    rows = []
    for base in sorted({s.job.base for s in scores}):
        here = [s for s in scores if s.job.base == base]
        healthy = [s for s in here if s.job.culprit is None]
        rows.append({"bench": "accuracy-real-trace", "base": base, "family": "healthy", "runs": len(healthy),
                     "false_incident_rate": mean([float(s.score.false_incident) for s in healthy])})
        for family in ("compute_straggler", "masked_compute", "host_stall"):
            at = [s for s in here if s.job.family == family]
            if not at:
                continue
            costly = [s for s in at if s.cost_pct >= cost_floor_pct]
            rows.append({"bench": "accuracy-real-trace", "base": base, "family": family, "runs": len(at),
                         "costly_runs": len(costly), "cost_floor_pct": cost_floor_pct,
                         "cost_pct_median": round(float(np.median([s.cost_pct for s in at])), 2),
                         "precision": mean([s.score.precision for s in costly]),
                         "recall": mean([s.score.recall for s in costly]),
                         "class_accuracy": mean([float(bool(s.score.class_ok)) for s in costly]),
                         "cheap_found": sum(1 for s in at if s.cost_pct < cost_floor_pct and s.score.recall)})
    return rows
