"""The scanner: signatures, rank attribution, tracebacks, torchrun's report, bounded memory."""

from __future__ import annotations

from argus.joblog import LogKind, LogScanner
from argus.joblog.scanner import MAX_LINE


def _kinds(s: LogScanner) -> list[tuple[int, str, str]]:
    events, _ = s.take()
    return [(e.rank, str(e.kind), e.text) for e in events]


def test_signatures_and_the_ranks_lines_carry():
    s = LogScanner(pid_rank={4242: 5}.get)
    s.feed("stderr", b"node-3:4242:4290 [1] NCCL WARN NET/IB : Got completion from peer with error 12\n")
    s.feed("stderr", b"[rank2]:[E1203 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation "
                     b"timeout: WorkNCCL(SeqNum=51, OpType=ALLREDUCE) ran for 600018 milliseconds\n")
    s.feed("stderr", b"[PG ID 0 PG GUID 0(default_pg) Rank 6] Watchdog caught collective operation timeout\n")
    s.feed("stdout", b"[default7]:NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n")
    s.feed("stdout", b"epoch 1 step 40 loss 2.31\n")
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(5, "nccl_warn"), (2, "watchdog_timeout"), (6, "watchdog_timeout"),
                                           (7, "xid")]
    assert got[1][2].startswith("[E1203")  # the prefix is taken off, the rest kept
    _, other = s.take()
    assert other == {}  # counted lines were taken with the first take
    s.feed("stdout", b"a\nb\n")
    assert s.take()[1] == {(-1, "stdout"): 2}


def test_an_uncaught_traceback_is_one_event_at_its_innermost_frame_and_keeps_an_oom_its_kind():
    s = LogScanner()
    tb = (b"[rank1]: Traceback (most recent call last):\n"
          b'[rank1]:   File "/job/train.py", line 80, in <module>\n[rank1]:     main()\n'
          b'[rank1]:   File "/job/train.py", line 41, in step\n[rank1]:     loss = model(x)\n'
          b"[rank1]: RuntimeError: shape mismatch\n")
    s.feed("stderr", tb[:50])  # in pieces, as a pipe delivers them
    s.feed("stderr", tb[50:])
    s.feed("stderr", b"[rank0]: Traceback (most recent call last):\n"
                     b'[rank0]:   File "/job/train.py", line 41, in step\n'
                     b"[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    got = _kinds(s)
    assert got == [(1, "exception", "RuntimeError: shape mismatch at step (/job/train.py:41)"),
                   (0, "oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB at step "
                              "(/job/train.py:41)")]


def test_torchruns_failure_report_names_the_killed_rank_and_the_ones_it_stopped():
    s = LogScanner()
    s.feed("stderr", b"Traceback (most recent call last):\n  File \"run.py\", line 1, in <module>\n"
                     b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                     b"Failures:\n[1]:\n  time      : 2026-12-03_18:00:38\n  host      : node-1\n"
                     b"  rank      : 2 (local_rank: 2)\n  exitcode  : -15 (pid: 11)\n"
                     b"Root Cause (first observed failure):\n[0]:\n  rank      : 3 (local_rank: 3)\n"
                     b"  exitcode  : -9 (pid: 12)\n  error_file: <N/A>\n")
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(2, "stopped"), (3, "killed")]  # the launcher's own traceback: no event
    assert "SIGKILL" in got[1][2]


def test_memory_is_bounded_by_line_length_and_event_count():
    s = LogScanner(max_events=3)
    s.feed("stdout", b"x" * (3 * MAX_LINE))  # no newline yet: only MAX_LINE kept
    assert len(s._partial["stdout"]) == MAX_LINE
    s.feed("stdout", b" NCCL WARN late\n")  # cut: the signature past MAX_LINE is not seen
    for _ in range(5):
        s.feed("stderr", b"NCCL WARN again\n")
    events, other = s.take()
    assert len(events) == 3 and s.dropped == 2 and other == {(-1, "stdout"): 1}
    s.feed("stderr", b"NCCL WARN no newline")
    s.close()  # the job's last words are scanned
    assert s.dropped == 3 and LogKind.NCCL_WARN == "nccl_warn"
