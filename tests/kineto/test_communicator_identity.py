"""NCCL kernels tagged with their process group's kind, on hand-written Megatron-shaped Kineto traces:
L3 compares a communicator's collective only with communicators of the same kind (like with like).

NCCL names a kernel alike in every group: the tensor-parallel and the data-parallel bf16
all-reduce share one name and stream (0.3 ms vs 0.05 ms transfers), and the model-parallel grad
norm (tp x pp) is a kind of its own; mixed, they gave each pipeline stage its own floor: a false
tp shift in healthy jobs, and a slow dp link's evidence naming the wrong ranks besides its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.kineto import import_kineto
from argus.store import Store
from tests.kineto.megatron_traces import ALLREDUCE_BF16, ALLREDUCE_F32, GPUS_PER_HOST, parallel_groups, rank_of, \
    write_job

Job = tuple[Any, Any, dict]  # (the store's attempt, its Diagnosis, the diagnosis document)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Callable[..., Job]:
    """Write, import and diagnose a job once per (layout, slow group) for the whole module."""
    cache: dict[tuple, Job] = {}

    def get(tp: int, pp: int, dp: int, slow: list[int] | None = None) -> Job:
        key = (tp, pp, dp, tuple(slow or ()))
        if key not in cache:
            base: Path = tmp_path_factory.mktemp(f"tp{tp}pp{pp}dp{dp}")
            write_job(base / "traces", tp, pp, dp, slow_group=slow)
            import_kineto([base / "traces"], base / "store", f"tp={tp},pp={pp},dp={dp}")
            attempt = Store.open(base / "store").attempt()
            d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
            cache[key] = attempt, d, d.document()
        return cache[key]
    return get


@pytest.mark.parametrize("tp,pp,dp", [(4, 2, 2), (2, 2, 4)])
def test_a_healthy_job_raises_nothing(job, tp, pp, dp):
    """Not even a narrow-only shift: mixed under one name, the tp, dp and grad-norm all-reduces
    gave each pipeline stage its own floor, and the later stage's tp groups looked shifted."""
    _, d, doc = job(tp, pp, dp)
    assert [(i["class"], i["severity"], i["culprit_ranks"]) for i in doc["incidents"]
            if i["severity"] in ("warning", "critical")] == []
    assert [s.to_json() for w in d.windows if w.l3 for s in w.l3.shifts] == []
    # the grad norm's group has no peer of its kind: listed as not judged, never folded into tp
    assert any(u.get("kernel") == "AllReduce [group model_parallel]" for u in doc["unjudged_communicators"])


