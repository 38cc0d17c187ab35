"""A simulated job streamed through a real processor into real Prometheus and VictoriaMetrics,
diagnosed back through PromQL; and a TSDB that goes away mid-run and comes back."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from argus.cli.main import main
from argus.sim import Engine, SimConfig, simulate_to_store
from argus.sim.run import prepare
from argus.store import Store
from argus.tsdb import PromClient
from tests.tsdb.conftest import wait_for
from tests.tsdb.feed import Feeder
from tests.shortdir import short_dir

SCENARIOS = {"compute_straggler": 16, "link_degradation": 32}  # 16 ranks are two hosts: no healthy link to compare


def _start_processor(store: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    sock = short_dir("argus-tsdb-") / "p.sock"  # unix socket paths cap at 108 bytes
    proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(store), "--socket", str(sock),
                             "--host", "proc-0", "--no-fsync", "--no-stacks", "--no-host-counters", "--no-evidence", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: sock.exists() or proc.poll() is not None, 30, "the processor socket")
    assert proc.poll() is None, proc.stderr.read()
    return proc, sock


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()


def _samples(server, expr: str) -> float:
    """Value of a scalar-ish PromQL expression (0 when empty), evaluated an hour ahead: the
    simulated steps map to stamps that run ahead of the wall clock."""
    result = PromClient(server.base).query(expr, time.time() + 3600)["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _force_flush(server) -> None:
    """VictoriaMetrics' ``/internal/force_flush``: what it buffered becomes searchable."""
    import urllib.request

    with contextlib.suppress(OSError):
        urllib.request.urlopen(f"{server.base}/internal/force_flush", timeout=10).read()


def _settled(seen: list[float], value: float) -> bool:
    """True once a positive count read the same twice in a row (polled 0.5 s apart)."""
    seen.append(value)
    return value > 0 and len(seen) >= 2 and seen[-1] == seen[-2]


def _diagnose_json(source: str) -> list[tuple[str, tuple[int, ...]]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["diagnose", source, "--json", "--no-store"]) == 0
    doc = json.loads(out.getvalue())
    return sorted((i["class"], tuple(i["culprit_ranks"])) for i in doc["incidents"])


@pytest.fixture(scope="module")
def streamed(prometheus, victoria, tmp_path_factory):
    """``streamed(scenario)`` → (simulator store, processor store, run id), each scenario
    simulated once and streamed through one processor writing to both servers."""
    done: dict[str, tuple[Path, Path, str]] = {}

    def run(scenario: str):
        if scenario not in done:
            root = tmp_path_factory.mktemp(scenario)
            run_id = f"t-{scenario}-{time.time_ns()}"
            config = SimConfig(ranks=SCENARIOS[scenario], steps=20, run_id=run_id)
            _, ctx, _, _ = prepare(config, scenario)
            proc, sock = _start_processor(root / "P", "--remote-write", prometheus.write_url,
                                          "--remote-write", victoria.write_url)
            feeder = Feeder(sock, run_id, ctx.layout, ctx.topology)
            simulate_to_store(config, scenario, root / "S", on_step=feeder.step, baseline=False)
            feeder.close()
            _stop(proc)
            expected = config.ranks * config.steps
            steps_in = f'sum(count_over_time(argus_step{{run="{run_id}"}}[2h]))'
            phases_in = f'sum(count_over_time(argus_phase_count{{run="{run_id}"}}[2h]))'
            for server in (prometheus, victoria):
                if server.kind == "victoria-metrics":  # buffered samples searchable now, not in ~1 s
                    _force_flush(server)
                wait_for(lambda s=server: _samples(s, steps_in) >= expected, 20, f"{server.kind} to show every step")
                # every series, not only the steps': under load VictoriaMetrics showed all steps
                # while 32 phase rows of 7,072 were still buffered (CI) — the count must hold still
                seen: list[float] = []
                wait_for(lambda s=server, seen=seen: _settled(seen, _samples(s, phases_in)), 20,
                         f"{server.kind} to show every phase", interval=0.5)
            done[scenario] = (root / "S", root / "P", run_id)
        return done[scenario]

    return run


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_promql_diagnosis_matches_the_embedded_store(streamed, prometheus, victoria, scenario):
    sim_store, proc_store, run_id = streamed(scenario)
    expected = _diagnose_json(str(sim_store))
    assert expected and expected[0][0] == scenario  # the scenario's incident, found in the embedded store
    for server in (prometheus, victoria):
        assert _diagnose_json(server.prom_url(run=run_id)) == expected, server.kind
    status = json.loads((proc_store / "processors" / "proc-0.json").read_text())
    for sink in status["remote_write"]:
        assert sink["windows_sent"] == 4 and sink["dropped"] == {} and sink["retries"] == 0
    assert Store.open(proc_store).attempt().read("drops").num_rows == 0


