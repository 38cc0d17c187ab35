"""Store → ``argus export kineto`` → ``argus ingest kineto`` → the same store, on a simulated GPU job."""

import gzip
import json
from collections import Counter

import pytest

from argus.cli.main import main
from argus.sim import SimConfig, simulate_to_store
from argus.store import Store

KEYS = {"steps": ["rank", "step"], "phases": ["rank", "step", "start_ns", "name", "microbatch"],
        "kernels": ["rank", "step", "start_ns", "stream", "name"]}


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "S"
    simulate_to_store(SimConfig(ranks=8, steps=4, kernels=True), "compute_straggler", out, baseline=False)
    return out


def rows(attempt, table):
    return attempt.read(table).sort_by([(k, "ascending") for k in KEYS[table]]).to_pylist()


def roundtrip(tmp_path, store, *export_args, jobs=1):
    exported = tmp_path / "traces"
    assert main(["export", "kineto", str(store), "--out", str(exported), *export_args]) == 0
    src = Store.open(store).attempt()
    back = tmp_path / "S2"
    assert main(["ingest", "kineto", str(exported), "--out", str(back), "--layout", src.meta["layout"],
                 "--order", src.meta["order"], "--run-id", "back", "--jobs", str(jobs)]) == 0
    return exported, src, Store.open(back).attempt()


def test_export_then_import_gives_back_the_same_steps_phases_and_kernels(tmp_path, sim_store, capsys):
    exported, src, dst = roundtrip(tmp_path, sim_store)
    assert sorted(p.name for p in exported.iterdir()) == [f"rank{r}.json" for r in range(8)]
    assert dst.meta["source"] == "kineto" and str(dst.layout) == str(src.layout)
    for table in ("steps", "phases", "kernels"):
        a, b = rows(src, table), rows(dst, table)
        assert len(a) == len(b) > 0, table
        assert {r["rank"] for r in a} == {r["rank"] for r in b} == set(range(8))
        for x, y in zip(a, b):
            for col in ("start_ns", "end_ns", "dur_ns"):
                if col in x:
                    assert abs(x[col] - y[col]) < 1000, (table, col, x, y)  # within 1 µs (exact in practice)
            assert {k: v for k, v in x.items() if not k.endswith("_ns")} == \
                   {k: v for k, v in y.items() if not k.endswith("_ns")}, table
    comm = lambda att: sum(r["count"] for r in att.read("kernel_summaries").to_pylist() if r["category"] == "comm")  # noqa: E731
    assert comm(dst) == sum(1 for r in rows(src, "kernels") if r["name"].startswith("nccl")) > 0
    assert "8 ranks of 8" in capsys.readouterr().out


def test_exported_files_look_like_kineto_for_trace_tools(tmp_path, sim_store):
    out = tmp_path / "traces"
    assert main(["export", "kineto", str(sim_store), "--out", str(out), "--steps", "1:2"]) == 0
    text = (out / "rank3.json").read_text()
    first_rank_line = next(line for line in text.splitlines() if '"rank"' in line)
    assert '"distributedInfo"' in first_rank_line and '"rank": 3,' in first_rank_line  # HTA's rank regex
    doc = json.loads(text)
    info = doc["distributedInfo"]
    assert {k: info[k] for k in ("backend", "rank", "world_size")} == {"backend": "nccl", "rank": 3, "world_size": 8}
    # the rank's process groups, named as Megatron-core names them, each holding the rank
    assert info["pg_config"] and all(3 in g["ranks"] and g["pg_size"] == len(g["ranks"]) >= 2
                                     and g["pg_desc"].endswith(("_GROUP", "default_pg")) for g in info["pg_config"])
    ev = doc["traceEvents"]
    cats = Counter(e.get("cat") for e in ev if e["ph"] == "X")
    assert sorted(e["name"] for e in ev if e["name"].startswith("ProfilerStep")) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert cats["kernel"] == cats["cuda_runtime"] > 0 and cats["user_annotation"] > cats["gpu_user_annotation"] > 0
    launches = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    steps = [e for e in ev if e["name"].startswith("ProfilerStep")]
    for k in (e for e in ev if e.get("cat") == "kernel"):
        assert {"stream", "device", "correlation"} <= set(k["args"]) and k["tid"] == k["args"]["stream"]
        lt = launches[k["args"]["correlation"]]["ts"]
        assert lt <= k["ts"] and any(s["ts"] <= lt < s["ts"] + s["dur"] for s in steps)
    assert any(e["name"].startswith("ncclDevKernel_") for e in ev)  # NCCL kernels under their own names


def test_gzip_and_hta_names_survive_import_in_parallel_readers(tmp_path, sim_store):
    exported, src, dst = roundtrip(tmp_path, sim_store, "--gzip", "--hta-compat", jobs=2)
    names = {e["name"] for f in exported.iterdir() for e in json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]}
    assert not any(n.startswith("ncclDevKernel_") for n in names) and any(n.startswith("ncclKernel_") for n in names)
    assert len(rows(dst, "kernels")) == len(rows(src, "kernels"))
    def events(att):
        out = Counter()
        for r in att.read("kernel_summaries").to_pylist():
            out[(r["kernel"], r["category"])] += r["count"]
        return out
    assert events(dst) == events(src)  # both NCCL spellings normalise to the same short names


def test_a_store_without_raw_kernels_exports_steps_and_phases_with_a_warning(tmp_path, capsys):
    store = tmp_path / "S"
    simulate_to_store(SimConfig(ranks=4, steps=3), "healthy", store, baseline=False)
    exported, src, dst = roundtrip(tmp_path, store)
    assert "no raw kernel events" in capsys.readouterr().err
    assert rows(dst, "kernels") == [] and len(rows(dst, "phases")) == len(rows(src, "phases")) > 0
    assert rows(dst, "steps") == rows(src, "steps")
