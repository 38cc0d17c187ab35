"""``argus bench healthcheck``: how often ``argus healthcheck --quick`` fails this node when nothing
is wrong with it (issue 42: a check that fails healthy nodes is the one operators learn to ignore).

One baseline is taken (``--save-baseline``), then ``runs`` quick checks are judged against it, one
after another, each a fresh process as a Slurm prolog would run it. Per run: its exit code, wall
time and the figures that failed; then the false-fail rate (runs that failed, on a node assumed
healthy: say so if it is not) and which figures failed how often. ``load``: one process spins on
a CPU beside every run after the baseline — each run should then say the node is loaded (exit
3) or pass, never fail it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

__all__ = ["run", "links", "drift", "judge_series"]


def _check(baseline: Path, save: bool, timeout_s: float) -> tuple[int, float, dict | None]:
    cmd = [sys.executable, "-m", "argus", "healthcheck", "--quick", "--json", "--baseline-dir", str(baseline)]
    if save:
        cmd.append("--save-baseline")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        doc = None
    return done.returncode, wall, doc


def _failed(doc: dict | None) -> list[str]:
    if doc is None:
        return ["(no report)"]
    return [f"{v['metric']} {v['subject']}{' ' + str(v['size_bytes']) + ' B' if v.get('size_bytes') else ''}"
            for v in doc.get("verdicts", []) if v.get("status") == "fail"]


def _why(doc: dict | None) -> list[str]:
    return [str(v.get("why", ""))[:300] for v in (doc or {}).get("verdicts", []) if v.get("status") == "fail"]


def run(runs: int = 30, baseline_dir: str | None = None, timeout_s: float = 300.0, emit=print,
        load: bool = False) -> dict:
    """Emit one JSON line per run and the summary (also returned)."""
    from argus.cli.healthcheck import EXIT_LOADED

    spinner = None
    with tempfile.TemporaryDirectory(prefix="argus-hc-bench-") as tmp:
        base = Path(baseline_dir) if baseline_dir else Path(tmp)
        rc, wall, doc = _check(base, True, timeout_s)
        emit(json.dumps({"baseline": True, "rc": rc, "wall_s": round(wall, 2), "failed": _failed(doc) if rc else []}))
        per: Counter[str] = Counter()
        failed_runs = loaded_runs = 0
        walls: list[float] = []
        try:
            if load:
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for i in range(runs):
                rc, wall, doc = _check(base, False, timeout_s)
                failed = _failed(doc) if rc != 0 else []
                failed_runs += rc not in (0, EXIT_LOADED)
                loaded_runs += rc == EXIT_LOADED
                walls.append(wall)
                per.update(failed)
                share = (doc or {}).get("load") or {}
                emit(json.dumps({"run": i + 1, "rc": rc, "wall_s": round(wall, 2), "failed": failed,
                                 **({"why": _why(doc)} if failed else {}),
                                 "others_cpu_share": share.get("others_cpu_share"),
                                 "remeasured": len((doc or {}).get("remeasured") or [])}))
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    summary = {"summary": True, "runs": runs, "load": load, "failed_runs": failed_runs, "loaded_runs": loaded_runs,
               "false_fail_rate": round(failed_runs / runs, 4) if runs else None,
               "median_wall_s": round(sorted(walls)[len(walls) // 2], 2) if walls else None,
               "failed_figures": dict(per.most_common(20)),
               "note": ("one process spinning beside every run: a failed run (exit 1) is a false fail, a loaded one "
                        "(exit 3) the answer wanted" if load else
                        "a node assumed healthy and quiet: every failed run is a false fail")}
    emit(json.dumps(summary))
    return summary


#: the links bench's check: the net level alone, as ``tests/healthcheck/test_netns.py`` runs it
LINK_CHECK = ("--level", "net", "--json", "--seconds", "0.4", "--sizes", "8,1048576")


def _host_verdicts(doc: dict | None) -> dict[str, dict]:
    return {v["subject"]: v for v in (doc or {}).get("verdicts", []) if v.get("metric") == "host_links_busbw_gbs"}


def links(runs: int = 5, fraction: float = 0.8, hosts: int = 4, throttled: int = 2, emit=print,
          timeout_s: float = 300.0, keep: Path | None = None) -> dict:
    """The net level across ``hosts`` network-namespace hosts (one rank each): one baseline, then
    ``runs`` checks as they are (each should pass), then ``runs`` with host ``throttled``'s link
    limited by ``tc tbf`` to ``fraction`` of its links' median bus bandwidth in the baseline (each
    should fail that host, and no other). ``keep``: each check's report is written there too.
    Needs root, ``ip`` and ``tc``."""
    from argus.errors import ArgusError
    from argus.workloads.netns import NamespaceCluster, available, cleanup_stale, launch_job

    why = available()
    if why is not None:
        raise ArgusError(f"the links bench needs network namespaces here: {why}")
    if not 0 <= throttled < hosts or hosts < 3:
        raise ArgusError(f"--hosts {hosts} (at least 3) and --throttled {throttled} (one of them)")
    cleanup_stale()

    def check(cluster: NamespaceCluster, base: Path, *extra: str) -> tuple[float, dict | None]:
        t0 = time.perf_counter()
        res = launch_job(cluster, "-m", ["argus", "healthcheck", *LINK_CHECK, "--baseline-dir", str(base), *extra],
                         timeout=timeout_s)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"check-{len(list(keep.glob('check-*.json'))):03d}.json").write_text(res[0].stdout)
        try:
            return time.perf_counter() - t0, json.loads(res[0].stdout)
        except ValueError:
            return time.perf_counter() - t0, None

    out: dict = {"summary": True, "hosts": hosts, "throttled_host": throttled, "fraction": fraction, "runs": runs}
    with tempfile.TemporaryDirectory(prefix="argus-hc-links-") as tmp, NamespaceCluster(hosts) as cluster:
        base = Path(tmp)
        names = [f"host:{cluster.host_name(h)}" for h in range(hosts)]
        wall, doc = check(cluster, base, "--save-baseline")
        linked = [v for v in (doc or {}).get("verdicts", []) if v.get("metric") == "link_busbw_gbs"]
        if not linked:
            raise ArgusError("the baseline measured no links")
        gbs = sorted(float(v["value"]) for v in linked)[len(linked) // 2]
        mbit = int(gbs * 8e3 * fraction)
        emit(json.dumps({"baseline": True, "wall_s": round(wall, 2), "links_median_gbs": round(gbs, 4),
                         "throttle_mbit": mbit}))
        tallies = {"healthy": [0, 0], "throttled": [0, 0]}  # [runs failing any host, runs failing another host]
        detected = 0
        for phase in ("healthy", "throttled"):
            if phase == "throttled":  # a bucket of 1 ms at the rate, well below one 1 MiB message: each
                # message is shaped to the rate (a bucket of 4 ms held a whole message, and the
                # "throttle" read 0–28% below the baseline)
                cluster.throttle(throttled, rate=f"{mbit}mbit", burst=f"{max(mbit, 64)}kbit", latency="400ms")
            for i in range(runs):
                wall, doc = check(cluster, base)
                hv = _host_verdicts(doc)
                failed = sorted(s for s, v in hv.items() if v["status"] == "fail")
                others = [s for s in failed if s != names[throttled]]
                tallies[phase][0] += bool(failed)
                tallies[phase][1] += bool(others)
                detected += phase == "throttled" and names[throttled] in failed
                emit(json.dumps({"phase": phase, "run": i + 1, "wall_s": round(wall, 2), "failed_hosts": failed,
                                 "deficits": {s.removeprefix("host:"): round(float(v["deficit"]), 3)
                                              for s, v in sorted(hv.items())},
                                 "why": {s: hv[s]["why"][:200] for s in failed}}))
    out.update({"false_fail_rate": round(tallies["healthy"][0] / runs, 4),
                "detection_rate": round(detected / runs, 4),
                "throttled_runs_failing_another_host": tallies["throttled"][1],
                "note": f"host {throttled}'s link limited to {fraction:.0%} of the baseline's median link bus bandwidth"})
    emit(json.dumps(out))
    return out


#: seconds a quick check's gpu level takes: a re-measurement "at once" starts this much later
LEVEL_S = 3.0


def _offsets(pauses: tuple[float, ...]) -> tuple[float, ...]:
    """When each re-measurement starts, after the first: each pause follows a level's run."""
    out, t = [], 0.0
    for p in pauses:
        t += LEVEL_S + p
        out.append(t)
    return tuple(out)


