"""``argus bench compression``: bytes per rank-step and fidelity of the kernel summaries.

Workload: the simulator's standard MoE LLM job (4 layers per stage, 8 microbatches, 1F1B;
≈ 900 kernel launches per rank-step of ≈ 25 distinct kernel names), compressed per host
(8 ranks) and window (``window_steps`` steps), as the processor does.

Raw baseline: one CUPTI ``CUpti_ActivityKernel9`` record per kernel, 208 bytes (the size of
``cupti.activity_kernel9_dtype``), names not counted (CUPTI hands out pointers). Summary
size: a compact binary row per cluster (kernel id u16, stream u16, cluster u8, count u32,
p50/p99/min/max f32 = 25 B; 17 B without min/max) plus, separately, the Parquet bytes the
store actually uses. Fidelity: W₁ between each (rank, kernel)'s raw empirical CDF and its
reconstruction, divided by the raw median (and mean) — for the KDE mixture (components
truncated to each cluster's min/max) and for the sketch, compute and communication kernels
apart: collectives in synchronous training mostly measure waiting, and a handful of events
spread over four decades is where three numbers per cluster reach their limit.
"""

from __future__ import annotations

import io
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from argus.compress import empirical_cdf, log_grid, mixture_cdf, sketch_from_row, summarize_kernels, w1

__all__ = ["run"]

RAW_RECORD_BYTES = 208  # CUpti_ActivityKernel9
KDE_ROW_BYTES = 25
KDE_ROW_BYTES_PAPER = 17  # count, p50, p99 only


def _parquet_bytes(table: pa.Table) -> int:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.tell()


def run(ranks: int = 64, window_steps: int = 10, seed: int = 0, hosts: int = 2) -> list[dict]:
    from argus.sim import Engine, SimConfig

    config = SimConfig(ranks=ranks, steps=2 + window_steps, seed=seed)
    engine = Engine(config)
    tables = [rec.kernels_table() for rec in engine.run()][2:]  # after warm-up
    window = pa.concat_tables(tables)
    out = []
    per_host = window.column("rank").to_numpy() // config.hosts_gpus
    for host in range(min(hosts, int(per_host.max()) + 1)):
        k = window.filter(pa.array(per_host == host))
        n_ranks = len(np.unique(k.column("rank").to_numpy()))
        rank_steps = n_ranks * window_steps
        t0 = time.perf_counter()
        summaries, sketches = summarize_kernels(k, 0, 2, 1 + window_steps)
        dt = time.perf_counter() - t0
        raw = k.num_rows * RAW_RECORD_BYTES
        kde = summaries.num_rows * KDE_ROW_BYTES
        sketch_bin = sum(40 + 8 * len(b) for b in sketches.column("buckets").to_pylist())
        fid = _fidelity(k, summaries, sketches)
        out.append({
            "bench": "compression", "host": host, "ranks": n_ranks, "window_steps": window_steps,
            "layout": str(engine.layout), "layers_per_stage": config.layers, "microbatches": config.microbatches,
            "kernels_per_rank_step": round(k.num_rows / rank_steps, 1),
            "distinct_kernels_per_rank": round(sketches.num_rows / n_ranks, 1),
            "raw_bytes_per_rank_step": round(raw / rank_steps),
            "kde_rows_per_rank": round(summaries.num_rows / n_ranks, 1),
            "kde_bytes_per_rank_step": round(kde / rank_steps, 1),
            "kde_ratio": round(raw / kde),
            "kde_ratio_paper_fields": round(raw / (summaries.num_rows * KDE_ROW_BYTES_PAPER)),
            "kde_parquet_bytes_per_rank_step": round(_parquet_bytes(summaries) / rank_steps, 1),
            "sketch_bytes_per_rank_step": round(sketch_bin / rank_steps, 1),
            "sketch_ratio": round(raw / sketch_bin),
            "sketch_parquet_bytes_per_rank_step": round(_parquet_bytes(sketches) / rank_steps, 1),
            **{f"w1_{method}_{cat}_{norm}_{stat}": round(float(fn(fid[(method, cat, norm)])), 5)
               for method in ("kde", "sketch") for cat in ("compute", "comm") for norm in ("rel_median", "rel_mean")
               for stat, fn in (("median", np.median), ("p95", lambda a: np.quantile(a, 0.95)))},
            "compress_events_per_s": round(k.num_rows / dt),
        })
    return out


def _fidelity(k: pa.Table, summaries: pa.Table, sketches: pa.Table) -> dict[tuple[str, str, str], np.ndarray]:
    """Per (rank, stream, kernel): W₁(raw, reconstruction) over the raw median and mean, for the
    KDE mixture and the sketch, keyed by (method, compute|comm, normalisation)."""
    from argus.compress import normalize_kernel_name

    names = pc.dictionary_encode(k.column("name")).combine_chunks()
    short = np.array([normalize_kernel_name(n) for n in names.dictionary.to_pylist()], dtype=object)
    ev_short = short[names.indices.to_numpy()]
    ev_rank, ev_stream = k.column("rank").to_numpy(), k.column("stream").to_numpy()
    dur = k.column("dur_ns").to_numpy().astype(np.float64)
    summ = summaries.to_pylist()
    by_group: dict[tuple, list[dict]] = {}
    for row in summ:
        by_group.setdefault((row["rank"], row["stream"], row["kernel"]), []).append(row)
    out: dict[tuple[str, str, str], list[float]] = {}
    for row in sketches.to_pylist():
        key = (row["rank"], row["stream"], row["kernel"])
        mask = (ev_rank == key[0]) & (ev_stream == key[1]) & (ev_short == key[2])
        d = dur[mask]
        if len(d) < 2:
            continue
        grid = log_grid(d.min() / 2, d.max() * 2, 2048)
        emp = empirical_cdf(d, grid)
        cl = by_group[key]
        rec = mixture_cdf(grid, np.zeros(len(cl)), [c["count"] for c in cl], [c["p50_ns"] for c in cl],
                          [c["p99_ns"] for c in cl], lo=[c["min_ns"] for c in cl], hi=[c["max_ns"] for c in cl])[0]
        cat = "comm" if row["category"] == "comm" else "compute"
        dists = {"kde": float(w1(rec, emp, grid)), "sketch": float(w1(sketch_from_row(row).cdf(grid), emp, grid))}
        for method, dist in dists.items():
            out.setdefault((method, cat, "rel_median"), []).append(dist / float(np.median(d)))
            out.setdefault((method, cat, "rel_mean"), []).append(dist / float(np.mean(d)))
    return {key: np.array(v) for key, v in out.items()}
