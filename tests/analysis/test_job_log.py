"""The job's log next to the diagnosis (``analysis/job_log.py``), on incidents built in memory: a link
incident takes the NCCL lines of its hosts, a hang the watchdog line that ended it, a failed rank
is a fail-stop (a P0) unless a hang covers it — and NVML's Xids count as the kernel log's do, once."""

from __future__ import annotations

from argus.alerting import priority
from argus.analysis.evidence import check_evidence
from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State
from argus.analysis.job_log import XID_SAME_NS, correlate, merge_xids, with_job_log
from argus.sim import SimConfig, simulate_to_store
from argus.store import Store
from argus.topology import Topology, parse_layout

S = 10**9
#: node-0000 holds ranks 0–3, node-0001 ranks 4–7
TOPOLOGY = Topology.uniform(parse_layout("dp=8"), gpus_per_host=4)


def step_of_ts(rank: int, ts_ns: int) -> int:
    return ts_ns // S  # one step a second


def _event(rank: int, t_s: float, kind: str, text: str, host: str | None = None, stream: str = "stderr") -> dict:
    host = host if host is not None else (str(TOPOLOGY.hosts[rank]) if rank >= 0 else "node-0000")
    return {"rank": rank, "ts_ns": int(t_s * S), "host": host, "stream": stream, "kind": kind,
            "severity": "error", "text": text}


def _incident(klass: IncidentClass, culprits: list[int], hosts: list[str], start: int = 10, end: int = 20) -> Incident:
    return Incident(klass, culprits, hosts, [], start, end, "", [], State.CONFIRMED, Severity.CRITICAL, 30.0, 1.0,
                    Action.VERIFY, [], [], "seen")


def _lines(inc: Incident) -> dict:
    (ev,) = [e for e in inc.evidence if e["kind"] == "log_lines"]
    assert check_evidence(inc.evidence) == []
    return ev


def test_a_link_incident_takes_the_nccl_lines_of_its_hosts_and_a_hang_the_watchdog_line_that_ended_it():
    early = [_event(1, 1 + i, "nccl_warn", f"NCCL WARN on node-0000 #{i}") for i in range(8)]
    events = [*early,
              _event(5, 12, "nccl_connect", "NCCL WARN NET/Socket : Connect to 10.0.0.6<4242> failed"),
              _event(-1, 13, "nic_down", "mlx5_core 0000:3b:00.0 ib0: Link down", host="node-0001", stream="kernel"),
              _event(2, 14, "dataloader", "DataLoader timed out after 30 seconds"),
              _event(6, 40, "watchdog_timeout", "[Rank 6] Watchdog caught collective operation timeout")]
    link = _incident(IncidentClass.LINK_DEGRADATION, [5], ["node-0001"])
    straggler = _incident(IncidentClass.COMPUTE_STRAGGLER, [2], ["node-0000"])
    hang = _incident(IncidentClass.HANG, [6], [], start=39, end=39)
    out = correlate(events, TOPOLOGY, [link, straggler, hang], step_of_ts)
    assert out == [link, straggler, hang]  # nothing failed: no fail-stop

    got = _lines(link)  # node-0001's lines only: the failed connection, the port down, the timeout, with steps
    assert [(e["rank"], e["kind"], e.get("step")) for e in got["events"]] == [
        (5, "nccl_connect", 12), (-1, "nic_down", None), (6, "watchdog_timeout", 40)]
    assert got["total"] == 3
    assert not [e for e in straggler.evidence if e["kind"] == "log_lines"]  # a DataLoader line is no GPU's
    hung = _lines(hang)  # every rank's: 8 warnings came first, but the watchdog line is what a hang is
    assert hung["total"] == 10 and len(hung["events"]) == 5
    assert hung["events"][-1]["text"].startswith("[Rank 6] Watchdog caught") and hung["events"][-1]["step"] == 40
    assert [e["ts_ns"] for e in hung["events"]] == sorted(e["ts_ns"] for e in hung["events"])


