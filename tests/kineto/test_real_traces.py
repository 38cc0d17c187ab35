"""Import the real GPU traces in shared/data/kineto and check the store against counts taken
independently from the JSON (stdlib json, no Argus code)."""

import bisect
import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from argus.kineto import import_kineto
from argus.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"  # copies of ../shared/data/kineto (MIT, HTA)
DDP = DATA / "ddp_nccl_rank-0.json.gz"
SAMPLED = [DATA / "sampled_rank-0.json.gz", DATA / "sampled_rank-1.json.gz"]
KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}



def ns(us) -> int:
    return int((Decimal(repr(us)) * 1000).to_integral_value())


def expected(path: Path) -> dict:
    """What the store must hold for one file, computed from the raw JSON."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    base = doc.get("baseTimeNanoseconds", 0)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((ns(e["ts"]) + base, ns(e["ts"]) + ns(e["dur"]) + base, int(e["name"].split("#")[1]))
                   for e in ev if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation")
    starts = [s[0] for s in steps]

    def step_of(t):
        i = bisect.bisect_right(starts, t) - 1
        return steps[i][2] if i >= 0 and t < steps[i][1] else None

    cpu = [e for e in ev if e.get("cat") == "user_annotation" and not e["name"].startswith("ProfilerStep")]
    gpu = [e for e in ev if e.get("cat") == "gpu_user_annotation"]
    phases = [e for e in cpu if step_of(ns(e["ts"]) + base) is not None]
    launch = {e["args"]["correlation"]: ns(e["ts"]) + base for e in ev if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in ev if e.get("cat") in KINDS]
    per_step = Counter(step_of(launch.get(e["args"]["correlation"], ns(e["ts"]) + base)) for e in kernels)
    return {
        "doc": doc, "rank": doc["distributedInfo"]["rank"], "steps": steps, "phases": phases, "gpu": gpu,
        "kinds": Counter(KINDS[e["cat"]] for e in kernels), "per_step": per_step,
        "nccl": Counter(e["name"] for e in kernels if e["name"].startswith("nccl")),
    }


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "S"
    res = import_kineto([DDP], out, "dp=2")
    return res, Store.open(out).attempt(), expected(DDP)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    out = tmp_path_factory.mktemp("sampled") / "S"
    res = import_kineto(SAMPLED, out, "tp=1")  # dp from distributedInfo.world_size (128)
    return res, Store.open(out).attempt(), {p.name: expected(p) for p in SAMPLED}


def check_rank(attempt, rank: int, exp: dict) -> None:
    steps = sorted((r["start_ns"], r["end_ns"], r["step"]) for r in attempt.read("steps").to_pylist()
                   if r["rank"] == rank)
    assert len(steps) == len(exp["steps"])
    for got, want in zip(steps, exp["steps"]):
        assert got[2] == want[2] and abs(got[0] - want[0]) <= 1 and abs(got[1] - want[1]) <= 1
    phases = [r for r in attempt.read("phases").to_pylist() if r["rank"] == rank]
    assert len(phases) == len(exp["phases"])
    want_names = Counter(e["name"][2:-2].strip() if e["name"].startswith("##") else e["name"] for e in exp["phases"])
    assert Counter(r["name"] for r in phases) == want_names
    for r in phases:
        if r["name"].startswith("nccl:"):
            assert r["category"] == "comm"
        if r["name"] in ("forward", "backward", "optimizer", "DistributedDataParallel.forward", "data_load"):
            assert r["category"] == "compute" and r["group_kind"] == ""
    kernels = [r for r in attempt.read("kernels").to_pylist() if r["rank"] == rank]
    assert Counter(r["kind"] for r in kernels) == exp["kinds"]
    assert Counter(r["step"] for r in kernels) == exp["per_step"]
    summaries = [r for r in attempt.read("kernel_summaries").to_pylist() if r["rank"] == rank]
    comm = [r for r in summaries if r["category"] == "comm"]
    assert sum(r["count"] for r in comm) == sum(exp["nccl"].values()) > 0
    assert sum(r["count"] for r in summaries if r["category"] == "memcpy") == exp["kinds"]["memcpy"]
    assert sum(r["count"] for r in summaries if r["category"] == "memset") == exp["kinds"]["memset"]


def test_ddp_trace_rank_steps_phases_kernels(ddp):
    res, attempt, exp = ddp
    assert res.ok and res.ranks == [exp["rank"]] == [0] and res.world_size == 2
    assert [s[2] for s in exp["steps"]] == [4, 5, 6]
    check_rank(attempt, 0, exp)
    ops = {r["op"] for r in attempt.read("kernel_summaries").to_pylist() if r["category"] == "comm"}
    assert ops == {"all_reduce", "broadcast"}


def test_ddp_phases_prefer_device_time_and_know_their_process_group(ddp):
    _, attempt, exp = ddp
    phases = attempt.read("phases").to_pylist()
    gpu_backward = sorted(ns(e["dur"]) for e in exp["gpu"] if e["name"] == "## backward ##")
    assert sorted(r["dur_ns"] for r in phases if r["name"] == "backward") == gpu_backward
    assert {r["name"] for r in phases} >= {"forward", "backward", "optimizer", "nccl:all_reduce", "nccl:broadcast"}
    comm = [r for r in phases if r["category"] == "comm"]
    assert comm and {r["group_kind"] for r in comm} == {"dp"}  # pg_config / record_param_comms: ranks [0, 1]
    assert {r["group_kind"] for r in phases if r["category"] == "compute"} == {""}


def test_sampled_traces_two_ranks_of_a_128_rank_job(sampled):
    res, attempt, exp = sampled
    assert res.ok and res.ranks == [0, 1] and res.world_size == 128
    assert attempt.layout.world_size == 128 and attempt.topology().world_size == 128
    for e in exp.values():
        assert [s[2] for s in e["steps"]] == [551, 552]
        check_rank(attempt, e["rank"], e)
    ops = {r["op"] for r in attempt.read("kernel_summaries").to_pylist() if r["category"] == "comm"}
    assert ops == {"send_recv"}
    streams = {r["stream"] for r in attempt.read("kernels").to_pylist()}
    assert streams == {7, 23, 25, 84, 203}
