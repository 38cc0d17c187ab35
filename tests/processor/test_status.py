"""The status file: one typed schema, one path, the keys its readers have always read."""

from __future__ import annotations

import json

from argus.processor.status import FlushProgress, ProcessorStatus, read_all_statuses, read_status, status_path

BASE_KEYS = ["started", "pid", "host", "socket", "connections", "ranks_seen", "frames", "events", "garbage_frames",
             "disconnects", "windows_written", "acked", "write_errors", "dropped_clients", "accept_errors",
             "refused_attempts", "runs"]


def test_counters_bumped_only_sometimes_are_absent_while_zero(tmp_path):
    status = ProcessorStatus(started=1.0, pid=42, host="node-0", socket="/tmp/s")
    doc = status.to_json()
    assert list(doc)[:len(BASE_KEYS)] == BASE_KEYS
    assert "attempts_forgotten" not in doc and "rank_pids" not in doc and "stopping" not in doc
    assert "remote_write" not in doc
    status.attempts_forgotten += 1
    status.rank_pids["123"] = 0
    status.stopping = FlushProgress(windows_left=3, busy_until=5.0)
    doc = status.to_json()
    assert doc["attempts_forgotten"] == 1 and doc["rank_pids"] == {"123": 0}
    assert doc["stopping"] == {"windows_left": 3, "busy_until": 5.0}


def test_acks_keep_the_last_fifty_and_runs_are_listed_once():
    status = ProcessorStatus()
    for w in range(60):
        status.note_ack({"window": w})
    assert status.windows_written == 60 and [a["window"] for a in status.acked] == list(range(10, 60))
    for _ in range(2):
        status.note_run("job/0", limit=10)
    assert status.runs == ["job/0"]
    assert status.count_drop("hello_timeout") == 1 and status.count_drop("hello_timeout") == 2


def test_read_status_reads_what_write_wrote_and_tolerates_partial_or_newer_files(tmp_path):
    path = status_path(tmp_path, "node-0")
    assert path == tmp_path / "processors" / "node-0.json"
    assert read_status(tmp_path, "node-0") is None
    status = ProcessorStatus(started=1.0, pid=42, host="node-0", socket="/tmp/s", ranks_seen=2,
                             stopping=FlushProgress(1, 2.0))
    status.write(path)
    back = read_status(tmp_path, "node-0")
    assert back == status
    path.write_text(json.dumps({"write_errors": 3, "a_newer_key": 1}))
    partial = read_status(tmp_path, "node-0")
    assert partial is not None and partial.write_errors == 3 and partial.pid == 0 and partial.stopping is None
    path.write_text("[1, 2]")
    assert read_status(tmp_path, "node-0") is None
    status.write(status_path(tmp_path, "node-0"))
    status.write(status_path(tmp_path, "node-1"))
    assert [s.host for s in read_all_statuses(tmp_path)] == ["node-0", "node-0"]