def test_promql_tables_round_trip(streamed, victoria):
    """What comes back is what the processor stored: steps exactly, phase totals per step,
    kernel summaries per window (VictoriaMetrics keeps 12 significant digits)."""
    from argus.tsdb import open_attempt

    _, proc_store, run_id = streamed("compute_straggler")
    mine = Store.open(proc_store).attempt()
    back = open_attempt(victoria.prom_url(run=run_id))
    assert back.meta["phase_detail"] == "aggregated"
    assert back.topology().hosts.tolist() == mine.topology().hosts.tolist()
    q = ("SELECT rank, step, name, count(*) AS n, sum(dur_ns)::BIGINT AS total FROM phases "
         "GROUP BY ALL ORDER BY ALL")
    a, b = mine.sql(q).to_pylist(), back.sql(q).to_pylist()
    assert len(a) == len(b) and [(r["rank"], r["step"], r["name"], r["n"]) for r in a] == \
        [(r["rank"], r["step"], r["name"], r["n"]) for r in b]
    assert all(abs(x["total"] - y["total"]) <= 2 + 1e-9 * x["total"] for x, y in zip(a, b))
    dur = "SELECT rank, step, end_ns - start_ns AS d FROM steps ORDER BY rank, step"
    assert mine.sql(dur).to_pylist() == back.sql(dur).to_pylist()
    k = 'SELECT "window", rank, kernel, stream, cluster, count, p50_ns FROM kernel_summaries ORDER BY ALL'
    ka, kb = mine.sql(k).to_pylist(), back.sql(k).to_pylist()
    assert [tuple(r.values())[:6] for r in ka] == [tuple(r.values())[:6] for r in kb]
    assert all(abs(x["p50_ns"] - y["p50_ns"]) <= 1e-9 * x["p50_ns"] + 1 for x, y in zip(ka, kb))


def test_tsdb_outage_never_stops_the_processor(own_victoria, tmp_path):
    """VictoriaMetrics stops mid-run: the processor keeps writing its store and counts retries
    and drops; once it is back, new windows arrive."""
    vm = own_victoria
    run_id = f"outage-{time.time_ns()}"
    config = SimConfig(ranks=8, steps=24, layout="tp=2,pp=2,dp=2", run_id=run_id)
    _, ctx, plan, _ = prepare(config, "healthy")
    steps = iter(Engine(config, plan, emit=True, topology=ctx.topology).run())
    proc, sock = _start_processor(tmp_path / "P", "--window-steps", "2", "--remote-write", vm.write_url,
                                  "--remote-write-queue", "2", "--remote-write-max-backoff", "0.2")
    feeder = Feeder(sock, run_id, ctx.layout, ctx.topology)
    last_step = f'max(max_over_time(argus_window_end_step{{run="{run_id}"}}[2h]))'
    status_path = tmp_path / "P" / "processors" / "proc-0.json"

    def sink_stats() -> dict:
        try:
            return json.loads(status_path.read_text())["remote_write"][0]
        except (FileNotFoundError, KeyError, ValueError):
            return {}

    for _ in range(8):  # windows 0–2 close once step 6 is reported
        feeder.step(next(steps))
    wait_for(lambda: _samples(vm, last_step) >= 5, 20, "the first windows in VictoriaMetrics")
    vm.stop()
    for _ in range(8):  # steps 8–15 while the TSDB is down
        feeder.step(next(steps))
    outage = wait_for(lambda: (s := sink_stats()).get("retries", 0) > 0 and sum(s.get("dropped", {}).values()) > 0
                      and s, 20, "retries and drops in the processor status")
    assert set(outage["dropped"]) <= {"tsdb_unreachable", "tsdb_queue_full"}
    vm.start()
    for rec in steps:  # steps 16–23 after it is back
        feeder.step(rec)
    feeder.close()
    _stop(proc)
    wait_for(lambda: _samples(vm, last_step) == 23, 20, "windows written after the restart")

    attempt = Store.open(tmp_path / "P").attempt()
    assert attempt.read("steps").num_rows == 8 * 24  # the embedded store has every step
    drops = attempt.read("drops").to_pylist()
    assert drops and all(d["table"] == "remote_write" and d["host"] == "proc-0" for d in drops)
    assert {d["reason"] for d in drops} <= {"tsdb_unreachable", "tsdb_queue_full"}
    final = json.loads(status_path.read_text())["remote_write"][0]
    assert final["retries"] >= outage["retries"] > 0 and final["failed_requests"] + final["dropped_windows"] > 0


def test_serve_reads_a_snapshot_from_the_tsdb(streamed, prometheus):
    """``argus serve prom://…`` serves the attempt materialised from the TSDB."""
    from argus.cli.serve import _local_store

    _, proc_store, run_id = streamed("compute_straggler")
    local, follow = _local_store(prometheus.prom_url(run=run_id), every_s=60)
    assert follow is None
    served = Store.open(local).attempt()
    assert served.identity.run_id == run_id and served.meta["phase_detail"] == "aggregated"
    mine = Store.open(proc_store).attempt()
    assert served.read("steps").num_rows == mine.read("steps").num_rows


def test_report_info_and_export_read_the_tsdb_like_diagnose(streamed, prometheus, tmp_path, capsys):
    """Issue 24: every command that reads a store takes prom://… where ``diagnose`` does."""
    from argus.cli.main import main

    _, proc_store, run_id = streamed("compute_straggler")
    url = prometheus.prom_url(run=run_id)
    capsys.readouterr()
    assert main(["info", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["run_id"] == run_id and info["steps"]["last"] >= 0
    assert main(["report", url, "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert 'section class="verdict' in html and "compute_straggler" in html
    assert main(["export", "kineto", url, "--out", str(tmp_path / "k")]) == 0
    assert sorted(p.name for p in (tmp_path / "k").iterdir())[:1] == ["rank0.json"]