def _policies() -> tuple[tuple[str, tuple[float, ...]], ...]:
    from argus.healthcheck import AGAIN_PAUSES_S

    return (("measured again once, at once", _offsets((0.0,))),
            ("measured again after " + ", ".join(f"{x:g}" for x in AGAIN_PAUSES_S) + " s (AGAIN_PAUSES_S)",
             _offsets(AGAIN_PAUSES_S)))
#: a quick --save-baseline's three runs start about this far apart
BASELINE_RUN_GAP_S = 16.0


def drift(seconds: float = 420.0, emit=print, every_s: float = 0.5) -> dict:
    """How the memory-copy figure of this node drifts, and what that does to the check: the quick
    check's ``copy_gbs`` probe (5 rounds of 0.1 s) measured every ``every_s`` for ``seconds``, then
    every baseline the series allows (three measurements ``BASELINE_RUN_GAP_S`` apart, as
    ``--save-baseline`` takes them) and every check 50 s or more after it judged by the real rules
    (``judge``) under each re-measure policy: a false fail is a check whose first measurement and
    every re-measurement fail. The node is assumed healthy: every fail is false."""
    import torch

    from argus.healthcheck.probes import copy_gbs

    t0 = time.monotonic()
    series: list[tuple[float, list[float]]] = []
    while time.monotonic() - t0 < seconds:
        series.append((time.monotonic() - t0, sorted(copy_gbs(torch, 64 << 20, 0.1) for _ in range(5))))
        time.sleep(every_s)
    out = judge_series(series)
    emit(json.dumps(out))
    return out


