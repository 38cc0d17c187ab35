"""The importer on a hand-made GPU-shaped trace that exercises every rule of the Kineto contract."""

import gzip
import json

import pytest

from argus.kineto import import_kineto, read_trace
from argus.store import Store

BASE_NS = 1_700_000_000_000_000_000
NCCL_NEW = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_OLD = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def ann(name, ts, dur, ext=None, gpu=False, tid=1):
    ev = {"ph": "X", "cat": "gpu_user_annotation" if gpu else "user_annotation", "name": name,
          "pid": 0 if gpu else 100, "tid": 7 if gpu else tid, "ts": ts, "dur": dur, "args": {}}
    if ext is not None:
        ev["args"]["External id"] = ext
    return ev


def kernel(name, ts, dur, stream=7, corr=None, cat="kernel"):
    args = {"device": 0, "stream": stream}
    if corr is not None:
        args["correlation"] = corr
    ev = {"ph": "X", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}
    if cat is not None:
        ev["cat"] = cat
    return ev


def launch(corr, ts, cat="cuda_runtime"):
    ev = {"ph": "X", "name": "cudaLaunchKernel", "pid": 100, "tid": 1, "ts": ts, "dur": 3,
          "args": {"correlation": corr, "cbid": 211}}
    if cat is not None:
        ev["cat"] = cat
    return ev


def gpu_trace() -> dict:
    """Rank 1 of a tp=2,dp=2 job. Metadata comes *after* the events (as Kineto writes
    baseTimeNanoseconds); some events lack ``cat``; timestamps are ints and floats."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#7", "pid": 100, "tid": 1, "ts": 1000, "dur": 1000},
        ann("ProfilerStep#8", 2000.5, 999.5),
        ann("## forward ##", 1010, 300, ext=11), ann("## forward ##", 1050.25, 280.5, ext=11, gpu=True),
        ann("forward-compute-mb3", 1400, 100, ext=12),
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100, "tid": 1, "ts": 1595, "dur": 60,
         "args": {"Process Group Name": "1"}},
        ann("nccl:all_reduce", 1600, 50, ext=13), ann("nccl:all_reduce", 1990, 100, ext=13, gpu=True),
        ann("nccl:all_reduce", 2100, 50, ext=14),
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100, "tid": 1, "ts": 2110, "dur": 10,
         "args": {"Process Group Ranks": "[1, 3]"}},
        ann("nccl:all_reduce", 3005, 100, ext=14, gpu=True),  # runs after step 8's CPU span: still step 8
        ann("gpu_only_phase", 2400, 300, ext=15), ann("gpu_only_phase", 2500, 10, gpu=True),
        ann("late", 3500, 10),  # outside every step
        launch(100, 1990, cat=None), kernel("gemm", 2050, 20, corr=100, cat=None),  # launched in 7, runs in 8
        launch(101, 1601), kernel(NCCL_NEW, 1990, 100, stream=20, corr=101),
        launch(102, 2101), kernel(NCCL_OLD, 3005, 80, stream=20, corr=102),
        kernel("Memcpy HtoD (Pageable -> Device)", 2200, 5, corr=103, cat="gpu_memcpy"),  # no launch: own time
        kernel("Memset (Device)", 1100, 1, cat="gpu_memset"),
        kernel("late_kernel", 5000, 1, corr=104),
        {"ph": "f", "id": 100, "pid": 100, "tid": 1, "ts": 1990, "cat": "ac2g", "name": "ac2g"},
        {"ph": "M", "name": "process_name", "pid": 100, "tid": 0, "args": {"name": "python"}},
    ]
    return {"schemaVersion": 1, "traceEvents": events,
            "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 4, "pg_config": [
                {"pg_name": "1", "pg_size": 2, "ranks": [0, 1]}, {"pg_name": "2", "pg_size": 2, "ranks": [1, 3]}]},
            "baseTimeNanoseconds": BASE_NS}


@pytest.fixture(params=["json", "json.gz"])
def trace_file(tmp_path, request):
    path = tmp_path / f"trace.{request.param}"
    data = json.dumps(gpu_trace()).encode()
    path.write_bytes(gzip.compress(data) if request.param.endswith("gz") else data)
    return path


def test_metadata_after_the_events_still_gives_rank_world_and_time_base(trace_file):
    t = read_trace(trace_file)
    assert (t.rank, t.rank_source, t.world_size, t.backend, t.base_ns) == (1, "distributedInfo", 4, "nccl", BASE_NS)
    assert t.steps.step.tolist() == [7, 8]
    assert t.steps.start_ns.tolist() == [BASE_NS + 1_000_000, BASE_NS + 2_000_500]
    assert t.steps.end_ns.tolist() == [BASE_NS + 2_000_000, BASE_NS + 3_000_000]


def test_import_maps_annotations_and_kernels_by_the_contract(trace_file, tmp_path):
    res = import_kineto([trace_file], tmp_path / "S", "tp=2,dp=2")
    assert res.ok and res.ranks == [1] and res.world_size == 4
    assert res.files[0].dropped == {"phases": 1, "kernels": 1}
    attempt = Store.open(tmp_path / "S").attempt()
    assert attempt.meta["source"] == "kineto"
    rows = sorted(attempt.read("phases").to_pylist(), key=lambda r: r["start_ns"])
    got = [(r["name"], r["step"], r["microbatch"], r["category"], r["group_kind"], r["start_ns"] - BASE_NS,
            r["dur_ns"]) for r in rows]
    assert got == [
        ("forward", 7, -1, "compute", "", 1_050_250, 280_500),  # the GPU span, wrapper stripped
        ("forward-compute-mb3", 7, 3, "compute", "", 1_400_000, 100_000),
        ("nccl:all_reduce", 7, -1, "comm", "tp", 1_990_000, 100_000),  # pg "1" = ranks [0, 1] = tp group
        ("gpu_only_phase", 8, -1, "compute", "", 2_500_000, 10_000),  # GPU preferred without ids too
        ("nccl:all_reduce", 8, -1, "comm", "dp", 3_005_000, 100_000),  # step of its CPU launch range
    ]
    k = sorted(attempt.read("kernels").to_pylist(), key=lambda r: r["start_ns"])
    assert [(r["name"], r["kind"], r["step"], r["stream"], r["device"], r["dur_ns"]) for r in k] == [
        ("Memset (Device)", "memset", 7, 7, 0, 1000),
        (NCCL_NEW, "kernel", 7, 20, 0, 100_000),
        ("gemm", "kernel", 7, 7, 0, 20_000),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy", 8, 7, 0, 5000),
        (NCCL_OLD, "kernel", 8, 20, 0, 80_000),
    ]
    summaries = attempt.read("kernel_summaries").to_pylist()
    comm = {(r["kernel"], r["op"], r["start_step"]) for r in summaries if r["category"] == "comm"}
    assert comm == {("AllReduce", "all_reduce", 7), ("AllReduce", "all_reduce", 8)}  # both NCCL name styles
    assert {r["category"] for r in summaries} == {"comm", "compute", "memcpy", "memset"}


def test_rank_from_the_file_name_and_a_trace_without_profiler_steps(tmp_path):
    events = [ann("forward", 10, 5), kernel("gemm", 12, 2, corr=1), launch(1, 11)]
    path = tmp_path / "worker_rank_3.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = read_trace(path)
    assert (t.rank, t.rank_source, t.world_size, t.base_ns) == (3, "file name", None, 0)
    assert t.steps.step.tolist() == [0] and "whole trace is step 0" in t.notes[0]
    assert len(t.phases) == 1 and len(t.kernels) == 1 and t.kernels.step.tolist() == [0]
