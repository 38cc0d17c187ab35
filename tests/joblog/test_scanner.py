"""The scanner: signatures, rank attribution, tracebacks, torchrun's report, bounded memory."""

from __future__ import annotations

from argus.joblog import FAIL_STOP_KINDS, LogKind, LogScanner
from argus.joblog.scanner import MAX_LINE


def _kinds(s: LogScanner) -> list[tuple[int, str, str]]:
    events, _ = s.take()
    return [(e.rank, str(e.kind), e.text) for e in events]


def test_signatures_and_the_ranks_lines_carry():
    s = LogScanner(pid_rank={4242: 5}.get, local_offset=0)  # one node: local ranks are global
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


def test_nccl_connect_failures_warn_or_info_are_their_own_kind_with_the_ranks_pid():
    s = LogScanner(pid_rank={4242: 5, 4343: 6}.get)
    s.feed("stderr", b"node-3:4242:4290 [1] NCCL WARN NET/Socket : Connect to 10.0.0.2<43411> failed : "
                     b"Connection refused\n"
                     b"node-3:4343:4390 [2] NCCL INFO Call to connect returned Connection refused, retrying\n"
                     b"node-3:4343:4390 [2] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                     b"172.16.0.4<35193> failed : Software caused connection abort\n"
                     b"node-3:4343:4390 [2] NCCL INFO Call to connect returned Connection timed out, retrying\n"
                     b"node-3:4242:4290 [1] NCCL WARN NET/IB : Got completion from peer with error 12\n"
                     b"node-3:4242:4290 [1] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
                     b"db.py: connect to postgres failed: connection refused\n")  # not NCCL's: not an event
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(5, "nccl_connect"), (6, "nccl_connect"), (6, "nccl_connect"),
                                           (6, "nccl_connect"), (5, "nccl_warn")]
    assert "Connect to 10.0.0.2<43411> failed" in got[0][2]


def test_cuda_errors_in_a_line_a_traceback_or_a_cpp_abort_are_cuda_errors():
    s = LogScanner()
    s.feed("stderr", b"[rank4]: Traceback (most recent call last):\n"
                     b'[rank4]:   File "/job/train.py", line 90, in step\n'
                     b"[rank4]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
                     b"[rank5]:terminate called after throwing an instance of 'c10::Error'\n"
                     b"[rank5]:  what():  CUDA error: device-side assert triggered\n"
                     b"[rank6]:[E ProcessGroupNCCL.cpp:1536] [PG 0 Rank 6] Process group watchdog thread "
                     b"terminated with exception: CUDA error: unspecified launch failure\n"
                     b"[rank7]: cudaErrorLaunchFailure returned by cudaStreamSynchronize\n")
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(4, "cuda_error"), (5, "cuda_error"), (6, "cuda_error"),
                                           (7, "cuda_error")]
    assert got[0][2] == ("RuntimeError: CUDA error: an illegal memory access was encountered at step "
                         "(/job/train.py:90)")
    assert LogKind.CUDA_ERROR in FAIL_STOP_KINDS


def test_dataloader_workers_killed_gone_or_timed_out_are_dataloader_events():
    s = LogScanner()
    s.feed("stderr", b"[rank1]:ERROR: Unexpected bus error encountered in worker. This might be caused by "
                     b"insufficient shared memory (shm).\n"
                     b"[rank1]: Traceback (most recent call last):\n"
                     b'[rank1]:   File "/job/train.py", line 12, in <module>\n'
                     b"[rank1]: RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error.\n"
                     b"[rank2]: RuntimeError: DataLoader worker (pid(s) 4243, 4244) exited unexpectedly\n"
                     b"[rank3]: RuntimeError: DataLoader timed out after 30 seconds\n"
                     b"[rank3]: loading DataLoader workers: 8\n")  # not a failure
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(1, "dataloader"), (1, "dataloader"), (2, "dataloader"),
                                           (3, "dataloader")]
    assert got[1][2].endswith("is killed by signal: Bus error. at <module> (/job/train.py:12)")
    assert LogKind.DATALOADER not in FAIL_STOP_KINDS  # a warning: a host stall's evidence, not a stop by itself


