"""Hangs read the counts: the rank behind on a group's issued collectives is the culprit; the
collective itself is blamed only when every member has issued it and none completes."""

from __future__ import annotations

import json
import time

from argus.analysis import DiagnoseConfig, diagnose
from argus.store import TABLES, Store
from argus.topology import RunIdentity, Topology, parse_layout

GROUP = 8039201830801555756


def _snapshot(tmp_path, states: dict[int, tuple[int, int, str, str]], alive: set[int] | None = None,
              resumed: bool = False):
    """A 4-rank dp job's hang snapshot: rank → (issued, completed, activity, stack)."""
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
               "groups": json.dumps([{"key": GROUP, "kind": "dp", "size": 4, "first_rank": 0, "issued": issued,
                                      "completed": completed, "op": "dp-allreduce"}])}
        for c in cols:
            cols[c].append(row[c])
    w.write("hangs", cols, window=0)
    return [i for i in diagnose(attempt, DiagnoseConfig(store_incidents=False)).incidents if i.klass == "hang"]


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
