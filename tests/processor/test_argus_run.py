"""``argus run`` around its processor: a stuck one is killed promptly; its log is never a planted link."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

from argus.cli.run import PROCESSOR_STALL_S, _open_log

# The job: wait for the processor's status file, stop the processor (SIGSTOP: it can neither
# flush nor exit on SIGTERM), then exit 3.
_JOB = """
import json, os, signal, sys, time
path = os.path.join(sys.argv[1], "processors", "node-x.json")
deadline = time.time() + 60
while time.time() < deadline:
    try:
        pid = json.load(open(path))["pid"]
        break
    except (OSError, ValueError, KeyError):
        time.sleep(0.05)
os.kill(pid, signal.SIGSTOP)
print("JOB_DONE", time.time(), flush=True)
sys.exit(3)
"""


def test_a_stuck_processor_is_killed_within_seconds_and_the_jobs_exit_code_returned(tmp_path):
    store = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-m", "argus", "run", "--store", str(store), "--host", "node-x",
                           "--no-stacks", "--", sys.executable, "-c", _JOB, str(store)],
                          capture_output=True, text=True, timeout=120)
    ended = time.time()
    assert proc.returncode == 3, proc.stderr
    job_done = float(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("JOB_DONE")))
    assert ended - job_done < PROCESSOR_STALL_S + 6, (ended - job_done, proc.stderr)
    assert "made no progress flushing for 5 s (was ended by SIGKILL)" in proc.stderr, proc.stderr
    assert "None" not in proc.stderr


def test_the_log_is_created_private_and_never_through_a_planted_link(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious")
    log = tmp_path / "run-1.log"
    log.symlink_to(target)
    fd = _open_log(log)
    os.write(fd, b"processor output")
    os.close(fd)
    assert target.read_text() == "precious"
    st = os.lstat(log)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def test_what_the_processor_lost_is_said_on_exit(tmp_path):
    """Issue 28: ``argus run`` says when its processor dropped records or could not write — from
    the store's drops table (this host's rows) and the status file's write errors."""
    import json

    from argus.cli.main import main
    from argus.cli.run import _losses
    from argus.store import Store, conform

    store = tmp_path / "s"
    assert main(["simulate", "--scenario", "healthy", "--out", str(store), "--ranks", "4", "--steps", "2"]) == 0
    attempt = Store.open(store).attempt()
    run = attempt.identity.run_id
    assert _losses(str(store), "vm", [run]) == []  # nothing lost, nothing said
    rows = {"window": [0, 1, 0], "rank": [2, 2, -1], "host": ["vm", "vm", "other"], "table": ["phases"] * 3,
            "events": [40, 2, 7], "batches": [1, 1, 1], "reason": ["queue_full", "memory_cap", "queue_full"]}
    attempt.writer("test").write("drops", conform("drops", rows), window=0)
    (store / "processors").mkdir(exist_ok=True)
    (store / "processors" / "vm.json").write_text(json.dumps({"write_errors": 3}))
    said = _losses(str(store), "vm", [run])
    assert said[0] == "could not write 3 window(s) into the store (its log says why)"
    assert said[1].startswith("dropped 42 record(s) (2 memory cap, 40 queue full)"), said
    assert _losses(str(store), "vm", ["another-run"]) == said[:1]  # only the runs it traced
