"""Hangs read the counts: the rank behind on a group's issued collectives is the culprit; the
collective itself is blamed only when every member has issued it and none completes."""

from __future__ import annotations

import json
import time

import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.store import TABLES, Store
from argus.topology import RunIdentity, Topology, parse_layout

GROUP = 8039201830801555756


def _snapshot(tmp_path, states: dict[int, tuple[int, int, str, str]], alive: set[int] | None = None,
              resumed: bool = False, proc_state: dict[int, str] | None = None, klass: str = "hang", before=None):
    """A 4-rank dp job's hang snapshot: rank → (issued, completed, activity, stack); every
    process sleeping (S) but those ``proc_state`` says otherwise of."""
    store = Store.create(tmp_path / "s")
    attempt = store.create_attempt(RunIdentity("job"), Topology.uniform(parse_layout("dp=4"), gpus_per_host=4),
                                   source="test")
    now = time.time_ns()
    w = attempt.writer("host0")
    steps = {c: [] for c in TABLES["steps"].column_names}
    for step in range(14 if resumed else 12):  # resumed: steps 12 and 13 end after the snapshot
        for r in range(4):
            row = {"rank": r, "step": step, "start_ns": now - (13 - step) * 10**8, "end_ns": now - (12 - step) * 10**8}
            for c in steps:
                steps[c].append(row.get(c, 0))
    w.write("steps", steps, window=0)
    cols: dict[str, list] = {c: [] for c in TABLES["hangs"].column_names}
    for rank, (issued, completed, activity, stack) in states.items():
        row = {"detected_ns": now, "stalled_s": 30.0, "threshold_s": 10.0, "rank": rank, "host": "h0",
               "alive": alive is None or rank in alive, "step": 12, "steps_done": 11, "activity": activity,
               "activity_since_ns": now - 31 * 10**9, "waiting": issued > completed, "group_key": GROUP,
               "group_kind": "dp", "group_size": 4, "group_first_rank": 0, "op": "dp-allreduce", "issued": issued,
               "completed": completed, "pending_since_ns": 0, "stack": stack,
               "proc_state": (proc_state or {}).get(rank, "S"),
               "groups": json.dumps([{"key": GROUP, "kind": "dp", "size": 4, "first_rank": 0, "issued": issued,
                                      "completed": completed, "op": "dp-allreduce"}])}
        for c in cols:
            cols[c].append(row[c])
    w.write("hangs", cols, window=0)
    if before is not None:
        before(attempt)
    return [i for i in diagnose(attempt, DiagnoseConfig(store_incidents=False)).incidents if i.klass == klass]


def test_the_rank_behind_on_issued_collectives_is_the_culprit_even_with_a_pending_count(tmp_path):
    # the repro's shape: rank 2 blocked before backward; its last completion was recorded late,
    # so its own counts say issued 23 > completed 22, against 25 issued everywhere else
    waiting = (25, 23, "backward-compute", "")
    (inc,) = _snapshot(tmp_path, {0: waiting, 1: waiting, 2: (23, 22, "", "<module> (train.py:95)"), 3: waiting})
    assert inc.culprit_ranks == [2]
    assert "never joined" in inc.summary and "3 ranks wait" in inc.summary
    assert {"level": "L5", "kind": "stack", "rank": 2, "frames": "<module> (train.py:95)"} in inc.evidence


def test_every_member_inside_the_same_collective_blames_the_collective_not_a_rank(tmp_path):
    (inc,) = _snapshot(tmp_path, {r: (25, 24, "dp-allreduce", "") for r in range(4)})
    assert inc.culprit_ranks == []
    assert "the collective itself does not complete" in inc.summary


def test_a_dead_rank_is_the_culprit(tmp_path):
    (inc,) = _snapshot(tmp_path, {r: (25, 24, "dp-allreduce", "") for r in range(4)}, alive={0, 1, 3})
    assert inc.culprit_ranks == [2]


def test_a_stall_the_job_recovered_from_is_no_hang(tmp_path):
    # a 31 s recompilation crossed the 30 s threshold, then every rank trained on: a long stall,
    # which L2 finds as a host stall with its cause, not a hang to restart for
    waiting = (25, 23, "backward-compute", "")
    assert _snapshot(tmp_path, {0: waiting, 1: waiting, 2: (23, 22, "compile", ""), 3: waiting}, resumed=True) == []


def test_a_frozen_rank_inside_the_collective_is_the_culprit_not_the_network(tmp_path):
    """Rank 1 stopped (SIGSTOP) inside its all-reduce: its counts match everyone's, as a dead link
    would leave them; its process state does not."""
    (inc,) = _snapshot(tmp_path, {r: (25, 24, "dp-allreduce", "") for r in range(4)}, proc_state={1: "T"})
    assert inc.culprit_ranks == [1] and "its process is stopped" in inc.summary
    assert not any(p in inc.summary for p in ("a link", "network"))