def judge_series(series: list[tuple[float, list[float]]]) -> dict:
    """``drift``'s verdicts on a recorded series of (seconds, the five rounds' GB/s)."""
    import numpy as np

    from argus.healthcheck import HealthReport, Level, Measurement, Status, judge

    t = np.array([x for x, _ in series])
    med = np.array([float(np.median(r)) for _, r in series])

    def report(i: int) -> HealthReport:
        r = series[i][1]
        return HealthReport("node", "cpu", {}, 0.0, measurements=[Measurement(
            Level.GPU, "copy_gbs", "device", float(np.median(r)), "GB/s", 64 << 20, 1 - min(r) / max(r),
            samples=tuple(r))])

    def at(x: float) -> int | None:
        i = int(np.searchsorted(t, x))
        return i if i < len(t) else None

    policies = _policies()
    horizon = max(d for _, ds in policies for d in ds)
    fails: dict[tuple[int, int], bool] = {}

    def failed(b: int, base: HealthReport, i: int | None) -> bool:
        assert i is not None
        if (b, i) not in fails:
            fails[(b, i)] = any(v.status == Status.FAIL for v in judge(report(i), base))
        return fails[(b, i)]

    counts = {label: [0, 0, 0] for label, _ in policies}  # checks, first failed, failed every time
    for b in range(len(t)):
        runs = [i for k in range(3) if (i := at(t[b] + k * BASELINE_RUN_GAP_S)) is not None]
        if len(runs) < 3:
            break
        base = report(runs[0]).with_runs([report(i) for i in runs[1:]])
        for c in range(len(t)):
            if t[c] < t[b] + 50 or at(t[c] + horizon) is None:
                continue
            first = failed(b, base, c)
            for label, ds in policies:
                counts[label][0] += 1
                counts[label][1] += first
                counts[label][2] += first and all(failed(b, base, at(t[c] + d)) for d in ds)
    out = {"summary": True, "seconds": round(float(t[-1]), 1) if len(t) else 0.0, "measurements": len(series),
           "copy_gbs": {"min": round(float(med.min()), 2), "p10": round(float(np.percentile(med, 10)), 2),
                        "median": round(float(np.median(med)), 2), "p90": round(float(np.percentile(med, 90)), 2),
                        "max": round(float(med.max()), 2)} if len(med) else None,
           "policies": [{"policy": label, "checks": n, "first_measurement_failed": f1, "false_fails": ff,
                         "false_fail_rate": round(ff / n, 4) if n else None}
                        for label, (n, f1, ff) in counts.items()]}
    return out