def test_checkpoint_saves_trainers_report_are_events_with_their_path():
    """What trainers print when they save: the correctness plane names the suspect checkpoints
    after a corruption by these paths (``analysis/sdc.py``)."""
    from argus.joblog.signatures import SIGNATURES

    s = LogScanner()
    s.feed("stdout", b"[rank0]:Saving model checkpoint to /out/checkpoint-500\n"
                     b"[rank1]: saving checkpoint at iteration     100 to /ckpt/megatron in torch format\n"
                     b"[rank2]:[INFO] [engine.py:3000:_save_checkpoint] Saving model checkpoint: "
                     b"/x/global_step100/mp_rank_00_model_states.pt\n"
                     b"[rank3]:Epoch 0, global step 100: 'val_loss' reached 0.5, saving model to '/l/e=0.ckpt' as top 1\n"
                     b"[rank3]:Saving the checkpoint (or staging if async is enabled).\n"  # no path: not one
                     b"[rank3]:saving 12 samples to the cache\n")
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(0, "checkpoint"), (1, "checkpoint"), (2, "checkpoint"), (3, "checkpoint")]
    pattern = next(sig.pattern for sig in SIGNATURES if sig.kind == LogKind.CHECKPOINT)
    assert [pattern.search(t).group("path") for _, _, t in got] == [
        "/out/checkpoint-500", "/ckpt/megatron", "/x/global_step100/mp_rank_00_model_states.pt", "/l/e=0.ckpt"]
    assert LogKind.CHECKPOINT not in FAIL_STOP_KINDS


def test_a_long_line_of_signature_words_costs_one_pass():
    """Patterns with a wildcard between two words are atomic on the first: before, a 64 KiB line of
    ``NCCL INFO`` repeated took seconds to scan (every occurrence retried to the line's end), and the
    tee thread reading the job's output would have stalled behind it."""
    import time

    s = LogScanner()
    lines = [b"NCCL INFO " * 6500, b"ProcessGroupGloo " * 3800, b"NVRM: Xid (" * 5900, b"oom-kill: " * 6500,
             b"saving checkpoint " * 3600]
    t0 = time.process_time()
    for line in lines:
        s.feed("stdout", line[:MAX_LINE - 1] + b"\n")
    assert time.process_time() - t0 < 2.0  # was ~10 s; now a few ms
    assert s.take()[1] == {(-1, "stdout"): 5}


