"""``argus ingest log``: a finished job's logs read after the fact — real torchrun logs of a
two-node job written here, transcribed lines of tools that need GPUs (NCCL's watchdog, PyTorch's
desync report), srun --label output, and the same failure's Flight Recorder dumps beside its log."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from argus.joblog.offline import log_incidents, read_logs

JOB = Path(__file__).with_name("torchrun_job.py")


def _read(text: str, **kw):
    return read_logs([("log", io.BytesIO(text.encode()))], **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_node_logs(tmp_path_factory) -> list[Path]:
    """Each torchrun's own output (``--tee 3``: its ranks' lines prefixed ``[default<local>]:``)."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("torchrun")
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for node in (0, 1):
        log = open(out / f"node{node}.log", "wb")
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--tee", "3", str(JOB)],
            stdout=log, stderr=subprocess.STDOUT, env=env), log))
    for p, log in procs:
        p.wait(timeout=180)
        log.close()
    return [out / "node0.log", out / "node1.log"]


def test_real_two_node_torchrun_logs_name_the_rank_that_raised_not_its_victims(two_node_logs):
    text = two_node_logs[1].read_text()
    assert "[default1]:[rank3]:" in text  # torchrun's local prefix before torch's global one
    read = read_logs([(str(p), open(p, "rb")) for p in two_node_logs])
    (inc,) = log_incidents(read)[0]
    assert (inc.klass, inc.culprit_ranks, inc.state) == ("fail_stop", [3], "confirmed")
    assert inc.summary.startswith("rank 3 failed and stopped the job — rank 3: ValueError: loss is nan")
    assert "ranks 0, 1, 2 were stopped after it" in inc.summary  # they lost their peer, then exit code 1


def test_a_multi_node_ecc_line_is_the_global_ranks_not_local_rank_0s():
    read = _read("[default0]:[rank12]:[E1203 10:41:07.123 ProcessGroupNCCL.cpp:1484] [PG ID 0 PG GUID 0(default_pg) "
                 "Rank 12] Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC "
                 "error encountered\n"
                 "[default0]:some unrelated line from local rank 0 of another node\n")
    (inc,) = log_incidents(read)[0]
    assert (inc.klass, inc.culprit_ranks) == ("fail_stop", [12]) and "ECC" in inc.summary


def test_a_local_rank_alone_names_no_rank_unless_the_node_is_known():
    line = "[default2]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    (inc,) = log_incidents(_read(line))[0]  # local rank 2 of which node? not said: no rank named
    assert (inc.klass, inc.culprit_ranks) == ("fail_stop", []) and "[local rank 2]" in inc.summary
    (inc,) = log_incidents(_read(line, local_offset=8))[0]  # node rank 1, 8 ranks a node
    assert inc.culprit_ranks == [10]


def test_pytorchs_desync_report_is_the_hang_of_the_rank_it_names():
    read = _read("[rank0]:[E1204 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=183, OpType=ALLREDUCE) ran for 600041 milliseconds before timing out.\n"
                 "[rank0]:[E1204 ProcessGroupNCCL.cpp:1412] [PG ID 0 PG GUID 0(default_pg) Rank 0] To our best "
                 "knowledge, the lagging/dead/mismatched ranks that caused the desync are: [7] finished collective "
                 "#182, but didn't join collective #183 (count from 1)\n")
    (inc,) = log_incidents(read)[0]
    assert (inc.klass, inc.culprit_ranks, inc.state) == ("hang", [7], "suspected")


def test_srun_labels_are_ranks_or_nodes_as_the_lines_say():
    per_rank = "".join(f"{r}: step 10 loss 2.31\n" for r in range(4)) + (
        "3: Traceback (most recent call last):\n3:   File \"/job/train.py\", line 41, in step\n"
        "3: RuntimeError: CUDA error: an illegal memory access was encountered\n")
    read = _read(per_rank)
    assert read.srun_labelled == ["log"]
    (inc,) = log_incidents(read)[0]
    assert inc.culprit_ranks == [3]
    per_node = "".join(f"{n}: [default{k}]:step 10 loss 2.31\n" for n in range(2) for k in range(4)) + (
        "1: [default2]:torch.OutOfMemoryError: CUDA out of memory.\n")
    (inc,) = log_incidents(_read(per_node))[0]  # node 1's local rank 2: no global rank without the node's size
    assert inc.culprit_ranks == []
    (inc,) = log_incidents(_read(per_node, nproc_per_node=4))[0]
    assert inc.culprit_ranks == [6] and inc.hosts == []


