"""Communicators judged like with like, on Kineto traces shaped like Megatron's: a group whose
members span several layout axes (``MODEL_PARALLEL_GROUP`` = tp × pp, for the grad-norm
all-reduce) is a kind of its own, named from its ``pg_desc``, never folded into tp or dp — and,
with no peer of its kind, not judged (the document says so)."""

from __future__ import annotations

import gzip
import json

from argus.analysis import DiagnoseConfig, diagnose
from argus.kineto import import_kineto
from argus.store import Store
from argus.topology import parse_layout

LAYOUT = parse_layout("tp=2,pp=2,dp=4", world_size=16)
STEPS = 10
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
RS = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _groups() -> dict[str, list[list[int]]]:
    mp = [sorted(set(LAYOUT.group_of("tp", r).tolist()) | set(LAYOUT.group_of("tp", int(q)).tolist()))
          for r in range(16) for q in LAYOUT.group_of("pp", r)]
    return {"TENSOR_MODEL_PARALLEL_GROUP": LAYOUT.groups("tp").tolist(),
            "DATA_PARALLEL_GROUP": LAYOUT.groups("dp").tolist(),
            "PIPELINE_MODEL_PARALLEL_GROUP": LAYOUT.groups("pp").tolist(),
            "MODEL_PARALLEL_GROUP": sorted({tuple(g) for g in mp})}


def _trace(rank: int, slow_mp: set[int], named: bool = True) -> dict:
    """One rank's 10 steps: 3 GEMMs, 4 tp all-reduces, a dp reduce-scatter, and the grad-norm
    all-reduce on the model-parallel group (on its own stream, as each NCCL communicator has);
    the model-parallel group in ``slow_mp`` crosses a slower path by nature, every step."""
    groups = {desc: next(g for g in gs if rank in g) for desc, gs in _groups().items()}
    ev, corr, t = [], 1, 1_000_000.0
    mine = set(groups["MODEL_PARALLEL_GROUP"])

    def collective(name: str, desc: str, kernel: str, stream: int, us: float) -> None:
        nonlocal corr, t
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": t, "dur": 8.0, "pid": 1, "tid": 1,
                   "args": {"Process Group Ranks": json.dumps(groups[desc]),
                            **({"Process Group Description": desc} if named else {})}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": t + 1, "dur": 6.0, "pid": 1, "tid": 1})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 2, "dur": 3.0, "pid": 1,
                   "tid": 1, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": kernel, "ts": t + 10, "dur": us, "pid": 0, "tid": stream,
                   "args": {"stream": stream, "device": rank % 8, "correlation": corr}})
        corr += 1
        t += us + 20

    for step in range(STEPS):
        start = t
        ev.append({"ph": "X", "cat": "user_annotation", "name": "## forward ##", "ts": t, "dur": 3300.0, "pid": 1,
                   "tid": 1})
        for i in range(3):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 1, "dur": 3.0,
                       "pid": 1, "tid": 1, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": t + 5,
                       "dur": 1000.0 + 7 * ((rank + step + i) % 3), "pid": 0, "tid": 7,
                       "args": {"stream": 7, "device": rank % 8, "correlation": corr}})
            corr += 1
            t += 1010
        for _ in range(4):
            collective("nccl:all_reduce", "TENSOR_MODEL_PARALLEL_GROUP", NCCL, 20, 50 + (rank + step) % 4)
        collective("nccl:reduce_scatter", "DATA_PARALLEL_GROUP", RS, 22, 200 + (rank * 7 + step) % 9)
        collective("nccl:all_reduce", "MODEL_PARALLEL_GROUP", NCCL, 21, 2000.0 if mine & slow_mp else 30.0)
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": start,
                   "dur": t - start, "pid": 1, "tid": 1})
        t += 100
    pg_config = [{"pg_name": str(i), **({"pg_desc": desc} if named else {}), "backend_config": "cuda:nccl",
                  "pg_size": len(g), "ranks": g} for i, (desc, g) in enumerate(groups.items())]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 16,
                                                    "pg_config": pg_config},
            "host_name": f"node{rank // 8}", "baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": ev}


def _job(tmp_path, slow_mp: set[int], named: bool = True):
    d = tmp_path / "traces"
    d.mkdir()
    for r in range(16):
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(_trace(r, slow_mp, named)).encode()))
    import_kineto([d], tmp_path / "s", "tp=2,pp=2,dp=4")
    return Store.open(tmp_path / "s").attempt()


def test_a_group_spanning_tp_and_pp_is_its_own_kind_and_is_not_judged_as_tp(tmp_path):
    # the model-parallel group holding rank 6 runs its grad-norm all-reduce 60x slower by nature:
    # compared as "tp" groups (split along groups it does not run in), it was a link incident
    attempt = _job(tmp_path, slow_mp={6})
    kinds = {r["group_kind"] for r in attempt.sql(
        "SELECT DISTINCT group_kind FROM phases WHERE category = 'comm'").to_pylist()}
    assert kinds == {"tp", "dp", "model_parallel"}
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert [i for i in d.incidents if i.klass == "link_degradation"] == []
    shifts = [s for w in d.windows if w.l3 for s in w.l3.shifts]
    assert shifts == []
    unjudged = d.document()["unjudged_communicators"]
    assert {"group_kind": "model_parallel", "why": "a group of its own kind (no layout group has its members)"} \
        in unjudged
    assert any(u.get("op") == "all_reduce" and u.get("launches_per_rank_step") == 1.0 for u in unjudged)