def test_torchruns_local_prefix_yields_to_the_global_rank_and_stays_local_without_the_nodes_place():
    """A real multi-node torchrun log line: ``[default0]`` is local rank 0 of its node, ``[rank12]``
    the job's rank — the ECC error is rank 12's (it was blamed on rank 0)."""
    line = (b"[default0]:[rank12]:[E1203 10:41:07.123 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) "
            b"Rank 12] Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC "
            b"error encountered\n")
    s = LogScanner()
    s.feed("stderr", line)
    s.feed("stderr", b"[default3]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(12, "cuda_error"), (-1, "oom")]
    assert got[0][2].startswith("[E1203") and got[1][2].startswith("[local rank 3] torch.OutOfMemoryError")
    s = LogScanner(local_offset=8)  # node rank 1 of nodes of 8 (the launch said so)
    s.feed("stderr", b"[default3]:torch.OutOfMemoryError: CUDA out of memory.\n")
    assert [(r, k) for r, k, _ in _kinds(s)] == [(11, "oom")]


def test_where_a_launch_puts_its_nodes_local_ranks():
    from argus.joblog.launch import local_rank_offset as offset

    assert offset(["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "x"]) == 0
    assert offset(["torchrun", "--nnodes=1", "--nproc_per_node=8", "train.py"]) == 0
    assert offset(["torchrun", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "8", "train.py"]) == 8
    assert offset(["torchrun", "--nnodes=2", "--node_rank=1", "--nproc_per_node=8", "train.py"]) == 8
    assert offset(["torchrun", "--nnodes=1:4", "--nproc_per_node=8", "train.py"]) is None  # elastic: not said
    assert offset(["torchrun", "--nproc_per_node=gpu", "--node_rank=1", "train.py"]) is None
    assert offset(["torchrun", "train.py", "--node_rank=3", "--nproc_per_node=2"]) is None  # the script's own flags
    assert offset(["python", "train.py"]) is None


def test_pytorchs_desync_report_names_its_ranks_not_the_rank_that_printed_it():
    """On one line (as a public bug report quotes it), over several (as TraceUtils prints it), and
    for a rank that never joined: each named rank gets a ``desync`` event; rank 0 only waited."""
    s = LogScanner()
    s.feed("stderr", b"[rank0]:[E1204 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
                     b"WorkNCCL(SeqNum=183, OpType=ALLREDUCE) ran for 600041 milliseconds before timing out.\n"
                     b"[rank0]:[E1204 ProcessGroupNCCL.cpp:1412] [PG ID 0 PG GUID 0(default_pg) Rank 0] To our best "
                     b"knowledge, the lagging/dead/mismatched ranks that caused the desync are: [7] finished "
                     b"collective #182, but didn't join collective #183 (count from 1)\n")
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(0, "watchdog_timeout"), (7, "desync")]
    assert "printed by rank 0" in got[1][2] and "didn't join collective #183" in got[1][2]
    s.feed("stderr", b"[rank3]: - To our best knowledge, the lagging/dead/mismatched ranks that caused the desync are:\n"
                     b"[rank3]:   - [5, 9] joined but didn't finish collective #41207 (count from 1)\n"
                     b"[rank3]:     [0, 1, 2, ...] finished collective #41207, but didn't join collective #41208\n"
                     b"[rank3]: - Snapshot of ranks' latest states:\n")
    assert [(r, k) for r, k, _ in _kinds(s)] == [(5, "desync"), (9, "desync")]
    s.feed("stderr", b"[rank1]: - To our best knowledge, ranks [47] are the lagging ranks that caused this timeout.\n")
    (ev,) = _kinds(s)
    assert ev[:2] == (47, "desync") and "never joined" in ev[2]


def test_a_loggers_time_stamp_before_the_rank_prefix_and_torchruns_agent_line():
    """"2024-11-20 14:37:16 [rank3]: …" is rank 3's; the agent's "failed (exitcode: -9) local_rank: 3"
    names a local rank: global with the launch's offset, else kept local in the text."""
    s = LogScanner()
    s.feed("stderr", b"2024-11-20 14:37:16 [rank3]: torch.OutOfMemoryError: CUDA out of memory.\n"
                     b"[2024-11-26 02:04:31,514] torch.distributed.elastic.multiprocessing.api: [ERROR] failed "
                     b"(exitcode: -11) local_rank: 1 (pid: 750662) of binary: /usr/bin/python\n")
    assert [(r, k, t) for r, k, t in _kinds(s)] == [
        (3, "oom", "torch.OutOfMemoryError: CUDA out of memory."),
        (-1, "killed", "local rank 1 (pid 750662) ended by signal 11 (SIGSEGV)")]
    s = LogScanner(local_offset=4)
    s.feed("stderr", b"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 3 (pid: 17)"
                     b" of binary: /usr/bin/python\n")
    assert _kinds(s) == [(7, "worker_failed", "rank 7 (pid 17) exited with code 1")]


def test_a_local_rank_note_belongs_to_its_own_line_only():
    s = LogScanner()
    s.feed("stderr", b"[default3]:torch.OutOfMemoryError: CUDA out of memory.\n"
                     b"[rank5]: torch.OutOfMemoryError: CUDA out of memory.\n")
    assert _kinds(s) == [(-1, "oom", "[local rank 3] torch.OutOfMemoryError: CUDA out of memory."),
                         (5, "oom", "torch.OutOfMemoryError: CUDA out of memory.")]


# torchrun 2.13's agent on node 1, node 0's agent (the store's server) gone first — as captured here
_EXIT_BARRIER_LOG = (
    b"[W1206 21:04:20.296362755 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=3, "
    b"addr=[::ffff:127.0.0.1]:59512, remote=[::ffff:127.0.0.1]:53561): Connection reset by peer\n"
    b"Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 (most recent "
    b"call first):\nframe #0: c10::Error::Error(c10::SourceLocation) + 0x9d (0x7f49 in libc10.so)\n\n"
    + b"".join(b"E1206 21:04:20.788000 26421 site-packages/torch/distributed/elastic/agent/server/api.py:1008] " + x
               + b"\n" for x in (
        b"Error waiting on exit barrier. Elapsed: 0.0055773258209228516 seconds",
        b"Traceback (most recent call last):",
        b'  File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py", line 994, '
        b"in _exit_barrier",
        b"    store_util.barrier(",
        b'  File "/usr/lib/python3.11/site-packages/torch/distributed/elastic/utils/store.py", line 159, in '
        b"_barrier_nonblocking",
        b"    idx = store.add(num_members_key, 1)",
        b"          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        b"torch.distributed.DistNetworkError: Connection reset by peer")))


def test_the_launchers_failed_exit_barrier_is_its_teardown_not_a_lost_peer():
    """A node's agent, its workers done, finds the store's agent gone: one launcher_exit, no
    peer lost — in one piece or line by line, its logger's head or none."""
    from argus.joblog.signatures import QUIET_KINDS

    s = LogScanner()
    s.feed("stderr", _EXIT_BARRIER_LOG)
    got = _kinds(s)
    assert [(r, k) for r, k, _ in got] == [(-1, "launcher_exit")]
    assert "store connection closed" in got[0][2] and "Elapsed" in got[0][2]
    assert LogKind.LAUNCHER_EXIT in QUIET_KINDS
    plain = LogScanner()  # python's default logging format: no head before the message
    for line in (b"ERROR:torch.distributed.elastic.agent.server.api:Error waiting on exit barrier. Elapsed: 0.1 seconds",
                 b"Traceback (most recent call last):", b'  File "api.py", line 994, in _exit_barrier',
                 b"torch.distributed.DistNetworkError: Connection reset by peer", b"[rank0]: Broken pipe"):
        plain.feed("stderr", line + b"\n")
    assert [(r, k) for r, k, _ in _kinds(plain)] == [(-1, "launcher_exit"), (0, "peer_lost")]


def test_a_store_connection_lost_without_the_exit_barrier_stays_a_lost_peer():
    """Mid-job (no exit barrier after it) the store client's line is a peer lost: told at the
    next event, at the next take once held ``HOLD_NS``, or at the end."""
    from argus.joblog.scanner import HOLD_NS

    line = _EXIT_BARRIER_LOG.split(b"\n", 1)[0] + b"\n"
    now = [0]
    s = LogScanner(clock=lambda: now[0])
    s.feed("stderr", line)
    assert _kinds(s) == []  # held: the exit barrier may follow
    now[0] = HOLD_NS
    assert [k for _, k, _ in _kinds(s)] == ["peer_lost"]
    s.feed("stderr", line + b"[rank3]:[E1203 ProcessGroupNCCL.cpp:632] Watchdog caught collective operation timeout\n")
    assert [(r, k) for r, k, _ in _kinds(s)] == [(-1, "peer_lost"), (3, "watchdog_timeout")]
    s.feed("stderr", line)
    s.close()
    assert [k for _, k, _ in _kinds(s)] == ["peer_lost"]


def test_the_exit_barrier_through_a_log_shipper_that_took_the_indentation_off():
    """pytorch/pytorch#69520's shape (torchrun's known exit-barrier race, as a log shipper wrote
    it): a time stamp and a tab before every line, Python's default logging format, frames with
    no indentation left — still one launcher_exit; a line of its own after it is still read."""
    stamp = b"2025-01-07T10:53:23.670-05:00\t"
    body = (b"ERROR:torch.distributed.elastic.agent.server.api:Error waiting on exit barrier. Elapsed: 315.7 seconds",
            b"Traceback (most recent call last):",
            b'File "/opt/torch/distributed/elastic/agent/server/api.py", line 906, in _exit_barrier',
            b"store_util.barrier(",
            b'File "/opt/torch/distributed/elastic/utils/store.py", line 64, in synchronize',
            b"agent_data = get_all(store, rank, key_prefix, world_size)",
            b"RuntimeError: Connection reset by peer",
            b"[rank3]:[E107 ProcessGroupNCCL.cpp:632] Watchdog caught collective operation timeout")
    s = LogScanner()
    s.feed("stderr", b"".join(stamp + line + b"\n" for line in body))
    assert [(r, k) for r, k, _ in _kinds(s)] == [(-1, "launcher_exit"), (3, "watchdog_timeout")]
    cut = LogScanner()  # a traceback whose end was never recognised: a lost peer after it is still one
    cut.feed("stderr", b"".join(stamp + line + b"\n" for line in body[:4]) + stamp + b"[rank1]: Broken pipe\n")
    assert [(r, k) for r, k, _ in _kinds(cut)] == [(-1, "launcher_exit"), (1, "peer_lost")]
