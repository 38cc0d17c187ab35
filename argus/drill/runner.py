"""Run one drill: launch the job under ``argus run``, wait until it trains, inject the fault into
one of its ranks (or its processor), then time what reacted: the store's record of the fault,
the incident (right class, right culprit?), the alert (delivered?), the action proposed.

Only processes of the job launched here are touched: their pids come from this run's own
processor (its status file lists the ranks that connected to it, by pid).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from argus.drill.kinds import EXPECT, DrillKind
from argus.errors import ArgusError

if TYPE_CHECKING:
    from argus.processor.status import ProcessorStatus

__all__ = ["Drill", "DrillResult", "Stage", "run_drill", "bundled_job", "bundled_link_job"]


@dataclass
class Stage:
    name: str
    result: str  # "pass" | "fail" | "skipped"
    delay_s: float | None  # after the fault was injected
    detail: str


@dataclass
class DrillResult:
    kind: str
    rank: int
    store: str
    run_id: str
    injected_ns: int = 0
    stages: list[Stage] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(s.result != "fail" for s in self.stages) and any(s.result == "pass" for s in self.stages)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


@dataclass
class Drill:
    kind: DrillKind
    store: Path
    command: list[str]
    rank: int = 1
    host: str = "drill"
    after_steps: int = 5  # inject once the job finished this many steps (past warm-up)
    duration_s: float = 15.0  # stall-rank: how long the rank is frozen (past the hang threshold: caught live)
    hang_min_s: float = 10.0  # the processor's live hang threshold for this run
    timeout_s: float = 300.0
    alertmanager: str | None = None  # check the P0–P2 alert reached it
    webhook: str | None = None
    on_event: Callable[[str], None] = lambda line: None
    hosts: int = 6  # link: namespace hosts, one rank each (the command runs once per rank, torchrun-free)
    layout: str = "pp=2,dp=3"  # link: the job's layout
    rate: str = "20mbit"  # link: the throttled host's rate, both directions


def bundled_job(ranks: int = 4, steps: int = 40) -> list[str]:
    """The demo's gloo transformer, untouched by any fault of its own."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            "-m", "argus.workloads.train_transformer", "--steps", str(steps), "--microbatches", "2", "--fault", "none"]


def bundled_link_job(hosts: int = 6, steps: int = 30) -> list[str]:
    """The demo's transformer as a two-stage pipeline, one rank a host (the link drill runs it
    once per namespace host with the rank's environment). With more hosts than vCPUs every rank
    trains on one vCPU (``--pin-cpu``, once its process group is up): ranks floating over vCPUs
    of different speed are devices of different speed, which a drill must not mistake for its
    fault (``tests/e2e/jobs.pin_cpu``)."""
    from argus.workloads.affinity import usable_cpus

    cpus = usable_cpus()
    pin = ["--pin-cpu", str(cpus[-1])] if cpus and len(cpus) < hosts else []
    return [sys.executable, "-m", "argus.workloads.train_transformer", "--mode", "pipeline", "--steps", str(steps),
            "--microbatches", "2", "--d-model", "64", "--layers", "1", "--vocab", "256", "--fault", "none", *pin]


def _status(store: Path, host: str) -> ProcessorStatus:
    from argus.processor.status import ProcessorStatus, read_status

    return read_status(store, host) or ProcessorStatus()


def _steps_done(store: Path, run_id: str) -> int:
    from argus.store import Store

    try:
        a = Store.open(store).attempt(run_id)
        return len(a.files("steps")) and int(a.sql("SELECT count(DISTINCT step) AS n FROM steps").column("n")[0].as_py())
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def _wait(predicate: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return predicate()


class _Throttle(threading.Thread):
    """Stops ``pid`` for ``stop_share`` of every ``period_s``: a CPU limit without cgroups."""

    def __init__(self, pid: int, stop_share: float = 0.6, period_s: float = 0.1):
        super().__init__(name="argus-drill-throttle", daemon=True)
        self.pid, self.stop_share, self.period_s = pid, stop_share, period_s
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self.stop_share * self.period_s)
                os.kill(self.pid, signal.SIGCONT)
                time.sleep((1 - self.stop_share) * self.period_s)
        except ProcessLookupError:
            pass
        finally:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def run_drill(d: Drill) -> DrillResult:
    run_id = f"drill-{d.kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    res = DrillResult(str(d.kind), d.rank if d.kind != DrillKind.PROCESSOR else -1, str(d.store), run_id)
    from argus.store import Store

    Store.create(d.store)  # so that a wrong --store fails here, and the drill's log can live in it
    log_path = d.store / "drills" / f"{run_id}.log"
    log_path.parent.mkdir(exist_ok=True)
    if d.kind == DrillKind.LINK:
        _link_drill(d, res, log_path)
        return res
    cmd = [sys.executable, "-m", "argus", "run", "--store", str(d.store), "--host", d.host, "--run-id", run_id,
           "--hang-min-s", str(d.hang_min_s), "--", *d.command]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log_path, "wb") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _drive(d, res, job, log_path)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return res


