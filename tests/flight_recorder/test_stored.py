"""Dumps and logs of one failure brought into a store after the fact give the diagnosis one hang:
``argus ingest flight-recorder --store`` keeps the dumps, ``argus ingest log --store`` the log's
events, and ``argus diagnose`` names the dead rank once, from both."""

from __future__ import annotations

import json
import subprocess
import sys

from argus.sim import SimConfig, simulate_to_store
from tests.flight_recorder.megatron_dumps import write

DESYNC = (b"[rank13]:[E1204 ProcessGroupNCCL.cpp:1412] [Rank 13] To our best knowledge, the lagging/dead/mismatched "
          b"ranks that caused the desync are: [12] finished collective #5, but didn't join collective #6 "
          b"(count from 1)\n")


def _argus(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "argus", *args], input=stdin, capture_output=True, timeout=300)


def test_dumps_and_a_log_ingested_into_a_store_are_one_hang_of_the_diagnosis(tmp_path):
    store = tmp_path / "s"
    simulate_to_store(SimConfig(ranks=16, steps=6, seed=0), "healthy", store)
    dumps = write(tmp_path / "d", dead=12)
    done = _argus("ingest", "flight-recorder", str(dumps), "--store", str(store))
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    done = _argus("ingest", "log", "-", "--store", str(store), "--json", stdin=DESYNC)
    (inc,) = json.loads(done.stdout)["incidents"]  # the kept dumps' hang, the log's line on it
    assert (inc["culprit_ranks"], inc["state"]) == ([12], "confirmed")
    assert inc["summary"].endswith("PyTorch's desync report names the same rank")
    done = _argus("diagnose", str(store), "--json")
    assert done.returncode in (0, 3), done.stderr.decode()[-2000:]
    hangs = [i for i in json.loads(done.stdout)["incidents"] if i["class"] == "hang"]
    assert len(hangs) == 1, [h["summary"] for h in hangs]
    (hang,) = hangs
    assert (hang["culprit_ranks"], hang["state"]) == ([12], "confirmed") and hang["hosts"]
    assert hang["summary"].startswith("rank 12 never joined _all_gather_base #6")
    assert "PyTorch's desync report names the same rank" in hang["summary"]
    kinds = {e["kind"] for e in hang["evidence"]}
    assert {"stuck_collective", "consequence", "log_lines"} <= kinds
