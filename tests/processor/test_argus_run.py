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
