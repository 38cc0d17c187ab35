import json
import subprocess
import sys

import pytest

from argus.cli.main import main
from argus.sim import SCENARIOS
from tests.analysis.schema import validate

#: the simulator and the CLI's output: nothing here is timed, but for the two real jobs marked serial
pytestmark = pytest.mark.parallel_ok

NAMES = ["healthy", "compute_straggler", "link_degradation", "pipeline_bubble", "jit_stall",
         "masked_compute_straggler", "hang", "thermal_throttle", "group_link_degradation", "link_flap", "gc_pause"]


def argus(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "argus", *args], capture_output=True, text=True, timeout=600)


def test_scenarios_lists_one_per_line_name_first():
    out = argus("scenarios")
    assert out.returncode == 0
    lines = out.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == NAMES == list(SCENARIOS)
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)


@pytest.mark.parametrize("scenario", NAMES)
def test_simulate_writes_a_readable_store_and_truth_for_every_scenario(tmp_path, scenario):
    from argus.store import Store

    out = tmp_path / "S"
    rc = main(["simulate", "--scenario", scenario, "--ranks", "64", "--steps", "20", "--out", str(out)])
    assert rc == 0
    truth = json.loads((out / "truth.json").read_text())
    assert truth["scenario"] == scenario and truth["ranks"] == 64
    assert (truth["faults"] == []) == (scenario == "healthy")
    for f in truth["faults"]:
        assert f["class"] == SCENARIOS[scenario].fault_class
        assert f["culprit_ranks"] and f["culprit_hosts"] and f["window"]["start_step"] <= f["window"]["end_step"]
    attempt = Store.open(out).attempt()
    stats = attempt.stats()
    assert stats["steps"].rows > 0 and stats["phases"].rows > 0 and stats["stacks"].rows > 0
    assert attempt.meta["scenario"] == scenario


def test_simulate_refuses_to_overwrite_a_simulation(tmp_path):
    args = ["simulate", "--scenario", "healthy", "--ranks", "8", "--steps", "3", "--out", str(tmp_path / "S")]
    assert main(args) == 0
    out = argus(*args)
    assert out.returncode == 2 and "already holds a simulation" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["--layout", "tp=3"], "does not divide the world size 64"),
    (["--layout", "tp=2,foo=2"], "unknown layout key 'foo'"),
    (["--param", "nope=1"], "has no parameter 'nope'"),
    (["--param", "factor=fast"], "must be a float"),
    (["--ranks", "0"], "must be a positive integer"),
])
def test_bad_input_gets_a_clear_error_and_no_traceback(tmp_path, args, message):
    out = argus("simulate", "--scenario", "compute_straggler", "--out", str(tmp_path / "S"), *args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "S" / "truth.json").exists()


def test_info_prints_what_the_store_holds(tmp_path):
    out_dir = tmp_path / "S"
    assert main(["simulate", "--scenario", "gc_pause", "--ranks", "16", "--steps", "6", "--out", str(out_dir)]) == 0
    out = argus("info", str(out_dir))
    assert out.returncode == 0
    for text in ("phases", "backward-compute", "ground truth", "host_stall", "step time"):
        assert text in out.stdout
    bad = argus("info", str(tmp_path))
    assert bad.returncode == 2 and "not an Argus store" in bad.stderr


def test_info_scenarios_and_analyze_speak_json(tmp_path, capsys):
    """Issue 24: what scripts read, as JSON — the same facts the human output shows."""
    store = tmp_path / "S"
    assert main(["simulate", "--scenario", "hang", "--ranks", "16", "--steps", "20", "--out", str(store)]) == 0
    capsys.readouterr()
    assert main(["info", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["run_id"], info["world_size"], info["scenario"]) == ("sim-hang-s0", 16, "hang")
    assert info["steps"]["unfinished"] and info["tables"]["steps"]["rows"] > 0 and info["truth"]["class"] == "hang"
    assert {p["category"] for p in info["phases"]} <= {"compute", "comm", "host"}
    assert main(["scenarios", "--json"]) == 0
    scenarios = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in scenarios] == list(SCENARIOS) and scenarios[1]["params"]["factor"] > 1
    assert main(["analyze", str(store), "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    cycle = json.loads(line)
    assert cycle["analysed"] and cycle["incidents"] >= 1 and cycle["new_incidents"] and cycle["errors"] == []


@pytest.mark.serial
def test_demo_trains_a_real_job_and_names_the_slow_rank(tmp_path):
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-m", "argus", "demo", "--steps", "24"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "compute_straggler" in out.stdout and "report:" in out.stdout
    (run,) = list((tmp_path / "argus-demo").iterdir())
    report = json.loads((run / "report.json").read_text())
    validate(report)
    serious = [i for i in report["incidents"] if i["severity"] != "info"]
    assert [(i["class"], i["culprit_ranks"]) for i in serious] == [("compute_straggler", [1])]


def test_simulated_demo_needs_no_pytorch(tmp_path):
    out = subprocess.run([sys.executable, "-m", "argus", "demo", "--simulated", "jit_stall", "--steps", "12", "--out",
                          str(tmp_path / "d")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "host_stall" in out.stdout
    validate(json.loads((tmp_path / "d" / "report.json").read_text()))
    html = (tmp_path / "d" / "report.html").read_text()
    assert "<svg" in html and "host_stall" in html and "jit_compile" in html


def test_demo_refuses_a_fault_rank_outside_the_job(tmp_path):
    out = subprocess.run([sys.executable, "-m", "argus", "demo", "--fault-rank", "7", "--out", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "is not a rank of 4" in out.stderr


def test_bench_simulate_prints_json_lines():
    out = argus("bench", "simulate", "--ranks", "64", "--steps", "3", "--modes", "generate,store")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert [r["mode"] for r in rows] == ["generate", "store"]
    for r in rows:
        assert r["events"] > 0 and r["events_per_s"] > 0 and r["peak_rss_mb"] > 0
    assert rows[1]["store_mb"] > 0


@pytest.mark.serial
def test_bench_overhead_compares_modes_side_by_side():
    pytest.importorskip("torch")
    out = argus("bench", "overhead", "--model", "tiny", "--steps", "12", "--repeats", "1",
                "--modes", "none,argus-semantic,profiler")
    assert out.returncode == 0, out.stderr
    rows = {r["mode"]: r for r in map(json.loads, out.stdout.strip().splitlines())}
    assert set(rows) == {"none", "argus-semantic", "profiler"}
    assert rows["none"]["ratio"] == 1.0 and all(r["step_ms"] > 0 and r["peak_rss_mb"] > 0 for r in rows.values())
    assert "channel_cost_pct" in rows["argus-semantic"]
    bad = argus("bench", "overhead", "--modes", "none,bogus")
    assert bad.returncode == 2 and "unknown mode 'bogus'" in bad.stderr
