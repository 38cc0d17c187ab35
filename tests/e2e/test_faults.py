"""Real faults on real jobs, diagnosed from what ``argus run`` stored: a hang named live on
the rank the others wait for, a rank SIGKILLed mid-step, a garbage-collection pause, an
inductor recompilation and a slow DataLoader on one rank (each a host stall with its
cause), a gradual slowdown — and nothing on healthy jobs with variable-length inputs, or when
the launcher is a shell script."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")

from argus.store import Store
from tests.e2e.jobs import STEPS, argus_run, diagnose, env, job, none, only, processor_status, run


def _evidence(inc: dict) -> dict:
    return {e["kind"]: e for e in inc["evidence"]}


def _stall(stack: str, nproc: int, tmp_path, *fault: str, steps: int = STEPS) -> dict:
    store = tmp_path / "store"
    out = tmp_path / "out"
    out.mkdir()
    run([*argus_run(store), *job(stack, out, nproc, "--steps", str(steps), *fault)])
    assert processor_status(store)["ranks_seen"] == nproc  # no compile or DataLoader worker claimed a rank
    return only(diagnose(store))


def test_garbage_collection_pauses_on_one_rank_are_a_host_stall_of_that_rank(tmp_path):
    inc = _stall("ddp", 4, tmp_path, "--fault", "gc", "--fault-rank", "1", "--fault-start", "3")
    assert inc["class"] == "host_stall" and inc["culprit_ranks"] == [1]
    assert _evidence(inc)["host_phases"]["cause"] == "garbage_collection"
    # the faulty rank's first full collection, over its freshly built heap in step 0, is a real pause too
    assert set(inc["steps"]) <= {0, 3, 6, 9} and len(set(inc["steps"]) & {3, 6, 9}) >= 2


def test_an_inductor_recompilation_on_one_rank_is_a_jit_stall(tmp_path):
    inc = _stall("compile", 2, tmp_path, "--fault", "recompile", "--fault-rank", "1", "--fault-start", "6")
    assert inc["class"] == "host_stall" and inc["culprit_ranks"] == [1]
    assert _evidence(inc)["host_phases"]["cause"] == "jit_compile"
    assert 6 in inc["steps"]


def test_a_slow_dataloader_on_one_rank_is_a_data_loading_stall(tmp_path):
    inc = _stall("dataloader", 4, tmp_path, "--fault", "slow_data", "--fault-rank", "2", "--fault-start", "3",
                 "--slow-data-ms", "40")
    assert inc["class"] == "host_stall" and inc["culprit_ranks"] == [2]
    assert _evidence(inc)["host_phases"]["cause"] == "data_loading"


def test_a_gradual_slowdown_of_one_rank_is_named(tmp_path):
    inc = _stall("ddp", 4, tmp_path, "--fault", "gradual", "--fault-rank", "3", "--fault-start", "4",
                 "--gradual-reps", "24", steps=24)
    assert inc["class"] in ("compute_straggler", "pipeline_imbalance") and inc["culprit_ranks"] == [3]


@pytest.mark.parametrize("stack", ["ddp", "fsdp2"])
def test_variable_length_inputs_on_every_rank_raise_nothing(stack, tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    run([*argus_run(store), *job(stack, out, 4, "--fault", "varlen")])
    none(diagnose(store))


def test_a_shell_script_launcher_is_traced_like_torchrun(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\nset -e\necho launching\nexec " + " ".join(job("ddp", out, 2)) + "\n")
    done = run([*argus_run(store), "bash", str(script)])
    assert "traced run e2e" in done.stderr
    steps = Store.open(store).attempt("e2e").read("steps", columns=["rank", "step"]).to_pylist()
    assert {(s["rank"], s["step"]) for s in steps} == {(r, s) for r in range(2) for s in range(STEPS)}


def test_a_rank_killed_mid_step_keeps_everything_up_to_the_kill(tmp_path):
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    done = run([*argus_run(store), *job("ddp", out, 4, "--fault", "kill", "--fault-rank", "2", "--fault-start", "7",
                                        "--pg-timeout", "30")], ok=False)
    assert done.returncode != 0  # the job failed: its ranks lost a peer
    attempt = Store.open(store).attempt("e2e")
    steps = {s["step"] for s in attempt.read("steps", columns=["rank", "step"]).to_pylist() if s["rank"] == 2}
    assert steps == set(range(7)), sorted(steps)
    mine = [p for p in attempt.read("phases", columns=["rank", "step", "name"]).to_pylist()
            if p["rank"] == 2 and p["step"] == 7]
    assert any(p["name"] == "forward-compute" for p in mine)  # the forward it finished before the kill


class _Webhook(http.server.BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Webhook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_hang_is_named_live_on_the_rank_the_others_wait_for(tmp_path):
    """Rank 1 stops before its backward; the others wait in DDP's gradient all-reduce. With a
    6 s threshold the culprit is named — by diagnose and by a P0 alert — while the job is
    still stuck, before gloo's 16 s timeout ends it; and again after it died. (The threshold is
    still ~60 of the job's steps; a 10 s one and a 25 s timeout cost this test 10 s more.)"""
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    cmd = [*argus_run(store, "--hang-min-s", "6"),
           *job("ddp", out, 4, "--fault", "hang", "--fault-rank", "1", "--fault-start", "5", "--pg-timeout", "16")]
    # the job keeps gloo's Flight Recorder ring (NCCL keeps one by default): the processor asks the
    # ranks for it at the hang, and the rings say who never entered the all-reduce
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(TORCH_FR_BUFFER_SIZE="200"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(store.glob("runs/*/*/hangs/*/*.parquet")):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.5)
        assert proc.poll() is None, "the job ended before a hang was recorded"
        live = only(diagnose(store))
        analyze = subprocess.run([sys.executable, "-m", "argus", "analyze", str(store), "--webhook",
                                  f"http://127.0.0.1:{server.server_port}/"], capture_output=True, text=True,
                                 timeout=120)
        still_stuck = proc.poll() is None
        proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.shutdown()
    assert still_stuck, "diagnosis came too late: the backend's timeout had already ended the job"
    final = only(diagnose(store))
    assert "Flight Recorder rings, dumped live, agree" in final["summary"], final["summary"]
    stuck = [e for e in final["evidence"] if e["kind"] == "stuck_collective"]
    assert stuck and stuck[0]["never_joined"] == [1] and sorted(stuck[0]["arrived"]) == [0, 2, 3], stuck
    for inc in (live, final):
        assert inc["class"] == "hang" and inc["culprit_ranks"] == [1]
        ev = _evidence(inc)
        assert ev["blocked_in_collectives"]["ranks"] == [0, 2, 3]
        assert ev["never_joined"]["rank"] == 1 and ev["never_joined"]["step"] == 5
        assert "sleep" in json.dumps(ev["stack"]) or "before_backward" in json.dumps(inc["evidence"])
    assert analyze.returncode == 0, analyze.stderr
    alerts = [a for a in _Webhook.received if a["class"] == "hang"]
    assert alerts and alerts[0]["priority"] == "P0" and alerts[0]["culprit_ranks"] == [1]
