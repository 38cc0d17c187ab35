"""A per-op timeline written into a run store, one window per step, through the writer the
live processor uses.

The traced ranks become the store's world: one rank per tensor-parallel group is the usual
sample (the others run the same ops), so the store's layout is ``pp × dp`` with ``tp = 1``,
and a rank's place is its (stage, dp_rank). Op types become phases:

* ``forward-compute``, ``backward-compute``, ``optimizer`` — compute;
* ``*-send``, ``*-recv`` — pipeline transfers (``pp``), named as recorded;
* ``params-all-gather``, ``grads-reduce-scatter``, ``separate-grads-all-reduce`` — the
  data-parallel group (``dp``);
* ``layernorm-grads-all-reduce`` — the tensor-parallel group (``tp``; one member here);
* ``embedding-grads-all-reduce`` — Megatron's embedding group (first and last stage);
* ``optimizer-clip-main-grad`` — the gradient-norm all-reduce over the model-parallel group;
* ``gc`` and any other op — host work.

Steps are laid end to end on one clock (each starts one second after the previous one ended):
the artifact samples steps far apart and starts each at zero. Microbatch labels are kept unless
``microbatch_labels=False`` (the analysis must not need them; the evaluation checks both)."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from argus.errors import IngestError
from argus.optrace.reader import OpTrace
from argus.store import Store, WindowData, WindowWriter, conform
from argus.topology import GroupKind, Layout, RunIdentity, Topology, new_run_id
from argus.uniques import sorted_unique

__all__ = ["OpsImport", "import_ops", "classify_op", "WRITER_ID"]

WRITER_ID = "optrace"
_GAP_NS = 1_000_000_000  # between consecutive imported steps


def classify_op(name: str) -> tuple[str, str]:
    """(category, group kind) of an op type."""
    low = name.lower()
    if re.search(r"(^|[-_])(send|recv)($|[-_])", low):
        return "comm", GroupKind.PP
    if "layernorm" in low and ("all-reduce" in low or "allreduce" in low):
        return "comm", GroupKind.TP
    if "embedding" in low and ("all-reduce" in low or "allreduce" in low):
        return "comm", "embedding"
    if "clip-main-grad" in low or "clip_main_grad" in low:
        return "comm", "model_parallel"
    if re.search(r"all-?gather|reduce-?scatter|all-?reduce|all-?to-?all", low):
        return "comm", GroupKind.DP
    if low in ("gc", "dataloader", "data-loading", "checkpoint", "checkpoint-save"):
        return "host", ""
    return "compute", ""


@dataclass
class OpsImport:
    store: Path
    run_id: str
    attempt_id: str
    layout: str
    steps: int
    ops: int
    write_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def import_ops(trace: OpTrace, out: str | Path, *, sizes: dict[str, int] | None = None, gpus_per_host: int = 8,
               run_id: str | None = None, microbatch_labels: bool = True) -> OpsImport:
    """Write ``trace`` into the store at ``out`` as a new attempt (source ``optrace``). ``sizes``:
    the job's sizes (``pp``, ``dp``, ``tp``, ``dsp``, from the artifact's meta file), checked
    against the trace; default: what the trace holds."""
    t0 = time.perf_counter()
    pp, dp = int(trace.stage.max()) + 1, int(trace.dp_rank.max()) + 1
    notes = []
    if sizes:
        if sizes.get("pp", pp) < pp or sizes.get("dp", dp) < dp:
            raise IngestError(f"{trace.path}: stages 0..{pp - 1} and dp ranks 0..{dp - 1} do not fit the given "
                              f"sizes pp={sizes.get('pp')}, dp={sizes.get('dp')}")
        pp, dp = sizes.get("pp", pp), sizes.get("dp", dp)
        per_rank = sizes.get("tp", 1) * sizes.get("dsp", 1) * sizes.get("cp", 1)
        if per_rank > 1:
            notes.append(f"each traced rank stands for {per_rank} ranks (tp × dsp): the store holds the "
                         f"{pp * dp} traced ones")
    layout = Layout(pp=pp, dp=dp)
    rank = np.asarray(layout.rank_of(dp=trace.dp_rank, pp=trace.stage), np.int64)
    present = sorted_unique(rank)
    if present.size < layout.world_size:
        notes.append(f"{layout.world_size - present.size} of {layout.world_size} (stage, dp_rank) places have no ops")
    topology = _topology(layout, trace, rank, gpus_per_host)
    kinds = [classify_op(n) for n in trace.optypes]
    cat = np.array([k[0] for k in kinds], object)[trace.optype]
    group = np.array([k[1] for k in kinds], object)[trace.optype]
    names = np.array(trace.optypes, object)[trace.optype]
    # steps end to end on one clock, in step order
    steps = sorted_unique(trace.step)
    idx = np.searchsorted(steps, trace.step)
    end = trace.start_s + trace.dur_s
    span = np.zeros(len(steps))
    np.maximum.at(span, idx, end)
    lo = np.full(len(steps), np.inf)
    np.minimum.at(lo, idx, trace.start_s)
    width_ns = np.ceil((span - np.minimum(lo, 0.0)) * 1e9).astype(np.int64) + _GAP_NS
    base_ns = np.concatenate([[0], np.cumsum(width_ns)[:-1]]) - np.floor(np.minimum(lo, 0.0) * 1e9).astype(np.int64)
    start_ns = base_ns[idx] + np.round(trace.start_s * 1e9).astype(np.int64)
    dur_ns = np.round(trace.dur_s * 1e9).astype(np.int64)
    mb = trace.mb if microbatch_labels else np.full(trace.n, -1, np.int64)
    mb = np.where(cat == "compute", mb, -1)
    store = Store.create(out)
    identity = RunIdentity(run_id or new_run_id("optrace"))
    run_dir = store.attempt_path(identity).parent
    new_run_dir = not run_dir.exists()
    attempt = store.create_attempt(identity, topology, source="optrace", extra={
        "imported_from": str(trace.path), "microbatch_labels": bool(microbatch_labels)})
    try:
        writer = WindowWriter(attempt, WRITER_ID)
        order = np.lexsort((start_ns, rank, idx))
        bounds = np.searchsorted(idx[order], np.arange(len(steps) + 1))
        for k, step in enumerate(steps.tolist()):
            rows = order[bounds[k]:bounds[k + 1]]
            r = rank[rows]
            ranks_k, first = np.unique(r, return_index=True)
            s0 = np.full(len(ranks_k), base_ns[k])  # the trace's step origin, common to every rank
            e0 = np.maximum.reduceat(start_ns[rows] + dur_ns[rows], first)
            steps_t = conform("steps", {"rank": ranks_k.astype(np.int32), "step": np.full(len(ranks_k), step),
                                        "start_ns": s0, "end_ns": e0})
            phases_t = conform("phases", {
                "rank": r.astype(np.int32), "step": np.full(len(rows), step), "microbatch": mb[rows].astype(np.int32),
                "name": pa.array(names[rows].tolist(), pa.string()), "category": pa.array(cat[rows].tolist(), pa.string()),
                "group_kind": pa.array(group[rows].tolist(), pa.string()), "start_ns": start_ns[rows],
                "dur_ns": dur_ns[rows], "wait_ns": np.full(len(rows), -1, np.int64)})
            writer.write(WindowData(window=k, start_step=step, end_step=step, steps=steps_t, phases=phases_t), None)
    except BaseException as exc:
        shutil.rmtree(attempt.path, ignore_errors=True)
        if new_run_dir and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
        if not isinstance(exc, Exception):
            raise
        raise IngestError(f"writing {attempt.path} failed ({type(exc).__name__}: {exc}); "
                          "the partly written attempt was removed") from exc
    return OpsImport(Path(out), identity.run_id, identity.attempt_id, str(layout), len(steps), trace.n,
                     time.perf_counter() - t0, notes)


def _topology(layout: Layout, trace: OpTrace, rank: np.ndarray, gpus_per_host: int) -> Topology:
    """Hosts from the trace's global ranks (``gpus_per_host`` consecutive ones a host), else
    consecutive store ranks."""
    topo = Topology.uniform(layout, gpus_per_host)
    if trace.rank is None:
        return topo
    glob = np.full(layout.world_size, -1, np.int64)
    glob[rank] = trace.rank
    if (glob < 0).any():
        return topo
    host_ids = glob // max(gpus_per_host, 1)
    width = max(4, len(str(int(host_ids.max()))))
    hosts = np.array([f"node-{h:0{width}d}" for h in host_ids.tolist()])
    local = glob % max(gpus_per_host, 1)
    return Topology(layout=layout, hosts=hosts, local_ranks=local, gpu_uuids=topo.gpu_uuids)