@pytest.mark.parametrize("dead", [{0}, {1}, {0, 1}, {0, 1, 2, 3}])
def test_a_rank_killed_with_the_job_after_it_waited_is_no_culprit(tmp_path, dead):
    """The hang drill's teardown: rank 1 stopped inside its all-reduce, the others waiting; the
    operator's SIGTERM then ends the ranks in any order, and the processor's next snapshot finds
    some dead. A rank seen running and waiting on the others earlier in the hang is the job's end,
    not its cause (CI named ranks 0 and 1); the frozen rank, dead later, stays the culprit (the
    next CI run found no hang at all once rank 1, frozen and "waiting", died too)."""
    def later(attempt):
        t = attempt.read("hangs").to_pylist()
        for row in t:
            row["detected_ns"] += 5 * 10**9
            row["stalled_s"] += 5.0
            row["alive"] = row["rank"] not in dead
            row["proc_state"] = "" if row["rank"] in dead else row["proc_state"]
        cols = {c: [r[c] for r in t] for c in TABLES["hangs"].column_names}
        attempt.writer("host0").write("hangs", cols, window=1)

    (inc,) = _snapshot(tmp_path, {r: (25, 24, "dp-allreduce", "") for r in range(4)}, proc_state={1: "T"},
                       before=later)
    assert inc.culprit_ranks == [1]


def test_a_rank_frozen_for_a_while_is_a_host_stall_once_the_job_goes_on(tmp_path):
    """The same freeze, resumed before the job died: no hang, and no rank to blame from the
    timings either — the snapshot's process state names it, a host stall. A stall with every
    process sleeping (a recompilation on one rank) stays the timings' to judge."""
    same = {r: (25, 24, "dp-allreduce", "") for r in range(4)}
    assert _snapshot(tmp_path / "a", same, resumed=True) == []
    (inc,) = _snapshot(tmp_path / "b", same, resumed=True, proc_state={1: "D"}, klass="host_stall")
    assert inc.culprit_ranks == [1] and inc.state == "confirmed"
    assert "uninterruptible sleep" in inc.summary and "the job then went on" in inc.summary


def _live_dumps(behind: int | None):
    """What the ranks write when their processor asks at the hang (``write_live_dump``): NCCL-format
    rings, 25 dp all-reduces issued by every rank but ``behind`` (24 there)."""
    import pickle

    from argus.producer.flight_recorder import write_live_dump
    from argus.store import FLIGHT_RECORDER_DIR
    from tests.flight_recorder.test_stuck import _nccl

    def write(attempt):
        for r in range(4):
            ring = [(s, "nccl:all_reduce", [1024], "Float", "completed") for s in range(1, 25)]
            ring += [] if r == behind else [(25, "nccl:all_reduce", [1024], "Float", "started")]
            data = pickle.dumps(_nccl(r, ring))
            assert write_live_dump(str(attempt.path / FLIGHT_RECORDER_DIR), r, dump=lambda data=data: data)
    return write


def test_the_flight_recorder_rings_dumped_live_name_the_rank_the_counts_could_not(tmp_path):
    """Every member's counts say it is inside the same all-reduce (a collective C++ started on
    rank 3's behalf), so the counts blame the collective; the rings the ranks dumped at the
    processor's request say rank 3 never entered sequence 25."""
    (inc,) = _snapshot(tmp_path, {r: (25, 24, "dp-allreduce", "") for r in range(4)}, before=_live_dumps(3))
    assert inc.culprit_ranks == [3] and "the Flight Recorder" in inc.summary
    assert any(e["kind"] == "stuck_collective" and e["level"] == "flight_recorder" for e in inc.evidence)


def test_the_flight_recorder_agreeing_with_the_counts_is_said(tmp_path):
    waiting = (25, 23, "backward-compute", "")
    (inc,) = _snapshot(tmp_path, {0: waiting, 1: waiting, 2: (23, 22, "", ""), 3: waiting}, before=_live_dumps(2))
    assert inc.culprit_ranks == [2] and "Flight Recorder rings, dumped live, agree" in inc.summary


def test_a_live_dump_is_written_whole_or_not_at_all(tmp_path):
    from argus.producer.flight_recorder import write_live_dump

    def broken():
        raise RuntimeError("no process group")

    assert not write_live_dump(str(tmp_path / "fr"), 1, dump=broken) and not (tmp_path / "fr").exists()
    assert not write_live_dump(str(tmp_path / "fr"), 1, dump=lambda: None)
    assert write_live_dump(str(tmp_path / "fr"), 1, dump=lambda: b"ring")
    assert [p.name for p in (tmp_path / "fr").iterdir()] == ["rank1"] and (tmp_path / "fr" / "rank1").read_bytes() == b"ring"
