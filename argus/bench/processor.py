"""``argus bench processor``: compression rate, socket throughput, CPU cost at a realistic
rate, and memory over a long stream — against a real ``argus processor`` process.

Clients replay one simulated window (8 ranks of the standard workload) with advancing step
numbers over real unix sockets. The processor's CPU time comes from ``/proc/<pid>/stat``
and its memory from ``/proc/<pid>/status`` (VmRSS), sampled while it runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import encode_array, encode_json

__all__ = ["run_compression", "run_socket"]

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _window(ranks: int = 8, steps: int = 5, seed: int = 0):
    from argus.sim import Engine, SimConfig
    from argus.sim.feed import step_batches

    engine = Engine(SimConfig(ranks=ranks, steps=steps + 2, layout="tp=2,pp=2,ep=2", seed=seed))
    recs = list(engine.run())[2:]
    return engine, [step_batches(r) for r in recs]


def run_compression(repeat: int = 5) -> dict:
    """Kernel events compressed per second on one core (the processor's hot loop)."""
    from argus.compress import summarize_kernels
    from argus.sim import Engine, SimConfig

    engine = Engine(SimConfig(ranks=8, steps=12, layout="tp=2,pp=2,ep=2"))
    k = pa.concat_tables([r.kernels_table() for r in engine.run()][2:])
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        summarize_kernels(k, 0, 2, 11)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"bench": "processor", "mode": "compression", "events": k.num_rows, "best_s": round(best, 4),
            "events_per_s_per_core": round(k.num_rows / best)}


def run_socket(mode: str, events: int | None = 5_000_000, rate_per_min_per_rank: float | None = None,
               duration_s: float | None = None, evidence: bool = True, window_steps: int = 5) -> dict:
    """Stream through a real processor, as fast as possible or paced at
    ``rate_per_min_per_rank``, until ``events`` are sent or ``duration_s`` has passed."""
    engine, steps = _window()
    ranks = sorted(steps[0])
    names = engine.names.names
    tmp = Path(tempfile.mkdtemp(prefix="argus-pb-"))
    sock = tmp / "p.sock"
    args = [sys.executable, "-m", "argus", "processor", "--store", str(tmp / "store"), "--socket", str(sock),
            "--host", "bench", "--window-steps", str(window_steps), "--no-fsync"]
    # evidence on = a Perfetto trace of every window: the worst case (the default writes one
    # for slow windows and one every 10 s otherwise)
    args += ["--evidence-interval", "0"] if evidence else ["--no-evidence"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("processor did not start")
            time.sleep(0.05)
        clients = {}
        for r in ranks:
            c = ProcessorClient(sock, {"run_id": "bench", "rank": r, "world_size": 8, "host": "bench",
                                       "local_rank": r, "layout": "tp=2,pp=2,ep=2"})
            c.connect()
            c.send_raw(encode_json(Msg.NAMES, list(enumerate(names))))
            clients[r] = c
        per_step = sum(len(b) for s in steps[:1] for rb in s.values() for b in rb.values())
        cpu0, t0 = _cpu_s(proc.pid), time.perf_counter()
        sent, step, rss = 0, 0, []
        last_sample = 0.0
        while True:
            elapsed = time.perf_counter() - t0
            if (events is not None and sent >= events) or (duration_s is not None and elapsed >= duration_s):
                break
            if rate_per_min_per_rank is not None:
                target = rate_per_min_per_rank / 60 * len(ranks) * elapsed
                if sent > target:
                    time.sleep(min(0.05, (sent - target) / (rate_per_min_per_rank / 60 * len(ranks))))
                    continue
            batches = steps[step % len(steps)]
            for r, by_msg in batches.items():
                for msg in (Msg.PHASES, Msg.KERNELS, Msg.STEPS):
                    recs = by_msg[msg].copy()
                    recs["step"] = step
                    clients[r].send_raw(encode_array(msg, recs))
            sent += per_step
            step += 1
            if step % 50 == 0:
                for c in clients.values():
                    c.poll_acks()  # a well-behaved client reads its ACKs
            if elapsed - last_sample >= 1.0:
                rss.append(_rss_mb(proc.pid))
                last_sample = elapsed
        for c in clients.values():
            c.flush(1)
        for c in clients.values():
            c.wait_for_ack(lambda a: a.get("seq") == 1, timeout_s=600)
        wall = time.perf_counter() - t0
        cpu = _cpu_s(proc.pid) - cpu0
        rss.append(_rss_mb(proc.pid))
        for c in clients.values():
            c.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        third = max(len(rss) // 3, 1)
        mid = rss[third:-third] or rss
        return {
            "bench": "processor", "mode": mode, "ranks": len(ranks), "evidence": evidence,
            "window_steps": window_steps, "events": sent, "steps": step, "wall_s": round(wall, 2),
            "events_per_s": round(sent / wall), "processor_cpu_s": round(cpu, 2),
            "events_per_cpu_s": round(sent / cpu) if cpu else None,
            "processor_core_pct": round(100 * cpu / wall, 2),
            "rate_per_min_per_rank": rate_per_min_per_rank,
            "rss_mb_first_third_max": round(max(rss[:third]), 1), "rss_mb_middle_third_max": round(max(mid), 1),
            "rss_mb_last_third_max": round(max(rss[-third:]), 1),
            "rss_mb_max": round(max(rss), 1), "rss_samples": len(rss),
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