def test_a_failed_rank_is_a_confirmed_fail_stop_and_a_p0_with_its_victims_named():
    events = [_event(2, 30, "exception", "ValueError: loss is nan at step (/job/train.py:41)"),
              _event(3, 31, "killed", "rank 3 (pid 12) ended by signal 9 (SIGKILL)"),
              _event(0, 32, "peer_lost", "Connection reset by peer"),
              _event(1, 33, "stopped", "rank 1 (pid 10) stopped by the launcher (SIGTERM)"),
              _event(-1, 34, "worker_failed", "rank ? exited with code 1")]  # no rank: no culprit
    (inc,) = correlate(events, TOPOLOGY, [], step_of_ts)
    assert (inc.klass, inc.culprit_ranks, inc.hosts, inc.state) == ("fail_stop", [2, 3], ["node-0000"], "confirmed")
    assert inc.gpus == [str(TOPOLOGY.gpu_uuids[2]), str(TOPOLOGY.gpu_uuids[3])]
    assert (inc.start_step, inc.phase, inc.action) == (30, "exception", "checkpoint_and_restart")
    assert inc.summary.startswith("ranks 2, 3 failed and stopped the job — rank 2: ValueError: loss is nan")
    assert "ranks 0, 1 were stopped after it" in inc.summary
    assert _lines(inc)["total"] == 2
    assert priority(inc.to_json()) == "P0"


def test_a_hang_that_covers_the_failed_rank_carries_its_line_instead_of_a_second_incident():
    hang = _incident(IncidentClass.HANG, [3], [], start=29, end=29)
    events = [_event(3, 29.5, "oom", "torch.OutOfMemoryError: CUDA out of memory"),
              _event(0, 60, "watchdog_timeout", "[Rank 0] Watchdog caught collective operation timeout")]
    assert correlate(events, TOPOLOGY, [hang], step_of_ts) == [hang]
    assert hang.summary.endswith("; the job's log: rank 3: torch.OutOfMemoryError: CUDA out of memory")
    assert [e["kind"] for e in _lines(hang)["events"]] == ["oom", "watchdog_timeout"]


def _nvml(rank: int, t_s: float, code: int) -> dict:
    return {**_event(rank, t_s, "xid", f"Xid {code} on GPU {TOPOLOGY.gpu_uuids[rank]} (NVML critical-error event)",
                     stream="nvml"), "xid": code}


