"""Wrong values in a trace are left out and counted, or fail their own file, never stored."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from argus.cli.main import main
from argus.errors import IngestError
from argus.kineto import read_trace
from argus.kineto.limits import MAX_STEP
from argus.kineto.names import phase_name
from argus.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"


def _step(n, ts=0, dur=100):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur}


def _kernel(**over):
    ev = {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": 5,
          "args": {"stream": 7, "device": 0, "correlation": 1}}
    for key, value in over.items():
        (ev["args"] if key in ("stream", "device", "correlation") else ev)[key] = value
    return ev


def _write(path: Path, events, dist=None, **top) -> Path:
    doc = {"distributedInfo": dist if dist is not None else {"rank": 3, "world_size": 8}, **top,
           "traceEvents": [_step(1), _kernel(), *events]}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("bad_event, reason", [
    (_kernel(dur=-50), "kernel event: dur negative"),
    (_kernel(dur=1e300), "kernel event: dur negative"),
    (_kernel(dur="5"), "kernel event: dur negative"),
    (_kernel(ts=1e300), "kernel event: ts not a number"),
    (_kernel(ts=-1e12), "kernel event: ts not a number"),
    (_kernel(ts=True), "kernel event: ts not a number"),
    (_kernel(stream=2**40), "kernel event: stream not an int"),
    (_kernel(stream=-3), "kernel event: stream not an int"),
    (_kernel(stream=True), "kernel event: stream not an int"),
    (_kernel(device=2**40), "kernel event: device not an int"),
    (_kernel(name=12345), "kernel event: name not a string"),
    (_kernel(name=[1, 2]), "kernel event: name not a string"),
    ({"ph": "X", "cat": "user_annotation", "name": {"x": 1}, "ts": 20, "dur": 1}, "annotation event: name not a string"),
    ({"ph": "X", "cat": "user_annotation", "name": "fwd", "ts": 20, "dur": -1}, "annotation event: dur negative"),
    (_step(9223372036854775807, ts=200), f"ProfilerStep number over {MAX_STEP:,}"),
    ({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#" + "9" * 5000, "ts": 0, "dur": 1},
     "ProfilerStep number over"),
    (5, "event: event is not a JSON object"),
])
def test_a_bad_event_value_drops_that_event_with_a_count(tmp_path, bad_event, reason):
    trace = read_trace(_write(tmp_path / "rank3.json", [bad_event]))
    assert any(reason in line for line in trace.rejected.lines()), trace.rejected.lines()
    assert trace.rejected.total() == 1
    assert list(trace.steps.step) == [1] and len(trace.kernels) == 1  # the good events stay
    assert (trace.kernels.dur_ns >= 0).all() and (trace.kernels.stream == 7).all()


def test_a_bad_correlation_is_ignored_and_counted_the_kernel_kept(tmp_path):
    trace = read_trace(_write(tmp_path / "rank3.json", [_kernel(correlation=1.5), _kernel(correlation=True)]))
    assert trace.rejected.total() == 2 and len(trace.kernels) == 3


def test_argus_metadata_of_the_wrong_type_falls_back_to_the_name(tmp_path):
    ann = {"ph": "X", "cat": "user_annotation", "name": "fwd-mb2", "ts": 20, "dur": 1,
           "args": {"argus": {"microbatch": True, "name": {"a": 1}, "category": 7}}}
    huge = {**ann, "ts": 30, "args": {"argus": {"microbatch": 2**40}}}
    trace = read_trace(_write(tmp_path / "rank3.json", [ann, huge]))
    assert list(trace.phases.microbatch) == [-1, -1]  # a bool is not microbatch 1, 2**40 is not an int32
    assert list(trace.phases.name) == ["fwd-mb2", "fwd-mb2"] and list(trace.phases.category) == ["compute"] * 2


@pytest.mark.parametrize("dist, rank, note", [
    ({"rank": -1, "world_size": 8}, 3, "distributedInfo.rank -1 is not a rank"),
    ({"rank": True, "world_size": 8}, 3, "distributedInfo.rank true is not a rank"),
    ({"rank": 10**12, "world_size": 8}, 3, "is not a rank"),
    ({"rank": 3, "world_size": True}, 3, "world_size true is not a size"),
    ({"rank": 3, "world_size": 10**7}, 3, "world_size 10000000 is not a size"),
])
def test_a_bad_rank_or_world_size_is_ignored_with_a_note(tmp_path, dist, rank, note):
    trace = read_trace(_write(tmp_path / "rank3.json", [], dist=dist))
    assert trace.rank == rank and any(note in n for n in trace.notes), trace.notes
    assert trace.world_size in (8, None)


@pytest.mark.parametrize("top, problem", [
    ({"baseTimeNanoseconds": 1e300}, "baseTimeNanoseconds 1e+300 is not an integer time"),
    ({"baseTimeNanoseconds": -5}, "baseTimeNanoseconds -5"),
    ({"baseTimeNanoseconds": "soon"}, 'baseTimeNanoseconds "soon"'),
    ({"distributedInfo": {"rank": 9, "world_size": 8}}, "rank 9 (from the distributedInfo) is outside its own"),
])
def test_a_bad_file_level_value_fails_that_file_naming_file_and_field(tmp_path, top, problem):
    path = tmp_path / "rank3.json"
    doc = {"distributedInfo": {"rank": 3, "world_size": 8}, **top, "traceEvents": [_step(1), _kernel()]}
    path.write_text(json.dumps(doc))
    with pytest.raises(IngestError) as info:
        read_trace(path)
    assert str(info.value).startswith(str(path)) and problem in str(info.value)


def test_group_ranks_out_of_range_are_not_a_group(tmp_path):
    rpc = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 19, "dur": 30, "tid": 1,
           "args": {"Process Group Ranks": "[" * 5000 + "]" * 5000, "Global rank start": True,
                    "Global rank stride": 1, "Group size": 10**9}}
    coll = {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "ts": 20, "dur": 5, "tid": 1}
    dist = {"rank": 3, "world_size": 8, "pg_config": [{"pg_name": "0", "ranks": [True, -1, 3], "pg_size": 3}]}
    trace = read_trace(_write(tmp_path / "rank3.json", [rpc, coll], dist=dist))
    assert trace.groups == [] and list(trace.phases.name) == ["nccl:all_reduce"]


def test_names_that_backtrack_a_regex_are_parsed_in_linear_time():
    t0 = time.perf_counter()
    assert phase_name("##" + " " * 100_000 + "x").name.startswith("##")
    assert phase_name("fwd-mb" + "9" * 5000).microbatch == -1
    assert phase_name("## forward ##").name == "forward"
    assert time.perf_counter() - t0 < 2.0  # was 18 s for 4,000 spaces


def test_a_fifo_or_dangling_link_named_like_a_trace_fails_alone(tmp_path, capsys):
    d = tmp_path / "t"
    d.mkdir()
    shutil.copy(DATA / "sampled_rank-1.json.gz", d / "sampled_rank-1.json.gz")
    os.mkfifo(d / "rank2.json")
    os.symlink(tmp_path / "gone.json", d / "rank4.json")
    out = tmp_path / "S"
    assert main(["ingest", "kineto", str(d), "--out", str(out)]) == 1  # without blocking on the FIFO
    err = capsys.readouterr().err
    assert "rank2.json: a FIFO, not a trace file" in err and "rank4.json: cannot read the file" in err
    assert set(Store.open(out).attempt().read("steps").column("rank").to_pylist()) == {1}


def test_an_import_that_keeps_no_rank_leaves_no_attempt(tmp_path, capsys):
    bad = _write(tmp_path / "rank3.json", [], baseTimeNanoseconds=1e300)
    out = tmp_path / "S"
    assert main(["ingest", "kineto", str(bad), "--out", str(out)]) == 2
    assert "nothing imported" in capsys.readouterr().err
    assert Store.open(out).attempts() == []


def test_bad_values_beside_good_ranks_lose_only_themselves(tmp_path, capsys):
    d = tmp_path / "t"
    d.mkdir()
    for name in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
        shutil.copy(DATA / name, d / name)
    world = {"world_size": 128}
    _write(d / "rank5.json", [_kernel(dur=-9), _kernel(stream=2**40)], dist={"rank": 5, **world})
    _write(d / "rank6.json", [], dist={"rank": 6, **world}, baseTimeNanoseconds=1e300)
    _write(d / "[red]rank7.json", [], dist={"rank": 7, **world})  # rich markup in a file name
    out = tmp_path / "S"
    assert main(["ingest", "kineto", str(d), "--out", str(out)]) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert "rank6.json: baseTimeNanoseconds" in err and "1 of 5 files not imported" in err
    assert "rank5.json: 1 kernel event: dur negative" in err
    assert "[red]rank7.json" in captured.out  # shown as written, not taken for markup
    attempt = Store.open(out).attempt()
    assert set(attempt.read("steps").column("rank").to_pylist()) == {0, 1, 5, 7}
    kernels = attempt.read("kernels").to_pylist()
    assert min(k["dur_ns"] for k in kernels) >= 0
    assert [k["stream"] for k in kernels if k["rank"] == 5] == [7]


def test_many_process_groups_of_the_whole_world_share_one_member_list():
    from argus.kineto.events import process_groups
    from argus.kineto.limits import MAX_WORLD_SIZE

    dist = {"world_size": MAX_WORLD_SIZE, "pg_config": [{"pg_name": str(i), "pg_size": MAX_WORLD_SIZE} for i in range(500)]}
    groups = process_groups(dist)  # 500 separate tuples of 2**20 ranks would be 4 GB
    assert len(groups) == 500 and len({id(g) for g in groups.values()}) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_fails_alone(tmp_path):
    path = _write(tmp_path / "rank3.json", [])
    path.chmod(0)
    with pytest.raises(IngestError, match="cannot read the file"):
        read_trace(path)
