"""Flight Recorder dumps: real ones written by torch's gloo process groups, and NCCL-format ones
written by the test for the fields gloo leaves empty (listed members, completion states)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from argus.analysis.evidence import check_evidence
from argus.flight_recorder import FlightRecorderError, hang_incidents, read_dumps, stuck_collectives
from argus.flight_recorder.stuck import MAX_STACK_FRAMES

pytest.importorskip("torch")

JOB = Path(__file__).with_name("fr_job.py")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    """``healthy``, ``skip`` and ``nested`` dump directories of real 4-rank gloo jobs."""
    out = tmp_path_factory.mktemp("fr")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "200", "OMP_NUM_THREADS": "1"}
    for scenario in ("skip", "nested"):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                               str(JOB), scenario, str(out)], env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "argus", "ingest", "flight-recorder", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_job_whose_collectives_all_completed_has_nothing_stuck(dumps):
    ds = read_dumps([dumps / "healthy"])
    assert sorted(ds.dumps) == [0, 1, 2, 3] and {d.version for d in ds.dumps.values()} and not ds.unreadable
    assert stuck_collectives(ds) == [] and hang_incidents(ds) == []
    done = _cli(str(dumps / "healthy"))
    assert done.returncode == 0 and "no collective is stuck" in done.stdout


def test_the_rank_waiting_nowhere_is_the_culprit_and_the_others_collectives_its_consequences(dumps):
    """Rank 3 never joins its tensor-parallel pair's all-reduce (rank 2 waits in it); ranks 0 and
    1 wait in a world all-reduce for 2 and 3. Rank 3 is named, confirmed; rank 2 is a victim."""
    ds = read_dumps([dumps / "nested"])
    stuck = {s.group_desc: s for s in stuck_collectives(ds)}
    assert set(stuck) == {"TENSOR_MODEL_PARALLEL_GROUP", "default_pg"}
    tp, world = stuck["TENSOR_MODEL_PARALLEL_GROUP"], stuck["default_pg"]
    assert (tp.arrived, tp.behind, tp.culprits, tp.seq) == ([2], [3], [3], 2)
    assert (world.arrived, world.behind, world.culprits) == ([0, 1], [2, 3], [3])
    (inc,) = hang_incidents(ds)
    assert inc.klass == "hang" and inc.culprit_ranks == [3] and inc.state == "confirmed"
    assert check_evidence(inc.evidence) == []
    assert inc.summary.startswith("rank 3 never joined all_reduce #2 of TENSOR_MODEL_PARALLEL_GROUP")
    assert "fr_job.py:" in inc.summary  # where rank 2 waits: the job's line, not torch's
    assert [e["group_desc"] for e in inc.evidence if e["kind"] == "stuck_collective"] == \
        ["TENSOR_MODEL_PARALLEL_GROUP", "default_pg"]
    # the stacks torch recorded: where rank 2 waits, where rank 3 went — the job's frames, not torch's
    tp = next(e for e in inc.evidence if e["kind"] == "stuck_collective")
    stacks = {s["role"]: s for s in tp["stacks"]}
    assert stacks["waiting"]["ranks"] == [2] and stacks["never_joined"]["ranks"] == [3]
    for s in stacks.values():
        assert s["frames"] and any("fr_job.py:" in f for f in s["frames"]), s
        assert not any(f"{os.sep}torch{os.sep}" in f for f in s["frames"])


def test_a_rank_that_never_used_a_gloo_group_is_only_suspected(dumps):
    """Gloo dumps do not list a group's members: a rank whose dump never mentions the group the
    others wait in is suspected, said so, never confirmed — and never "the network"."""
    (inc,) = hang_incidents(read_dumps([dumps / "skip"]))
    assert inc.culprit_ranks == [2] and inc.state == "suspected"
    assert "ranks 0, 1, 3 wait in all_reduce #1 of DATA_PARALLEL_GROUP" in inc.summary
    assert "do not list" in inc.summary


def test_a_killed_ranks_empty_dump_is_evidence_not_an_error(dumps, tmp_path):
    shutil.copytree(dumps / "nested", tmp_path / "d")
    (tmp_path / "d" / "fr_trace_3").write_bytes(b"")
    ds = read_dumps([tmp_path / "d"])
    assert sorted(ds.dumps) == [0, 1, 2] and "empty" in ds.unreadable[3]
    (inc,) = hang_incidents(ds)
    assert inc.culprit_ranks == [3] and inc.state == "suspected"
    assert any(e["kind"] == "unreadable_dump" and e["rank"] == 3 for e in inc.evidence)
    done = _cli(str(tmp_path / "d"), "--json")
    assert done.returncode == 1 and json.loads(done.stdout)["incidents"][0]["culprit_ranks"] == [3]
    assert "unreadable" in done.stderr


def _nccl(rank: int, entries: list[dict], members: str = "[0, 1, 2, 3]", version: str = "2.0") -> dict:
    """A dump as ProcessGroupNCCL writes one (format 2.0: no pg_status; states from the watchdog)."""
    return {"version": version, "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": members}},
            "entries": [{"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
                         "p2p_seq_id": 0, "op_id": seq, "profiling_name": op, "time_created_ns": 1_000 * seq,
                         "input_sizes": [size], "input_dtypes": [dtype], "output_sizes": [size],
                         "output_dtypes": [dtype], "state": state, "time_discovered_started_ns": None,
                         "time_discovered_completed_ns": None, "retired": False, "timeout_ms": 600_000,
                         "is_p2p": False, "frames": [{"name": "train", "filename": "/job/train.py", "line": 40 + seq}]}
                        for i, (seq, op, size, dtype, state) in enumerate(entries)]}


def _write(d: Path, dumps: dict[int, dict]) -> Path:
    d.mkdir()
    for rank, dump in dumps.items():
        (d / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    return d


def test_members_that_disagree_on_the_collective_are_a_mismatch(tmp_path):
    ok = [(1, "nccl:all_reduce", [1024], "Float", "completed"), (2, "nccl:all_reduce", [4096], "BFloat16", "started")]
    odd = [ok[0], (2, "nccl:all_gather", [512], "BFloat16", "started")]
    ds = read_dumps([_write(tmp_path / "d", {0: _nccl(0, ok), 1: _nccl(1, ok), 2: _nccl(2, odd), 3: _nccl(3, ok)})])
    (inc,) = hang_incidents(ds)
    assert inc.culprit_ranks == [2] and inc.state == "confirmed"
    assert "rank 2: all_gather [512] BFloat16" in inc.summary and "all_reduce [4096] BFloat16" in inc.summary


def test_members_that_differ_only_in_dtype_are_a_mismatch_named_by_the_dtype(tmp_path):
    """Same op, same sizes: rank 1 casts to float32 where the others all-reduce bfloat16 — the
    collective cannot match, and the summary says which dtype each side issued."""
    ok = [(1, "nccl:all_reduce", [1024], "Float", "completed"), (2, "nccl:all_reduce", [4096], "BFloat16", "started")]
    odd = [ok[0], (2, "nccl:all_reduce", [4096], "Float", "started")]
    ds = read_dumps([_write(tmp_path / "d", {0: _nccl(0, ok), 1: _nccl(1, odd), 2: _nccl(2, ok), 3: _nccl(3, ok)})])
    (s,) = stuck_collectives(ds)
    assert list(s.mismatch) == [1] and s.input_dtypes == ("BFloat16",) and s.input_sizes == ((4096,),)
    (inc,) = hang_incidents(ds)
    assert (inc.culprit_ranks, inc.state) == ([1], "confirmed")
    assert "rank 1: all_reduce [4096] Float" in inc.summary and "(the others: all_reduce [4096] BFloat16)" in inc.summary
    (ev,) = [e for e in inc.evidence if e["kind"] == "stuck_collective"]
    assert ev["mismatch"] == {"1": "all_reduce [4096] Float"} and check_evidence(inc.evidence) == []


TORCH_FILE = f"{os.sep}usr{os.sep}lib{os.sep}python3{os.sep}site-packages{os.sep}torch{os.sep}distributed{os.sep}c10d.py"


def _frames(site: str, depth: int = 22) -> list[dict]:
    """Innermost first: three of torch's frames, then ``depth`` of the job's, from ``site`` outwards."""
    return ([{"name": f"torch_{i}", "filename": TORCH_FILE, "line": i} for i in range(3)]
            + [{"name": f"{site}_{i}", "filename": f"/job/{site}.py", "line": 10 + i} for i in range(depth)])


def test_the_stacks_of_the_waiting_and_the_never_joined_ranks_are_kept_bounded_and_the_jobs_own(tmp_path):
    done = [(1, "nccl:all_reduce", [8], "Float", "completed")]
    stuck = [*done, (2, "nccl:all_reduce", [8], "Float", "started")]
    dumps = {r: _nccl(r, done if r == 3 else stuck) for r in range(4)}
    for r in (0, 1, 2):  # ranks 0 and 1 wait from the same line, rank 2 from another
        dumps[r]["entries"][1]["frames"] = _frames("train" if r < 2 else "eval")
    # rank 3 went on to a tensor-parallel all-reduce of its own, where it waits (its latest record)
    tp = {**dumps[3]["entries"][0], "record_id": 9, "process_group": ("1", "TP"), "pg_id": 1, "collective_seq_id": 7,
          "state": "started", "frames": _frames("model", 2)}
    dumps[3]["entries"].append(tp)
    ds = read_dumps([_write(tmp_path / "d", dumps)])
    (inc,) = hang_incidents(ds)
    assert inc.culprit_ranks == [3] and inc.state == "confirmed"
    (ev,) = [e for e in inc.evidence if e["kind"] == "stuck_collective"]
    assert check_evidence(inc.evidence) == []
    went, *waiting = ev["stacks"]
    assert (went["role"], went["ranks"], went["in"], went["state"]) == ("never_joined", [3], "all_reduce #7 of TP",
                                                                       "started")
    assert went["frames"] == ["model_0 (/job/model.py:10)", "model_1 (/job/model.py:11)"]
    assert [(w["role"], w["ranks"], w["n_ranks"], w["in"]) for w in waiting] == [
        ("waiting", [0, 1], 2, "all_reduce #2 of default_pg"), ("waiting", [2], 1, "all_reduce #2 of default_pg")]
    assert len(waiting[0]["frames"]) == MAX_STACK_FRAMES and waiting[0]["frames"][0] == "train_0 (/job/train.py:10)"
    assert not any("torch" in f for w in ev["stacks"] for f in w["frames"])

    from argus.report.model import IncidentView
    from argus.report.page import incident_section

    html = incident_section(IncidentView(inc.to_json()), lambda f: f.rel_path)
    table = html[html.index('<table class="fr-stacks">'):]
    table = table[:table.index("</table>")]
    assert "all_reduce #7 of TP" in table and "model_0 (/job/model.py:10)" in table and "eval_0" in table
    assert "c10d.py" not in table


def test_listed_members_name_a_rank_that_never_came_and_one_with_no_dump(tmp_path):
    """NCCL dumps list each group's ranks: rank 3, behind by one, is confirmed; with rank 3's file
    missing too, the world of 5 names rank 4 (no dump at all) as suspected instead."""
    done = [(1, "nccl:all_reduce", [8], "Float", "completed")]
    stuck = [*done, (2, "nccl:all_reduce", [8], "Float", "scheduled")]
    five = "[0, 1, 2, 3, 4]"
    d = _write(tmp_path / "d", {r: _nccl(r, done if r == 3 else stuck, five) for r in range(4)})
    (inc,) = hang_incidents(read_dumps([d]))
    assert (inc.culprit_ranks, inc.state) == ([3], "confirmed")
    (d / "nccl_trace_rank_3").unlink()
    ds = read_dumps([d])
    assert ds.world == 5 and ds.missing == [3, 4]
    (inc,) = hang_incidents(ds)
    assert (inc.culprit_ranks, inc.state) == ([3, 4], "suspected")


def test_every_member_in_and_none_done_names_no_rank(tmp_path):
    both = [(1, "nccl:all_reduce", [8], "Float", "completed"), (2, "nccl:all_reduce", [8], "Float", "started")]
    (inc,) = hang_incidents(read_dumps([_write(tmp_path / "d", {r: _nccl(r, both) for r in range(4)})]))
    assert inc.culprit_ranks == [] and inc.state == "suspected" and "not a rank that never came" in inc.summary


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_dump_that_would_import_anything_is_refused_and_nothing_runs(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "fr_0").write_bytes(pickle.dumps(_nccl(0, [])))
    (d / "fr_1").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Payload()]}))
    with pytest.raises(FlightRecorderError, match=r"refused.*posix\.system|refused.*os\.system"):
        read_dumps([d])
    done = subprocess.run([sys.executable, "-m", "argus", "ingest", "flight-recorder", str(d)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "refused" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "PWNED").exists()


def test_what_is_not_a_dump_is_said_so(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "fr_0").write_bytes(pickle.dumps([1, 2, 3]))
    (d / "fr_1").write_bytes(b"\x80\x04garbage")
    (d / "fr_2").write_text('{"version": "2.10", "entries": []}')  # the JSON form: a dump
    ds = read_dumps([d])
    assert "no 'entries'" in ds.unreadable[0] and "cannot decode" in ds.unreadable[1] and 2 in ds.dumps
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("no dump here")
    with pytest.raises(FlightRecorderError, match="no dump files"):
        read_dumps([tmp_path / "other"])  # nothing named <prefix><rank>


def test_with_the_jobs_store_the_culprit_gets_its_host_and_the_incident_is_stored(dumps, tmp_path):
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    simulate_to_store(SimConfig(ranks=4, steps=6, seed=1, gpus_per_host=2), "healthy", tmp_path / "s")
    done = _cli(str(dumps / "nested"), "--store", str(tmp_path / "s"), "--json")
    assert done.returncode == 1, done.stderr
    (inc,) = json.loads(done.stdout)["incidents"]
    attempt = Store.open(tmp_path / "s").attempt()
    assert inc["hosts"] == [str(attempt.topology().hosts[3])] and inc["window"]["start_step"] == 6
    rows = attempt.read("incidents").to_pylist()
    assert [(r["class"], list(r["culprit_ranks"])) for r in rows] == [("hang", [3])]


def test_one_dead_rank_of_a_many_group_moe_job_is_one_incident(tmp_path):
    """Megatron-style NCCL dumps (tp=2, ep=4, pp=4; tests/flight_recorder/megatron_dumps.py): rank
    12 never joins its expert-tensor group's _allgather_base. The collectives blocked behind it —
    issued by every member of their groups, completed by none, expert all_to_alls of unequal
    splits among them — are that incident's consequences, not incidents (a real dump set of this
    shape gave 23 incidents, 3 of them "confirmed" divergences of the all_to_all's splits)."""
    from tests.flight_recorder.megatron_dumps import write

    ds = read_dumps([write(tmp_path / "d", dead=12)])
    assert not any(s.mismatch for s in stuck_collectives(ds))
    (inc,) = hang_incidents(ds)
    assert (inc.culprit_ranks, inc.state) == ([12], "confirmed")
    assert inc.summary.startswith("rank 12 never joined _all_gather_base #6 of EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP")
    consequences = [e for e in inc.evidence if e["kind"] == "consequence"]
    descs = {e["group_desc"] for e in consequences}
    assert {"TENSOR_MODEL_PARALLEL_GROUP", "EXPERT_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP"} <= descs
    assert len(consequences) >= 10 and check_evidence(inc.evidence) == []