def test_an_nvml_xid_the_kernel_log_also_saw_is_one_event_and_names_the_lines_rank():
    kernel = _event(-1, 100, "xid", "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", host="node-0001",
                    stream="kernel")
    other_code = _event(6, 100, "xid", "NVRM: Xid (PCI:0000:5e:00): 13, pid=77, Graphics Exception", stream="kernel")
    events = [kernel, other_code]
    nvml = [_nvml(5, 103, 79),  # the kernel's line: same code, same host, 3 s apart
            _nvml(6, 101, 48),  # rank 6's GPU, but another Xid than its line's
            _nvml(5, 103 + XID_SAME_NS / S + 60, 79),  # the same code again, much later: a second event
            _nvml(1, 100, 79)]  # the other host's GPU: not node-0001's line
    merged = merge_xids(events, nvml)
    assert kernel["rank"] == 5  # NVML named the rank of the GPU the driver's line named by its bus
    assert [(e["rank"], e["stream"], int(e["ts_ns"] // S)) for e in merged] == [
        (5, "kernel", 100), (6, "kernel", 100), (1, "nvml", 100), (6, "nvml", 101), (5, "nvml", 193)]
    assert merge_xids(events, []) is events


def test_nvml_xid_rows_of_the_store_are_a_fail_stop_counted_once_with_the_kernel_logs(tmp_path):
    simulate_to_store(SimConfig(ranks=8, steps=6, seed=2, gpus_per_host=4), "healthy", tmp_path / "s")
    attempt = Store.open(tmp_path / "s").attempt()
    topology = attempt.topology()
    t0 = int(attempt.sql("SELECT max(start_ns) AS t FROM steps").column("t")[0].as_py())
    assert with_job_log(attempt, topology, [], step_of_ts) == []  # a healthy store: nothing to say

    uuid = str(topology.gpu_uuids[6])
    attempt.writer("processor-node").write("hw", {"rank": [6, 6], "gpu_uuid": [uuid, uuid], "ts_ns": [t0, t0 + S],
                                                  "metric": ["xid", "temperature_c"], "value": [79.0, 50.0]}, 0)
    (inc,) = with_job_log(attempt, topology, [], lambda r, ts: 5)
    assert (inc.klass, inc.culprit_ranks, inc.hosts, inc.phase) == ("fail_stop", [6], [str(topology.hosts[6])], "xid")
    assert f"rank 6: Xid 79 on GPU {uuid}" in inc.summary and priority(inc.to_json()) == "P0"

    # the kernel log saw it too, without knowing whose it was: still one Xid, now the line's
    logs = {"rank": [-1], "ts_ns": [t0 + 2 * S], "host": [str(topology.hosts[6])], "stream": ["kernel"],
            "kind": ["xid"], "severity": ["error"], "text": ["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off"],
            "lines": [1]}
    attempt.writer("joblog-node").write("logs", logs, 0)
    (inc,) = with_job_log(attempt, topology, [], lambda r, ts: 5)
    assert inc.culprit_ranks == [6] and _lines(inc)["total"] == 1
    assert _lines(inc)["events"][0]["text"].startswith("NVRM: Xid (PCI:0000:3b:00): 79")


def test_pytorchs_desync_report_names_the_hang_not_the_rank_whose_watchdog_printed_it():
    """Rank 0's watchdog times out and its desync report names rank 7: one hang on rank 7,
    suspected (PyTorch's word, no dump yet); with a hang already on rank 7 it corroborates it."""
    events = [_event(0, 60, "watchdog_timeout", "[Rank 0] Watchdog caught collective operation timeout"),
              _event(7, 60.1, "desync", "PyTorch's desync report (printed by rank 0): ranks [7] finished collective "
                                        "#182, but didn't join collective #183 (count from 1)")]
    (inc,) = correlate(list(events), TOPOLOGY, [], step_of_ts)
    assert (inc.klass, inc.culprit_ranks, inc.hosts, inc.state) == ("hang", [7], ["node-0001"], "suspected")
    assert inc.summary.startswith("rank 7 held up a collective: ranks [7] finished collective #182, but didn't join")
    assert "; rank 0 timed out waiting" in inc.summary and _lines(inc)["total"] == 1
    hang = _incident(IncidentClass.HANG, [7], [], start=59, end=59)
    assert correlate(list(events), TOPOLOGY, [hang], step_of_ts) == [hang]
    assert hang.summary.endswith("PyTorch's desync report names the same rank")
    assert [e["kind"] for e in _lines(hang)["events"]] == ["watchdog_timeout", "desync"]


def test_a_gpus_own_hardware_error_asks_for_its_host_not_only_a_restart():
    """An uncorrectable ECC error is the hardware's word: drain the host (confirmed, a P0);
    a Python exception is the job's, restart it."""
    (ecc,) = correlate([_event(5, 30, "cuda_error", "CUDA error: uncorrectable ECC error encountered")], TOPOLOGY, [],
                       step_of_ts)
    assert (ecc.action, ecc.hosts, ecc.state) == ("cordon_node", ["node-0001"], "confirmed")
    assert ecc.to_json()["remedy"].startswith("the GPU reported a hardware fault itself")
    (exc,) = correlate([_event(5, 30, "exception", "ValueError: loss is nan")], TOPOLOGY, [], step_of_ts)
    assert exc.action == "checkpoint_and_restart" and "hardware" not in exc.to_json()["remedy"]


def test_ranks_the_watchdog_aborted_are_victims_and_a_timeout_nothing_explains_is_a_hang_naming_no_one():
    """torchrun's report of every rank killed by SIGABRT (NCCL's watchdog tearing them down after a
    collective timed out) names no culprit, whichever abort it saw first ("Root Cause"): one hang,
    no rank named, said so."""
    events = [_event(3, 60, "watchdog_timeout", "[Rank 3] Watchdog caught collective operation timeout"),
              _event(7, 61, "killed", "rank 7 (pid 3438) ended by signal 6 (SIGABRT)"),
              _event(0, 61, "killed", "rank 0 (pid 3431) ended by signal 6 (SIGABRT)")]
    (inc,) = correlate(events, TOPOLOGY, [], step_of_ts)
    assert (inc.klass, inc.culprit_ranks, inc.state) == ("hang", [], "suspected")
    assert "the logs name no rank it waited for" in inc.summary and _lines(inc)["total"] == 3
    (inc,) = correlate([_event(3, 60, "watchdog_timeout", "[Rank 3] Watchdog caught collective operation timeout")],
                       TOPOLOGY, [], step_of_ts)
    assert (inc.klass, inc.culprit_ranks) == ("hang", [])
    killed = [_event(2, 30, "killed", "rank 2 (pid 11) ended by signal 9 (SIGKILL)")]  # the OOM killer: a culprit
    assert correlate(killed, TOPOLOGY, [], step_of_ts)[0].culprit_ranks == [2]


def test_a_desync_report_with_every_rank_inside_the_collective_names_no_rank():
    """All 8 ranks "joined but didn't finish": the collective itself did not complete (a real
    16-rank report said so of all 16) — no culprit; one rank of eight so is the laggard."""
    every = [_event(r, 60, "desync", f"PyTorch's desync report: ranks {list(range(8))} joined but didn't finish "
                                     "collective #90 (count from 1)") for r in range(8)]
    (inc,) = correlate(every, TOPOLOGY, [], step_of_ts)
    assert (inc.klass, inc.culprit_ranks) == ("hang", [])
    one = [_event(5, 60, "desync", "PyTorch's desync report: ranks [5] joined but didn't finish collective #90")]
    assert correlate(one, TOPOLOGY, [], step_of_ts)[0].culprit_ranks == [5]


def test_a_worker_the_log_gives_no_global_rank_is_a_fail_stop_naming_no_rank():
    events = [_event(-1, 30, "killed", "local rank 3 (pid 812917) ended by signal 9 (SIGKILL)")]
    (inc,) = correlate(events, TOPOLOGY, [], step_of_ts)
    assert (inc.klass, inc.culprit_ranks, inc.state) == ("fail_stop", [], "suspected")
    assert "local rank 3 (pid 812917) ended by signal 9" in inc.summary and "no global rank" in inc.summary


def test_ranks_that_timed_out_waiting_for_a_killed_rank_are_its_victims():
    """Rank 1 killed (SIGKILL); ranks 0 and 2 time out waiting for it and exit 1: rank 1 alone."""
    events = [_event(1, 30, "killed", "rank 1 (pid 11) ended by signal 9 (SIGKILL)"),
              _event(0, 40, "watchdog_timeout", "RuntimeError: Timed out waiting 16000ms for recv operation"),
              _event(2, 40, "watchdog_timeout", "RuntimeError: Timed out waiting 16000ms for recv operation"),
              _event(0, 41, "worker_failed", "rank 0 (pid 10) exited with code 1"),
              _event(2, 41, "worker_failed", "rank 2 (pid 12) exited with code 1")]
    (inc,) = correlate(events, TOPOLOGY, [], step_of_ts)
    assert (inc.klass, inc.culprit_ranks) == ("fail_stop", [1])