def test_without_names_a_kernel_no_layout_communicator_launches_as_often_is_not_judged(tmp_path):
    """The same job with no ``pg_desc`` anywhere: the grad-norm group is of no layout kind, so its
    phases have none, and its kernel — one launch a step, where tp launches four — was split
    along tp groups as the "closest" kind: a link incident on the slow group's hosts."""
    attempt = _job(tmp_path, slow_mp={6}, named=False)
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert [i for i in d.incidents if i.klass == "link_degradation"] == []
    assert [s for w in d.windows if w.l3 for s in w.l3.shifts] == []
    assert any(u.get("op") == "all_reduce" for u in d.document()["unjudged_communicators"])


def test_the_simulator_runs_megatrons_groups_and_the_exporter_names_them_as_megatron_does(tmp_path):
    """``megatron_groups``: the grad-norm all-reduce over MODEL_PARALLEL (tp × pp) and the tied
    embedding's over EMBEDDING (first and last stage). Exported, every collective is preceded by
    its ``record_param_comms`` and every rank lists its groups with Megatron's ``pg_desc``, so a
    reader of the trace alone (no Argus args) puts each collective in its group; a healthy job
    raises nothing, and the two kinds of no layout are listed as not judged."""
    from argus.kineto import export_kineto
    from argus.sim import SimConfig, simulate_to_store
    from argus.topology import megatron_group

    # pp=3: with two stages the embedding group has the pipeline group's members (one communicator
    # by its members; the trace then cannot tell them apart, nor need it)
    layout = "tp=2,pp=3,dp=2"
    simulate_to_store(SimConfig(ranks=12, steps=10, layout=layout, gpus_per_host=2, kernels=True,
                                megatron_groups=True), "healthy", tmp_path / "s", baseline=False)
    attempt = Store.open(tmp_path / "s").attempt()
    per_step = {r["group_kind"]: r["n"] for r in attempt.sql(
        "SELECT group_kind, count(*) / 120 AS n FROM phases WHERE category = 'comm' "
        "AND group_kind IN ('model_parallel', 'embedding', 'world') GROUP BY group_kind").to_pylist()}
    assert per_step == {"model_parallel": 1, "embedding": 2 / 3}  # every rank (first and last stage) each step; no world
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert [i.klass for i in d.incidents if i.severity != "info"] == []
    own = {u["group_kind"] for u in d.document()["unjudged_communicators"] if "group_kind" in u}
    assert own == {"model_parallel", "embedding"}

    export_kineto(tmp_path / "s", tmp_path / "k")
    doc = json.loads((tmp_path / "k" / "rank3.json").read_text())
    pgs = {g["pg_desc"]: g["ranks"] for g in doc["distributedInfo"]["pg_config"]}
    L = attempt.layout
    assert pgs["MODEL_PARALLEL_GROUP"] == megatron_group(L, "model_parallel", 3).tolist() == [2, 3, 6, 7, 10, 11]
    assert pgs["EMBEDDING_GROUP"] == [3, 11] and pgs["TENSOR_MODEL_PARALLEL_GROUP"] == [2, 3]
    # the trace alone: without Argus's own args, the importer finds every group from PyTorch's records
    kinds = {r["group_kind"] for r in _reimport_bare(tmp_path, layout).sql(
        "SELECT DISTINCT group_kind FROM phases WHERE category = 'comm'").to_pylist()}
    assert {"tp", "dp", "pp", "model_parallel", "embedding"} <= kinds


def _reimport_bare(tmp_path, layout: str):
    """The export in ``tmp_path / "k"`` imported again without Argus's own args: what a reader of
    the trace alone (PyTorch's ``record_param_comms`` and ``pg_config``) makes of it."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in (tmp_path / "k").glob("rank*.json"):
        t = json.loads(f.read_text())
        for e in t["traceEvents"]:
            e.get("args", {}).pop("argus", None)
        (bare / f.name).write_text(json.dumps(t))
    import_kineto([bare], tmp_path / "s2", layout)
    return Store.open(tmp_path / "s2").attempt()


def test_context_parallel_groups_carry_megatrons_names(tmp_path):
    """With cp > 1 the gradients are reduced over ``DATA_PARALLEL_GROUP_WITH_CP`` (our dp kind
    spans cp, ep and dp) and ring attention exchanges over ``CONTEXT_PARALLEL_GROUP``; the trace
    alone puts every exchange in its ring."""
    from argus.kineto import export_kineto
    from argus.sim import SimConfig, simulate_to_store

    layout = "tp=2,cp=2,dp=2"
    simulate_to_store(SimConfig(ranks=8, steps=6, layout=layout, gpus_per_host=4, kernels=True), "healthy",
                      tmp_path / "s", baseline=False)
    export_kineto(tmp_path / "s", tmp_path / "k")
    doc = json.loads((tmp_path / "k" / "rank1.json").read_text())
    pgs = {g["pg_desc"]: g["ranks"] for g in doc["distributedInfo"]["pg_config"]}
    assert pgs["CONTEXT_PARALLEL_GROUP"] == [1, 3] and pgs["TENSOR_MODEL_PARALLEL_GROUP"] == [0, 1]
    assert pgs["DATA_PARALLEL_GROUP_WITH_CP"] == [1, 3, 5, 7] and "DATA_PARALLEL_GROUP" not in pgs
    kinds = {r["group_kind"] for r in _reimport_bare(tmp_path, layout).sql(
        "SELECT DISTINCT group_kind FROM phases WHERE category = 'comm' AND rank = 1").to_pylist()}
    assert {"tp", "cp", "dp"} <= kinds
