"""``argus bench remote-write``: what the processor's TSDB sink sustains, and what it costs.

One host's window (8 ranks of the standard MoE workload, 5 steps: steps, phases, kernel
summaries, hardware samples; ``--workload production``: the kernel summaries of the
production workload's kernels instead) is replayed with advancing steps through a real
:class:`~argus.tsdb.RemoteWriteSink` — series building, protobuf encoding, snappy, HTTP —
into a local endpoint: a stdlib HTTP server in another process that reads and discards each
body (default), or a real TSDB (``--url``, e.g. VictoriaMetrics' ``/api/v1/write``). The
figures are then scaled to the 10,000-GPU plan of DESIGN.md §8 (1,250 hosts × 8 GPUs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.errors import ConfigError

__all__ = ["run", "main"]

_DISCARD = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_port, flush=True)
s.serve_forever()
"""


WORKLOADS = ("standard", "production")


def _window(ranks: int, steps: int, workload: str = "standard"):
    """The layout and one window's tables: steps, phases and hardware samples from the
    simulator; kernel summaries of its kernels (``standard``) or of the production workload's
    12,370 launches per rank-step (``production``, :class:`~argus.sim.production.ProductionWorkload`)."""
    from argus.compress import summarize_kernels
    from argus.sim import Engine, SimConfig
    from argus.topology import parse_layout

    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")
    layout = "tp=2,pp=2,ep=2" if ranks == 8 else None
    cfg = SimConfig(ranks=ranks, steps=steps + 2, layout=layout)
    recs = list(Engine(cfg).run())[2:]
    tables = {t: pa.concat_tables([getattr(r, f"{t}_table")() for r in recs]) for t in ("steps", "phases")}
    tables["hw"] = pa.concat_tables([r.hw for r in recs if r.hw is not None])
    if workload == "production":
        from argus.sim.production import ProductionWorkload

        kernels = ProductionWorkload().generate(ranks, steps, first_step=2).to_table()
    else:
        kernels = pa.concat_tables([r.kernels_table() for r in recs])
    summaries, _ = summarize_kernels(kernels, 0, 2, steps + 1)
    return parse_layout(layout or str(cfg.resolve_layout()), world_size=ranks), tables, summaries


def _shift(t: pa.Table, cols: dict[str, int]) -> pa.Table:
    for name, delta in cols.items():
        if name in t.column_names:
            i = t.column_names.index(name)
            col = t.column(name)
            if name in ("end_ns",):  # keep the "never" marker
                shifted = pc.if_else(pc.less(col, 0), col, pc.add(col, delta))
            else:
                shifted = pc.add(col, delta)
            t = t.set_column(i, name, shifted)
    return t


