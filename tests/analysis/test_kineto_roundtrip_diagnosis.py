"""`argus diagnose --json` on a store imported from per-rank Kineto traces."""

import json
import subprocess
import sys

from argus.sim import SimConfig, simulate_to_store


def _argus(*args):
    return subprocess.run([sys.executable, "-m", "argus", *args], capture_output=True, text=True, timeout=600)


def test_diagnosis_of_imported_kineto_traces_names_the_right_ranks_and_class(tmp_path):
    # 16 ranks (tp, ep, dp and pp all 2) and two 5-step windows: 118 MB of JSON; 32 ranks and 20
    # steps (474 MB, the same verdict) cost 25 s of the CI's 20 minutes against 7
    res = simulate_to_store(SimConfig(ranks=16, steps=10, kernels=True, seed=2), "compute_straggler", tmp_path / "sim")
    truth = res.truth["faults"][0]
    out = _argus("export", "kineto", str(tmp_path / "sim"), "--out", str(tmp_path / "traces"))
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "traces").glob("rank*.json"))) == 16
    out = _argus("ingest", "kineto", str(tmp_path / "traces"), "--out", str(tmp_path / "imported"),
                 "--layout", res.truth["layout"])
    assert out.returncode == 0, out.stderr
    out = _argus("diagnose", str(tmp_path / "imported"), "--json")
    assert out.returncode == 0, out.stderr
    incidents = [i for i in json.loads(out.stdout)["incidents"] if i["severity"] != "info"]
    assert len(incidents) == 1
    assert incidents[0]["class"] == "compute_straggler"
    assert incidents[0]["culprit_ranks"] == truth["culprit_ranks"]