def test_a_dead_rank_without_a_dump_is_one_suspected_incident(tmp_path):
    """The same job with rank 12's dump missing (killed before it could write): one incident,
    rank 12 suspected (no dump is not proof), everything else its consequence."""
    from tests.flight_recorder.megatron_dumps import write

    ds = read_dumps([write(tmp_path / "d", dead=12, without=(12,))])
    assert ds.missing == [12]
    (inc,) = hang_incidents(ds)
    assert (inc.culprit_ranks, inc.state) == ([12], "suspected") and "no readable dump" in inc.summary


@pytest.mark.parametrize("dead", [0, 7])
def test_the_dead_rank_is_named_wherever_it_sits(tmp_path, dead):
    from tests.flight_recorder.megatron_dumps import write

    (inc,) = hang_incidents(read_dumps([write(tmp_path / "d", dead=dead)]))
    assert (inc.culprit_ranks, inc.state) == ([dead], "confirmed")


def test_an_all_to_all_of_unequal_splits_is_no_mismatch_but_another_dtype_is(tmp_path):
    """Per-rank split sizes differ by design; a member that sends another dtype cannot match."""
    def a2a(rank: int, dtype: str = "BFloat16") -> list:
        return [(1, "nccl:all_to_all", [64 + 8 * rank, 1024], dtype, "completed"),
                (2, "nccl:all_to_all", [96 - 8 * rank, 1024], dtype, "started")]

    ds = read_dumps([_write(tmp_path / "a", {r: _nccl(r, a2a(r)) for r in range(4)})])
    (inc,) = hang_incidents(ds)
    assert inc.culprit_ranks == [] and "none completed" in inc.summary
    odd = {r: _nccl(r, a2a(r, "Float" if r == 3 else "BFloat16")) for r in range(4)}
    odd[3]["entries"][0]["input_dtypes"] = odd[3]["entries"][0]["output_dtypes"] = ["BFloat16"]  # #1 matched
    (inc,) = hang_incidents(read_dumps([_write(tmp_path / "b", odd)]))
    assert (inc.culprit_ranks, inc.state) == ([3], "confirmed") and "rank 3: all_to_all [72x1024] Float" in inc.summary