def run(windows: int = 40, url: str | None = None, ranks: int = 8, window_steps: int = 5,
        step_s: float = 1.0, gpus: int = 10_000, workload: str = "standard") -> dict:
    from argus.tsdb import RemoteWriteConfig, RemoteWriteSink, WindowJob
    from argus.tsdb.remote_write import compress, encode_labels, encode_write_request
    from argus.tsdb.series import AttemptClock, build_window_series

    layout, tables, summaries = _window(ranks, window_steps, workload)
    start = tables["steps"].column("start_ns").to_numpy()
    span = int(tables["steps"].column("end_ns").to_numpy().max() - start.min()) + 1_000_000
    first = int(tables["steps"].column("step").to_numpy().min())
    jobs = []
    for w in range(windows):
        dstep, dt = w * window_steps - first, w * span
        shifted = {k: _shift(v, {"step": dstep, "start_ns": dt, "end_ns": dt, "ts_ns": dt}) for k, v in tables.items()}
        summ = _shift(summaries, {"start_step": dstep, "end_step": dstep})
        summ = summ.set_column(0, "window", pa.array(np.full(summ.num_rows, w), pa.int64()))
        jobs.append(WindowJob(run_id="bench", attempt_id="0", host="node-0000", layout=layout,
                              ranks={r: ("node-0000", r, f"GPU-{r}") for r in range(ranks)}, window=w,
                              start_step=w * window_steps, end_step=(w + 1) * window_steps - 1,
                              steps=shifted["steps"], phases=shifted["phases"], hw=shifted["hw"], summaries=summ))

    # encoding alone (one thread, no network): series building, then protobuf + snappy
    clock = AttemptClock()
    t0 = time.perf_counter()
    batches = [build_window_series(j, clock, "argus") for j in jobs[:10]]
    t_build = (time.perf_counter() - t0) / len(batches)
    b = batches[-1]
    s, t, v = b.arrays()
    labels = [encode_labels(k) for k in b.keys]
    t0 = time.perf_counter()
    for _ in range(10):
        compress(encode_write_request(labels, s, t, v))
    t_encode = (time.perf_counter() - t0) / 10
    rank_series = {k for k in b.keys if any(n == "rank" for n, _ in k) and dict(k)["__name__"] != "argus_rank_info"}
    series_per_rank = len(rank_series) / ranks

    server = None
    if url is not None:  # an unreachable TSDB would only measure the retry policy: say so at once
        import urllib.request

        from argus.tsdb.remote_write import HEADERS

        try:
            urllib.request.urlopen(urllib.request.Request(url, data=compress(b""), headers=HEADERS), timeout=5)
        except OSError as exc:
            raise ConfigError(f"argus bench remote-write: {url} does not take remote write ({exc})") from None
    if url is None:
        server = subprocess.Popen([sys.executable, "-c", _DISCARD], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None  # stdout=PIPE
        url = f"http://127.0.0.1:{server.stdout.readline().strip()}/api/v1/write"
    try:
        sink = RemoteWriteSink(RemoteWriteConfig(url=url, job="bench", queue_windows=windows + 1)).start()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for j in jobs:
            sink.submit(j)
        sink.close(timeout_s=600)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        if server is not None:
            server.kill()
            server.wait()
    st = sink.stats()
    rank_steps = windows * window_steps * ranks
    per_rs_samples = st["samples_sent"] / rank_steps
    per_rs_bytes = st["bytes_sent"] / rank_steps
    samples_per_s = st["samples_sent"] / wall
    host_need = 8 * per_rs_samples / step_s
    return {
        "bench": "remote-write", "workload": workload, "target": "discard" if server is not None else url,
        "ranks": ranks,
        "window_steps": window_steps, "windows": windows, "windows_sent": st["windows_sent"],
        "requests": st["requests_sent"], "dropped": st["dropped"],
        "samples": st["samples_sent"], "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
        "samples_per_s": round(samples_per_s), "samples_per_cpu_s": round(st["samples_sent"] / max(cpu, 1e-9)),
        "build_ms_per_window": round(t_build * 1e3, 2), "encode_snappy_ms_per_window": round(t_encode * 1e3, 2),
        "encode_samples_per_s": round(len(s) / t_encode), "samples_per_rank_step": round(per_rs_samples, 1),
        "bytes_per_rank_step": round(per_rs_bytes, 1),
        "uncompressed_bytes_per_rank_step": round(st["bytes_uncompressed"] / rank_steps, 1),
        "snappy_ratio": round(st["bytes_uncompressed"] / max(st["bytes_sent"], 1), 2),
        "series_per_rank": round(series_per_rank, 1),
        "budget_10k": {
            "gpus": gpus, "step_s": step_s,
            "host_samples_per_s_needed": round(host_need), "host_headroom_x": round(samples_per_s / host_need, 1),
            "host_cpu_share_pct": round(100 * host_need / (st["samples_sent"] / max(cpu, 1e-9)), 2),
            "cluster_samples_per_s": round(gpus * per_rs_samples / step_s),
            "cluster_mb_per_min": round(gpus * per_rs_bytes * 60 / step_s / 1e6, 1),
            "active_series": round(gpus * series_per_rank),
        },
    }


def main(args: argparse.Namespace) -> int:
    print(json.dumps(run(windows=args.windows, url=args.url, step_s=args.step_s, workload=args.workload)), flush=True)
    return 0