def test_the_dumps_and_the_log_of_one_hang_are_one_incident_naming_the_rank_from_both(tmp_path):
    from tests.flight_recorder.megatron_dumps import write

    dumps = write(tmp_path / "d", dead=12)
    read = _read("[rank13]:[E1204 ProcessGroupNCCL.cpp:632] [Rank 13] Watchdog caught collective operation timeout: "
                 "WorkNCCL(SeqNum=6, OpType=_ALLGATHER_BASE) ran for 600012 milliseconds before timing out.\n"
                 "[rank13]:[E1204 ProcessGroupNCCL.cpp:1412] [Rank 13] To our best knowledge, the lagging/dead/"
                 "mismatched ranks that caused the desync are: [12] finished collective #5, but didn't join "
                 "collective #6 (count from 1)\n")
    (inc,) = log_incidents(read, [dumps])[0]
    assert (inc.klass, inc.culprit_ranks, inc.state) == ("hang", [12], "confirmed")
    assert inc.summary.startswith("rank 12 never joined _all_gather_base #6")
    assert inc.summary.endswith("PyTorch's desync report names the same rank")
    kinds = {e["kind"] for e in inc.evidence}
    assert {"stuck_collective", "consequence", "log_lines"} <= kinds


def test_the_cli_reads_stdin_and_keeps_the_events_in_a_store(tmp_path):
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    store = tmp_path / "s"
    simulate_to_store(SimConfig(ranks=8, steps=4, seed=0), "healthy", store)
    log = b"[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n" * 2
    done = subprocess.run([sys.executable, "-m", "argus", "ingest", "log", "-", "--store", str(store), "--json"],
                          input=log, capture_output=True, timeout=120)
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    doc = json.loads(done.stdout)
    (inc,) = doc["incidents"]
    attempt = Store.open(store).attempt()
    assert inc["culprit_ranks"] == [5] and inc["hosts"] == [str(attempt.topology().hosts[5])]
    rows = attempt.read("logs", columns=["rank", "kind"]).to_pylist()
    assert rows == [{"rank": 5, "kind": "oom"}] * 2
    done = subprocess.run([sys.executable, "-m", "argus", "ingest", "log", str(tmp_path / "nope.log")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "cannot read it" in done.stderr and "Traceback" not in done.stderr


def test_pytorchs_own_flight_recorder_analyzer_output_names_the_rank_and_joins_the_dumps_verdict(tmp_path):
    """torchfrtrace (PyTorch's analyzer) run here on the Megatron-style dumps written from the
    schema: its "missing ranks: {12}" is read, and with the dumps it is one hang, named by both."""
    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    from tests.flight_recorder.megatron_dumps import write

    dumps = write(tmp_path / "d", dead=12)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", "--prefix",
                           "nccl_trace_rank_", str(dumps)], capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr  # its report goes through logging: stderr
    assert done.returncode == 0 and "missing ranks: {12}" in said, said[-2000:]
    (inc,) = log_incidents(_read(said))[0]
    assert (inc.klass, inc.culprit_ranks, inc.state) == ("hang", [12], "suspected")
    (inc,) = log_incidents(_read(said), [dumps])[0]
    assert (inc.culprit_ranks, inc.state) == ([12], "confirmed") and inc.summary.endswith("torchfrtrace names the same rank")


def test_the_analyzers_older_one_line_report_is_read():
    read = _read("Not all ranks joining collective for group 0:default_pg collective nccl:all_reduce  Missing ranks are "
                 "{1}  [[3, 4]] [[3, 4]] 2 scheduled\nCollective stack traces: \n")
    (inc,) = log_incidents(read)[0]
    assert inc.culprit_ranks == [1] and "nccl:all_reduce of group 0:default_pg" in inc.summary


def test_kubectl_prefixes_and_time_stamps_are_taken_off_before_the_ranks_are_read():
    read = _read("[pod/llm-worker-2/pytorch] 2026-12-06T09:00:00.123456789Z [rank5]: torch.OutOfMemoryError: CUDA out "
                 "of memory. Tried to allocate 2.00 GiB\n"
                 "[pod/llm-worker-0/pytorch] 2026-12-06T09:00:01.000000000Z step 10 loss 2.31\n")
    (inc,) = log_incidents(read)[0]
    assert inc.culprit_ranks == [5] and inc.summary.startswith("rank 5 failed and stopped the job — rank 5: torch.Out")