def test_one_slow_data_parallel_communicator_is_named_alone(job):
    """The dp group of stage 0, tp index 1 moves data 1.9x slower every step: its members, and
    only they, are a link incident — found by comparing it with the other dp groups of its stage
    (four per stage with tp=4; with two per stage, as in tp=2, a shift cannot stand out)."""
    tp, pp, dp = 4, 2, 2
    slow = [rank_of(tp, dp, 1, d, 0) for d in range(dp)]
    assert slow in parallel_groups(tp, pp, dp)["DATA_PARALLEL_GROUP"]
    attempt, _, doc = job(tp, pp, dp, slow)
    links = [i for i in doc["incidents"] if i["class"] == "link_degradation"]
    assert len(links) == 1, [(i["class"], i["culprit_ranks"]) for i in doc["incidents"]]
    inc = links[0]
    assert inc["culprit_ranks"] == sorted(slow)
    hosts = attempt.topology().hosts
    assert sorted(inc["hosts"]) == sorted({str(hosts[r]) for r in slow})
    assert {r // GPUS_PER_HOST for r in slow} == {0} and len(inc["hosts"]) == 1
    shifts = [e for e in inc["evidence"] if e.get("kind") == "group_shift"]
    assert shifts
    assert {(e["group_kind"], tuple(e["ranks"])) for e in shifts} == {("dp", tuple(sorted(slow)))}
    others = [(i["class"], i["severity"], i["culprit_ranks"]) for i in doc["incidents"]
              if i is not inc and i["severity"] in ("warning", "critical")]
    assert others == []


def test_collective_kernels_carry_their_group_kind(job):
    """Each NCCL kernel is stored under its communicator's kind, from the kernel's own args: one
    bf16 all-reduce name becomes a tp and a dp kernel, and the f32 grad-norm all-reduce over the
    model-parallel group (tp x pp) is a kind of its own; compute kernels stay untagged."""
    attempt, _, _ = job(4, 2, 2)
    raw = set(attempt.read("kernels").column("name").to_pylist())
    nccl = {n for n in raw if n.startswith("ncclDevKernel")}
    assert f"{ALLREDUCE_BF16} [group tp]" in nccl and f"{ALLREDUCE_BF16} [group dp]" in nccl
    assert f"{ALLREDUCE_F32} [group model_parallel]" in nccl
    assert all(n.endswith(("[group tp]", "[group dp]", "[group pp]", "[group model_parallel]")) for n in nccl), nccl
    assert not any("[group" in n for n in raw - nccl)
    summaries = set(attempt.read("kernel_summaries").column("kernel").to_pylist())
    assert {"AllReduce [group tp]", "AllReduce [group dp]", "AllReduce [group model_parallel]",
            "ReduceScatter [group dp]", "AllGather [group dp]", "SendRecv [group pp]"} <= summaries
    # the premise: the one kernel name has clearly different floors in its two kinds of group
    floors = {r["name"]: r["floor"] for r in attempt.sql(
        "SELECT name, min(dur_ns) AS floor FROM kernels WHERE name LIKE 'ncclDevKernel_AllReduce_Sum_bf16%' "
        "GROUP BY name").to_pylist()}
    assert floors[f"{ALLREDUCE_BF16} [group tp]"] > 3 * floors[f"{ALLREDUCE_BF16} [group dp]"]


def test_the_shared_repro_shape_names_the_communicator_not_its_hosts(job):
    """tp=2, pp=4, dp=4 with the dp group of stage 0, tp index 1 slow (the shape of
    ``shared/data/repro/kineto-link-dp-tp2pp4dp4``): the incident names that group's four ranks,
    not every rank of the host it crosses (two groups per stage: shown, not claimed)."""
    tp, pp, dp = 2, 4, 4
    slow = [rank_of(tp, dp, 1, d, 0) for d in range(dp)]
    _, _, doc = job(tp, pp, dp, slow)
    links = [i for i in doc["incidents"] if i["class"] == "link_degradation"]
    assert [i["culprit_ranks"] for i in links] == [sorted(slow)] == [[1, 3, 5, 7]]
    assert not [i for i in doc["incidents"] if i is not links[0] and i["severity"] in ("warning", "critical")]
    # its cost measured by the what-if (its transfers set to the other dp communicators'), though
    # its four ranks are the whole of their peer set: a link is compared with its like communicators
    what_if = [e for e in links[0]["evidence"] if e["kind"] == "what_if"]
    assert what_if and what_if[0]["slowdown_pct"] > 0 and max(what_if[0]["replay_error_pct"]) <= 10


def test_collective_annotations_carry_their_communicators_kind(tmp_path):
    """A collective's annotation (``nccl:all_reduce``) with no ``record_param_comms`` op around it
    (as in the shared repro traces) takes its communicator from the NCCL kernel launched under
    its External id: the phases a replay joins by communicator name tp, dp, pp and
    model-parallel groups, none left blank."""
    import gzip
    import json

    write_job(tmp_path / "traces", 4, 2, 2)
    for f in (tmp_path / "traces").glob("*.json.gz"):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "record_param_comms"]
        f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    import_kineto([tmp_path / "traces"], tmp_path / "store", "tp=4,pp=2,dp=2")
    attempt = Store.open(tmp_path / "store").attempt()
    rows = attempt.sql("SELECT group_kind, count(*) AS n FROM phases WHERE category = 'comm' GROUP BY group_kind"
                       ).to_pylist()
    kinds = {r["group_kind"]: r["n"] for r in rows}
    assert "" not in kinds, kinds
    assert {"tp", "dp", "pp", "model_parallel"} <= set(kinds), kinds