def test_the_cli_tells_one_hang_and_counts_what_is_blocked_behind_it(tmp_path):
    from tests.flight_recorder.megatron_dumps import write

    done = _cli(str(write(tmp_path / "d", dead=12)))
    assert done.returncode == 1, done.stderr
    assert done.stdout.count("hang (") == 1 and "rank 12 never joined" in done.stdout
    text = " ".join(done.stdout.split())
    assert "blocked behind it, issued by every member: 7 × all_reduce of TENSOR_MODEL_PARALLEL_GROUP" in text
    assert "waits for ," not in text


def test_a_set_where_only_the_ranks_that_saw_the_timeout_dumped_names_the_rank_they_wait_for(tmp_path):
    """Newer backends dump on detection: only ranks 13–15, waiting in rank 12's expert-tensor
    collective, wrote. The 12 ranks without a dump are not 12 suspects: the one their waits name is."""
    from tests.flight_recorder.megatron_dumps import write

    ds = read_dumps([write(tmp_path / "d", dead=12, without=tuple(r for r in range(16) if r not in (13, 14, 15)))])
    assert len(ds.missing) == 13
    (inc,) = hang_incidents(ds)
    assert (inc.culprit_ranks, inc.state) == ([12], "suspected") and "no readable dump" in inc.summary
