"""argus run's job log channel on a real gloo job: one rank warns like NCCL, one raises, one is
killed. The job's output passes through unchanged; the events are stored with their ranks and
times; the diagnosis makes a fail-stop of them and the report shows the lines next to it, and
every event (the NCCL warning no incident took too) in its job log section."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from argus.store import Store
from tests.e2e.jobs import env

JOB = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
       str(Path(__file__).with_name("log_job.py"))]


def _run(cmd: list[str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, timeout=300, env=env(OMP_NUM_THREADS="1", **extra))


def test_the_jobs_own_words_are_stored_with_their_ranks_and_shown_with_the_fail_stop(tmp_path):
    store, kernel = tmp_path / "store", tmp_path / "kern.log"
    kernel.write_text("4,100,1000,-;an older line: Out of memory: Killed process 1 (init)\n")  # before the run
    t0 = time.time_ns()
    traced = _run([sys.executable, "-m", "argus", "run", "--store", str(store), "--no-stacks",
                   "--kernel-log", str(kernel), "--", *JOB], KERNEL_LOG=str(kernel))
    t1 = time.time_ns()
    plain = _run(JOB)
    assert traced.returncode == plain.returncode == 1
    # every byte the ranks printed, as they printed it: four processes share one stream, so their
    # writes interleave differently run to run (a line's newline can land after another rank's
    # text, traced or not): the same bytes, and the same 24 lines of text in it
    assert len(traced.stdout) == len(plain.stdout) and sorted(traced.stdout) == sorted(plain.stdout)
    lines = [re.findall(rb"rank \d step \d sum \d+", p.stdout) for p in (traced, plain)]
    assert sorted(lines[0]) == sorted(lines[1]) and len(lines[0]) >= 4 * 4
    assert b"rank 0 step 3 sum 256" in traced.stdout and b"loss is nan" in traced.stderr

    attempt = Store.open(store).attempt()
    rows = [r for r in attempt.read("logs").to_pylist() if r["kind"] != "other"]
    got = {(r["kind"], r["rank"]) for r in rows}
    assert {("nccl_warn", 1), ("exception", 2), ("killed", 3)} <= got, rows
    assert all(t0 <= r["ts_ns"] <= t1 for r in rows)
    (exc,) = [r for r in rows if r["kind"] == "exception"]
    assert exc["text"].startswith("ValueError: loss is nan at <module> (") and "log_job.py" in exc["text"]
    assert sum(r["lines"] for r in attempt.read("logs").to_pylist() if r["kind"] == "other") > 0  # counted only
    # the kernel's word for rank 3's SIGKILL, read from the kernel log from the run's start on
    (oom,) = [r for r in rows if r["stream"] == "kernel"]
    assert (oom["kind"], oom["rank"]) == ("oom", 3) and "Out of memory: Killed process" in oom["text"]

    report = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "argus", "report", str(store), "--out", str(report)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    html = report.read_text()
    sections = [x.split("</section>")[0] for x in html.split('<section class="card incident"')[1:]]
    fail_stops = [x for x in sections if "</span> fail_stop <" in x]
    assert len(fail_stops) == 1, [x[:300] for x in sections]
    section = fail_stops[0]
    assert "ranks 2, 3 failed" in section  # not rank 0, whose read failed when they went: a victim
    assert "The job&#x27;s log" in section or "The job's log" in section
    assert "loss is nan" in section and "SIGKILL" in section and "Out of memory: Killed process" in section
    # rank 1's NCCL warning stopped nothing and no incident took it: the report's job log shows it
    job_log = html[html.index('<section class="card job-log"'):]
    job_log = job_log[:job_log.index("</section>")]
    warn = re.search(r'data-kind="nccl_warn">(.*?)</table>', job_log, re.S)
    assert warn, job_log[:2000]
    assert "NCCL WARN NET/IB : Got completion from peer with error 12" in warn.group(1)
    assert "<td>1</td>" in warn.group(1) and "<td>stderr</td>" in warn.group(1)  # rank 1's, from its stderr
    assert 'data-kind="exception"' in job_log and 'data-kind="killed"' in job_log