def _drive(d: Drill, res: DrillResult, job: subprocess.Popen, log_path: Path) -> None:
    t_start = time.monotonic()
    d.on_event(f"job started under argus run (run {res.run_id}); waiting for {d.after_steps} steps")
    if not _wait(lambda: job.poll() is not None or _steps_done(d.store, res.run_id) >= d.after_steps, d.timeout_s):
        raise ArgusError(f"the job did not reach step {d.after_steps} in {d.timeout_s:.0f} s (its log: {log_path})")
    if job.poll() is not None:
        raise ArgusError(f"the job ended before the drill could start (exit {job.returncode}; its log: {log_path})")
    status = _status(d.store, d.host)
    pids = {int(r): int(p) for p, r in (status.rank_pids or {}).items()}
    if d.kind == DrillKind.PROCESSOR:
        target = int(status.pid or 0)
        if not target:
            raise ArgusError("this run's processor did not say its pid")
    else:
        if d.rank not in pids:
            raise ArgusError(f"rank {d.rank} did not connect to this run's processor (ranks: {sorted(pids)})")
        target = pids[d.rank]
    res.injected_ns = time.time_ns()
    t0 = time.monotonic()
    d.on_event(f"injecting {d.kind} into {'the processor' if d.kind == DrillKind.PROCESSOR else f'rank {d.rank}'} "
               f"(pid {target}) after {t0 - t_start:.1f} s")
    throttle = None
    if d.kind in (DrillKind.KILL_RANK, DrillKind.PROCESSOR):
        os.kill(target, signal.SIGKILL)
    elif d.kind == DrillKind.STALL_RANK:
        os.kill(target, signal.SIGSTOP)
        time.sleep(d.duration_s)
        os.kill(target, signal.SIGCONT)
    elif d.kind == DrillKind.SLOW_RANK:
        throttle = _Throttle(target)
        throttle.start()
    elif d.kind == DrillKind.HANG:
        os.kill(target, signal.SIGSTOP)
        # the processor records the hang live; then the job is ended as an operator would
        caught = _wait(lambda: _hang_recorded(d.store, res.run_id), d.hang_min_s * 3 + 30, 0.5)
        res.stages.append(Stage("caught live", "pass" if caught else "fail", time.monotonic() - t0 if caught else None,
                                "the processor recorded the hang" if caught else "no hang recorded"))
        os.killpg(job.pid, signal.SIGTERM)
        try:
            os.kill(target, signal.SIGCONT)
        except ProcessLookupError:
            pass
    ended = _wait(lambda: job.poll() is not None, d.timeout_s, 0.5)
    if throttle is not None:
        throttle.halt.set()
        throttle.join(5)
    if not ended:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    res.stages.append(Stage("job ended", "pass", time.monotonic() - t0, f"argus run exited {job.returncode}"))
    said = log_path.read_text(errors="replace")
    if d.kind == DrillKind.PROCESSOR:
        line = next((ln for ln in said.splitlines() if ln.startswith("argus run: the processor")), "")
        res.stages.append(Stage("reported by argus run", "pass" if line else "fail", None,
                                line[:200] or "argus run said nothing about its processor"))
    else:
        _judge(d, res, t0)
    _alert(d, res)


def _link_drill(d: Drill, res: DrillResult, log_path: Path) -> None:
    """A multi-host job on network namespaces (one ``argus run`` a host into one store, as on a
    cluster with a shared filesystem); once it trains, one host's link is throttled with ``tc
    tbf`` in both directions until the job ends. Needs root, ``ip`` and ``tc``."""
    from argus.workloads.netns import JobTimeout, NamespaceCluster, available, cleanup_stale, launch_job

    why = available()
    if why is not None:
        raise ArgusError(f"the link drill needs network namespaces here: {why}")
    if not 0 <= d.rank < d.hosts:
        raise ArgusError(f"--rank {d.rank} is not a host of the {d.hosts}-host job (one rank a host)")
    cleanup_stale()
    args = ["argus", "run", "--store", str(d.store), "--run-id", res.run_id, "--layout", d.layout,
            "--hang-min-s", str(d.hang_min_s), "--", *d.command]
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done: list[subprocess.CompletedProcess] = []
    failed: list[BaseException] = []

    def job() -> None:
        try:
            done.extend(launch_job(cluster, "-m", args, env=env,
                                   timeout=d.timeout_s))
        except JobTimeout as exc:
            done.extend(exc.results)
            failed.append(exc)
        except BaseException as exc:  # noqa: BLE001 - reported as the job's stage
            failed.append(exc)

    t_start = time.monotonic()
    with NamespaceCluster(d.hosts) as cluster:
        thread = threading.Thread(target=job, name="argus-drill-link-job", daemon=True)
        d.on_event(f"job started on {d.hosts} namespace hosts under argus run (run {res.run_id}); "
                   f"waiting for {d.after_steps} steps")
        thread.start()
        trained = _wait(lambda: not thread.is_alive() or _steps_done(d.store, res.run_id) >= d.after_steps,
                        d.timeout_s)
        if not trained or not thread.is_alive():
            thread.join(d.timeout_s)
            _write_log(log_path, done)
            raise ArgusError(f"the job {'ended' if trained else 'did not reach step ' + str(d.after_steps)} before "
                             f"the drill could start ({failed[0] if failed else 'see its log'}: {log_path})")
        host = cluster.host_name(d.rank)
        cluster.throttle(d.rank, rate=d.rate, burst="32kbit", latency="400ms")
        res.injected_ns = time.time_ns()
        t0 = time.monotonic()
        d.on_event(f"throttled {host}'s link to {d.rate} after {t0 - t_start:.1f} s")
        thread.join(d.timeout_s + 30)
    _write_log(log_path, done)
    codes = [r.returncode for r in done]
    ok = bool(codes) and all(c == 0 for c in codes) and not failed
    res.stages.append(Stage("job ended", "pass" if ok else "fail", time.monotonic() - t0,
                            f"{len(codes)} hosts' argus run exited {sorted(set(codes))}"
                            + (f": {failed[0]}"[:160] if failed else "")))
    _judge(d, res, t0)
    _alert(d, res)


