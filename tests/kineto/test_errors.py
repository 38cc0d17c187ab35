"""Bad input: broken files are reported and skipped, bad options stop the command with exit code 2."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from argus.cli.main import main
from argus.errors import IngestError
from argus.kineto import read_trace
from argus.store import Store

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"  # copies of ../shared/data/kineto (MIT, HTA)


@pytest.fixture
def mixed_dir(tmp_path):
    """Two good ranks, a truncated .json.gz, a file of garbage and a truncated plain JSON."""
    d = tmp_path / "traces"
    d.mkdir()
    for name in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
        shutil.copy(DATA / name, d / name)
    whole = (DATA / "ddp_nccl_rank-0.json.gz").read_bytes()
    (d / "rank5.json.gz").write_bytes(whole[: len(whole) // 2])
    (d / "rank6.json").write_bytes(b"\x00\x01 this is not a trace \xff" * 50)
    (d / "rank7.json").write_text(json.dumps({"distributedInfo": {"rank": 7}, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1, "dur": 9}] * 50})[:1500])
    return d


def test_broken_files_are_reported_and_the_good_ranks_imported(mixed_dir, tmp_path, capsys):
    out = tmp_path / "S"
    rc = main(["ingest", "kineto", str(mixed_dir), "--out", str(out), "--layout", "tp=1"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "rank5.json.gz" in err and "truncated gzip stream" in err
    assert "rank6.json" in err and "not valid JSON" in err
    assert "rank7.json" in err and "truncated JSON" in err
    assert "3 of 5 files not imported" in err
    attempt = Store.open(out).attempt()
    assert sorted(set(attempt.read("steps").column("rank").to_pylist())) == [0, 1]


@pytest.mark.parametrize("content, problem", [
    (b"", "empty file"),
    (b"[1, 2", "truncated JSON"),
    (b'{"schemaVersion": 1}', "no traceEvents array"),
    (b'{"traceEvents": []}', "traceEvents array is empty"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": 1, '
     b'"args": {"stream": 7}}]}', "no usable trace events: 1 kernel event: ts not a number"),
])
def test_read_errors_name_the_file_and_the_problem(tmp_path, content, problem):
    path = tmp_path / "rank0.json"
    path.write_bytes(content)
    with pytest.raises(IngestError) as info:
        read_trace(path)
    assert str(info.value).startswith(str(path)) and problem in str(info.value)


@pytest.mark.parametrize("layout, message", [
    ("tp=2,foo=2", "unknown layout key 'foo'"),
    ("tp=two", "is not an integer"),
    ("tp=3", "does not divide the world size 128"),
    ("tp=2,dp=2", "has 4 ranks but the world size is 128"),
])
def test_a_bad_layout_is_a_clear_error_with_exit_code_2(tmp_path, capsys, layout, message):
    rc = main(["ingest", "kineto", str(DATA / "sampled_rank-1.json.gz"), "--out", str(tmp_path / "S"),
               "--layout", layout])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err


def test_a_layout_too_small_for_the_ranks_is_an_error(tmp_path, capsys):
    trace = tmp_path / "rank9.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0",
                                                  "ts": 0, "dur": 5}]}))
    assert main(["ingest", "kineto", str(trace), "--out", str(tmp_path / "S"), "--layout", "tp=2,dp=2"]) == 2
    assert "rank 9 is outside layout" in capsys.readouterr().err


def test_bad_layout_through_the_real_entry_point(tmp_path):
    out = subprocess.run([sys.executable, "-m", "argus", "ingest", "kineto", str(DATA), "--out", str(tmp_path / "S"),
                          "--layout", "tp=2,pp=x"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "layout size pp='x'" in out.stderr and "Traceback" not in out.stderr


def test_two_files_of_one_rank_is_an_error_naming_both(tmp_path, capsys):
    rc = main(["ingest", "kineto", str(DATA), "--out", str(tmp_path / "S"), "--layout", "tp=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "rank 0 claimed by two files" in err
    assert "ddp_nccl_rank-0.json.gz" in err and "sampled_rank-0.json.gz" in err


def test_nothing_importable_and_missing_paths_are_errors(tmp_path, capsys):
    bad = tmp_path / "rank0.json"
    bad.write_text("{")
    assert main(["ingest", "kineto", str(bad), "--out", str(tmp_path / "S"), "--layout", "dp=1"]) == 2
    assert "nothing imported" in capsys.readouterr().err
    assert main(["ingest", "kineto", str(tmp_path / "nope"), "--out", str(tmp_path / "S"), "--layout", "dp=1"]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_export_refuses_a_directory_that_is_not_empty(tmp_path, capsys):
    store = tmp_path / "S"
    assert main(["ingest", "kineto", str(DATA / "sampled_rank-1.json.gz"), "--out", str(store), "--layout", "tp=1"]) == 0
    out = tmp_path / "traces"
    out.mkdir()
    (out / "notes.json").write_text("{}")
    assert main(["export", "kineto", str(store), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err


def _rankless(path: Path, steps: int = 4) -> Path:
    """A trace as one profiled process writes it: no distributedInfo, no rank in the name."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "ts": 100 * s, "dur": 90}
          for s in range(steps)]
    path.write_text(json.dumps({"traceEvents": ev}))
    return path


def test_a_lone_trace_without_a_rank_is_rank_0_with_a_note(tmp_path, capsys):
    trace = _rankless(tmp_path / "trace.json")
    assert main(["ingest", "kineto", str(trace), "--out", str(tmp_path / "S")]) == 0  # no --layout needed
    assert "imported as rank 0" in capsys.readouterr().err
    attempt = Store.open(tmp_path / "S").attempt()
    assert attempt.layout.world_size == 1
    assert {r["rank"] for r in attempt.read("steps").to_pylist()} == {0}


def test_among_several_traces_one_without_a_rank_is_a_failure(tmp_path, capsys):
    d = tmp_path / "t"
    d.mkdir()
    _rankless(d / "trace.json")
    shutil.copy(DATA / "sampled_rank-1.json.gz", d / "sampled_rank-1.json.gz")
    assert main(["ingest", "kineto", str(d), "--out", str(tmp_path / "S")]) == 1
    assert "no rank" in capsys.readouterr().err


def test_without_a_layout_the_job_is_data_parallel_over_its_world_size(tmp_path, capsys):
    assert main(["ingest", "kineto", str(DATA / "sampled_rank-1.json.gz"), "--out", str(tmp_path / "S")]) == 0
    layout = Store.open(tmp_path / "S").attempt().layout
    assert (layout.world_size, layout.dp) == (128, 128)  # distributedInfo.world_size
    trace = tmp_path / "rank5.json"  # no world size in the trace: the ranks present bound it
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0",
                                                  "ts": 0, "dur": 5}]}))
    assert main(["ingest", "kineto", str(trace), "--out", str(tmp_path / "T")]) == 0
    assert Store.open(tmp_path / "T").attempt().layout.dp == 6