def _write_log(path: Path, done: list[subprocess.CompletedProcess]) -> None:
    with open(path, "w") as out:
        for rank, r in enumerate(done):
            out.write(f"== host {rank}: exit {r.returncode}\n{r.stdout}{r.stderr}\n")


def _hang_recorded(store: Path, run_id: str) -> bool:
    from argus.store import Store

    try:
        return bool(Store.open(store).attempt(run_id).files("hangs"))
    except Exception:  # noqa: BLE001
        return False


def _judge(d: Drill, res: DrillResult, t0: float) -> None:
    from argus.analysis import DiagnoseConfig, diagnose
    from argus.store import Store

    expect = EXPECT[d.kind]
    attempt = Store.open(d.store).attempt(res.run_id)
    diag = diagnose(attempt, DiagnoseConfig())
    claims = [i for i in diag.incidents if i.severity != "info"]
    right = [i for i in claims if str(i.klass) in expect.classes and (not expect.culprit or d.rank in i.culprit_ranks)]
    if right:
        inc = right[0]
        extra = sorted(set(inc.culprit_ranks) - {d.rank})
        ok = not extra
        res.stages.append(Stage("incident", "pass" if ok else "fail", time.monotonic() - t0,
                                f"{inc.klass} ({inc.state}, {inc.severity}) culprits {inc.culprit_ranks}"
                                + (f": names ranks {extra} too" if extra else "")))
        res.stages.append(Stage("action proposed", "pass", None, f"{inc.action}: {inc.to_json().get('remedy', '')}"[:200]))
        others = [i for i in claims if i is not inc and d.rank not in i.culprit_ranks]
        if others:
            res.stages.append(Stage("no false culprit", "fail", None,
                                    "; ".join(f"{i.klass} on ranks {i.culprit_ranks}" for i in others)[:200]))
    else:
        seen = "; ".join(f"{i.klass} ranks {i.culprit_ranks}" for i in claims) or "no incident"
        res.stages.append(Stage("incident", "fail", None,
                                f"expected {'/'.join(expect.classes)} naming rank {d.rank}; got {seen}"[:200]))


def _alert(d: Drill, res: DrillResult) -> None:
    if not (d.alertmanager or d.webhook):
        res.stages.append(Stage("alert", "skipped", None, "no --alertmanager or --webhook given"))
        return
    from argus.alerting import AlertmanagerSink, AnalysisService, WebhookSink

    sinks: list[Any] = []
    if d.webhook:
        sinks.append(WebhookSink(d.webhook))
    if d.alertmanager:
        sinks.append(AlertmanagerSink(d.alertmanager))
    t = time.monotonic()
    cycle = AnalysisService(d.store, sinks, run_id=res.run_id).cycle()
    sent = [s for s in cycle.sent]
    delivered = bool(sent) and not cycle.errors
    if delivered and d.alertmanager:
        delivered = _wait(lambda: _am_has(d.alertmanager or "", res.run_id), 15, 0.5)
    res.stages.append(Stage("alert", "pass" if delivered else "fail",
                            (time.time_ns() - res.injected_ns) / 1e9 if delivered else None,
                            (f"{len(sent)} sent ({', '.join(sorted({p for _, _, p in sent}))}) in "
                             f"{time.monotonic() - t:.1f} s" if sent else "nothing sent")
                            + (f"; errors: {'; '.join(cycle.errors)[:120]}" if cycle.errors else "")))


def _am_has(url: str, run_id: str) -> bool:
    import urllib.request

    try:
        alerts = json.loads(urllib.request.urlopen(url.rstrip("/") + "/api/v2/alerts", timeout=5).read())
    except (OSError, ValueError):
        return False
    return any(run_id in json.dumps(a.get("labels", {})) for a in alerts)
