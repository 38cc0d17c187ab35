"""Canonical Arrow schemas of the run-store tables, with a description of every column.

These schemas are the contract between writers (simulator, processor, importers) and
readers (analysis, report, web). ``docs/store.md`` is generated from this module
(``python -m argus.store.schema``) so the two cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pyarrow as pa

from argus.errors import StoreError

__all__ = ["SCHEMA_VERSION", "TABLES", "TableSpec", "conform", "render_markdown"]

#: Version of the on-disk layout and table schemas. Readers refuse newer versions.
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    doc: str
    columns: tuple[tuple[str, pa.DataType, str], ...]
    step_column: str | None = "step"

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, t, nullable=True) for n, t, _ in self.columns])

    @property
    def column_names(self) -> list[str]:
        return [n for n, _, _ in self.columns]


_I32, _I64, _F64, _STR = pa.int32(), pa.int64(), pa.float64(), pa.string()

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec(
            "topology",
            "Placement of every rank of the attempt (one row per rank). Resolves a rank to host and GPU.",
            (
                ("rank", _I32, "global rank"),
                ("host", _STR, "host name as the launcher reported it"),
                ("local_rank", _I32, "rank index on its host"),
                ("gpu_uuid", _STR, "GPU UUID (`GPU-…`), or `cpu-…` on CPU-only jobs"),
                ("tp", _I32, "tensor-parallel coordinate"),
                ("cp", _I32, "context-parallel coordinate"),
                ("ep", _I32, "expert-parallel coordinate"),
                ("dp", _I32, "data-parallel coordinate (outside the expert dimension)"),
                ("pp", _I32, "pipeline stage"),
                ("topology_version", _I32, "bumped when the placement changes within an attempt"),
            ),
            step_column=None,
        ),
        TableSpec(
            "steps",
            "One row per rank and training step: the step's wall-clock span on that rank.",
            (
                ("rank", _I32, "global rank"),
                ("step", _I64, "training step (iteration) number"),
                ("start_ns", _I64, "step start, host monotonic clock in ns (per-host offsets are not corrected)"),
                ("end_ns", _I64, "step end in ns; -1 when the step never finished (hang, crash)"),
            ),
        ),
        TableSpec(
            "phases",
            "Framework-level phases: per-microbatch forward/backward compute, module phases "
            "(`self_attention`, `mlp`, `moe_layer`…), collectives and host work.",
            (
                ("rank", _I32, "global rank"),
                ("step", _I64, "training step"),
                ("microbatch", _I32, "microbatch index within the step; -1 for step-level phases"),
                ("name", _STR, "phase name, e.g. `forward-compute`, `self_attention`, `tp-allreduce`, `dataloader`"),
                ("category", _STR, "`compute` (device busy), `comm` (collective or p2p: may include waiting) or `host` (CPU-side work)"),
                ("group_kind", _STR, "for `comm`: the group the collective runs in (`tp`, `cp`, `ep`, `dp`, `edp`, `pp`, `world`); empty otherwise"),
                ("start_ns", _I64, "phase start in ns (same clock as `steps`)"),
                ("dur_ns", _I64, "phase duration in ns; -1 when it never finished (a collective a peer never joined)"),
                ("wait_ns", _I64, "for `compute`/`host`: time inside the phase the producer measured as not this rank's "
                 "work — blocked in synchronous collectives or p2p, waiting at the end of backward for gradient "
                 "all-reduce, preempted by other processes (CPU runs); -1: not measured, busy time is then "
                 "estimated from the `comm` phases nested in it. For `comm` phases a CPU rank waited for itself: "
                 "the waiting thread's run-queue delay inside it (scheduling, not the link); else -1"),
            ),
        ),
        TableSpec(
            "phase_totals",
            "Derived from `phases` as each of its files is written (one file beside each, same name): per "
            "(rank, step, phase name) aggregates, plus per microbatch for a phase that ran once in it. A "
            "diagnosis reads these instead of scanning every phase row for its totals; a phases file without "
            "its twin is aggregated when read.",
            (
                ("rank", _I32, "global rank"),
                ("step", _I64, "training step"),
                ("microbatch", _I32, "-1: every row of the phase in the step; ≥ 0: that microbatch's one row of a "
                 "non-`comm` phase"),
                ("name", _STR, "phase name"),
                ("category", _STR, "as in `phases`"),
                ("group_kind", _STR, "as in `phases`"),
                ("count", _I64, "rows, finished or not"),
                ("work_ns", _F64, "Σ finished `dur_ns` less `wait_ns` where measured"),
                ("min_ns", _F64, "shortest finished `dur_ns` (null if none finished)"),
                ("pos_ns", _F64, "Σ finished `dur_ns`"),
                ("pos_nomb_ns", _F64, "Σ finished `dur_ns` of the rows outside any microbatch (null if none)"),
                ("mb_most", _I64, "most rows of the phase in one microbatch (non-`comm` phases; 0 if none)"),
                ("end_min_ns", _I64, "earliest end (`start_ns` + `dur_ns`) of a finished row (null if none): a step 0 "
                 "row whose rank's step had not begun by then is start-up's, and that rank's step 0 is aggregated "
                 "again from its rows"),
            ),
        ),
        TableSpec(
            "kernels",
            "Raw device activity records (optional: small runs, tests, evidence). Large jobs keep "
            "only `kernel_summaries`.",
            (
                ("rank", _I32, "global rank"),
                ("step", _I64, "training step the record falls in"),
                ("kind", _STR, "`kernel`, `memcpy`, `memset`, or `cpu_op` (op-level stand-in on CPU-only machines)"),
                ("device", _I32, "device index on the host"),
                ("stream", _I32, "stream id"),
                ("name", _STR, "kernel name as reported (mangled/templated names allowed)"),
                ("start_ns", _I64, "start in ns"),
                ("dur_ns", _I64, "duration in ns"),
            ),
        ),
        TableSpec(
            "kernel_summaries",
            "Compressed per-window kernel duration distributions: one row per "
            "(window, rank, stream, kernel, cluster).",
            (
                ("window", _I64, "window index"),
                ("start_step", _I64, "first step of the window"),
                ("end_step", _I64, "last step of the window"),
                ("rank", _I32, "global rank"),
                ("stream", _I32, "stream id"),
                ("kernel", _STR, "normalised short kernel name"),
                ("category", _STR, "`compute`, `comm`, `memcpy`, `memset` or `cpu_op`"),
                ("op", _STR, "communication op type (`all_reduce`, `all_gather`, `reduce_scatter`, `all_to_all`, `send_recv`), else empty"),
                ("cluster", _I32, "mode index within the distribution (0 = fastest)"),
                ("count", _I64, "events in this cluster"),
                ("p50_ns", _F64, "median duration of the cluster in ns"),
                ("p99_ns", _F64, "99th percentile duration of the cluster in ns"),
                ("min_ns", _F64, "minimum duration of the cluster in ns"),
                ("max_ns", _F64, "maximum duration of the cluster in ns"),
            ),
            step_column="start_step",
        ),
        TableSpec(
            "kernel_sketches",
            "Mergeable log-bucket duration histograms: one row per (window, rank, stream, kernel). Buckets "
            "are Prometheus native-histogram buckets: bucket i holds durations in (γ^(i-1), γ^i] ns with "
            "γ = 2^(2^-schema); relative quantile error ≤ (γ-1)/(γ+1).",
            (
                ("window", _I64, "window index"),
                ("start_step", _I64, "first step of the window"),
                ("end_step", _I64, "last step of the window"),
                ("rank", _I32, "global rank"),
                ("stream", _I32, "stream id"),
                ("kernel", _STR, "normalised short kernel name"),
                ("category", _STR, "as in `kernel_summaries`"),
                ("op", _STR, "as in `kernel_summaries`"),
                ("schema", _I32, "native-histogram schema (resolution): γ = 2^(2^-schema)"),
                ("count", _I64, "events (including zero-duration ones)"),
                ("zero_count", _I64, "events with a duration of 0 ns"),
                ("sum_ns", _F64, "sum of durations in ns"),
                ("min_ns", _F64, "minimum duration in ns"),
                ("max_ns", _F64, "maximum duration in ns"),
                ("buckets", pa.list_(_I32), "indices of non-empty buckets, ascending"),
                ("counts", pa.list_(_I64), "events per listed bucket"),
            ),
            step_column="start_step",
        ),
        TableSpec(
            "drops",
            "What a collector did not see: events or batches dropped, per window, rank and cause. An "
            "analysis reads this to know the limits of its evidence.",
            (
                ("window", _I64, "window index the counts belong to (-1: outside any window)"),
                ("rank", _I32, "rank the data came from (-1: unknown, e.g. before the handshake)"),
                ("host", _STR, "host of the collector"),
                ("table", _STR, "kind of data dropped (`steps`, `phases`, `kernels`, `stacks`, `hw`, `frames`; "
                 "`remote_write`: series a TSDB sink did not deliver)"),
                ("events", _I64, "records dropped"),
                ("batches", _I64, "batches (frames) dropped"),
                ("reason", _STR, "`queue_full`, `memory_cap`, `malformed`, `disconnected`, `producer_buffer_full`, "
                 "`invalid_duration`; TSDB sinks: `tsdb_queue_full`, `tsdb_unreachable`, `tsdb_rejected`, "
                 "`tsdb_out_of_order`, `tsdb_encode_error` (see docs/tsdb.md)"),
            ),
            step_column=None,
        ),
        TableSpec(
            "stacks",
            "CPU stack samples aggregated per rank and step: one row per distinct stack.",
            (
                ("rank", _I32, "global rank"),
                ("step", _I64, "training step the samples fall in"),
                ("start_ns", _I64, "start of the sampling interval in ns"),
                ("end_ns", _I64, "end of the sampling interval in ns"),
                ("thread", _STR, "thread name"),
                ("frames", _STR, "folded stack, root first, frames `function (file:line)` joined by `;`"),
                ("count", _I32, "samples with this stack in the interval"),
            ),
        ),
        TableSpec(
            "hw",
            "Hardware telemetry samples (long format: one row per metric sample).",
            (
                ("rank", _I32, "global rank using the GPU"),
                ("gpu_uuid", _STR, "GPU UUID"),
                ("ts_ns", _I64, "sample time in ns"),
                ("metric", _STR, "e.g. `sm_clock_mhz`, `temperature_c`, `power_w`, `pcie_gen`, `pcie_width`, "
                 "`pcie_gen_max`, `pcie_width_max`, `throttle_reasons`, `ecc_errors`, `xid`, `nvlink_errors`, "
                 "`nvlink_down`; the host's counters (`psi_cpu_some`, `cpu_softirq_pct`, `ib_link_errors`, "
                 "`nic_port_up`, `roce_retransmits`, … on the host's lowest rank); per port or link where it is not "
                 "zero: the metric, `:` and `<device>/<port>` or the NVLink index, e.g. `ib_link_errors:mlx5_0/1`, "
                 "`nvlink_errors:3`"),
                ("value", _F64, "metric value"),
            ),
            step_column=None,
        ),
        TableSpec(
            "checks",
            "The correctness sensors: every few steps each rank digests state its replicas must hold bit for "
            "bit (the gradients the optimizer applies, after their all-reduce; the parameters it wrote), and "
            "counts its non-finite values; and checks a sampled GEMM's output against its inputs (column sums, "
            "within the rounding bound of the dtype and reduction length), re-running it where it fails. "
            "Replicas are compared here, never through the job's collectives.",
            (
                ("rank", _I32, "global rank"),
                ("gpu_uuid", _STR, "GPU UUID of the rank (empty on CPU)"),
                ("step", _I64, "training step the digest was taken in"),
                ("ts_ns", _I64, "when it was taken (ns since epoch)"),
                ("sensor", _STR, "`grads` (before the optimizer step), `params` (after it), `gemm` (a sampled "
                 "linear layer's forward)"),
                ("tensors", _I32, "tensors digested (those not sharded across ranks); `gemm`: layers checked"),
                ("elements", _I64, "their elements; `gemm`: output elements checked"),
                ("digest", _I64, "64-bit digest of their bits (the unsigned value stored two's complement); `gemm`: 0"),
                ("nonfinite", _I64, "NaN and ±Inf elements among them (`gemm`: in the outputs)"),
                ("violations", _I32, "`gemm`: output columns whose sum broke the rounding bound; else 0"),
                ("rerun", _STR, "`gemm` after a violation: `passed` (re-run on the device, correct: a transient "
                 "upset), `reproduced` (wrong again, the same bits, and a float64 host reference disagrees), "
                 "`reference_agrees` (the bound was wrong, not the result); else `none`"),
            ),
        ),
        TableSpec(
            "hangs",
            "Live hang snapshots: when no local rank of a job made progress for the hang threshold, the "
            "host's processor records every local rank's in-flight state (read from its shared-memory ring, "
            "even while the rank is stuck) and the stacks of the ranks that are not waiting in a collective.",
            (
                ("detected_ns", _I64, "processor wall-clock time of the snapshot (ns since epoch)"),
                ("stalled_s", _F64, "seconds without progress of any local rank of the job when detected"),
                ("threshold_s", _F64, "the hang threshold it crossed: max(minimum, factor × median step time)"),
                ("rank", _I32, "global rank"),
                ("host", _STR, "host of the rank"),
                ("alive", pa.bool_(), "the rank's process still existed"),
                ("step", _I64, "the step the rank was in"),
                ("steps_done", _I64, "the last step it finished (-1: none)"),
                ("activity", _STR, "what its training thread was doing (`forward-compute`, `backward-compute`, "
                 "`optimizer`, `dataloader`, a collective's phase name, or empty)"),
                ("activity_since_ns", _I64, "since when (ns, the rank's clock)"),
                ("waiting", pa.bool_(), "it had started a collective that had not completed"),
                ("group_key", _I64, "the group of its oldest pending collective (hash of the group's ranks; "
                 "0: none), else of its most used group"),
                ("group_kind", _STR, "layout kind of that group (`dp`, `tp`, `pp`, … or empty)"),
                ("group_size", _I32, "members of that group"),
                ("group_first_rank", _I32, "smallest global rank of that group"),
                ("op", _STR, "the last collective it started on that group, e.g. `dp-allreduce`"),
                ("issued", _I64, "collectives it had started on that group"),
                ("completed", _I64, "collectives of that group that had completed on it"),
                ("pending_since_ns", _I64, "start of its oldest pending collective (0: none)"),
                ("groups", _STR, "JSON list of every group it used: key, kind, size, first_rank, issued, completed, "
                 "op"),
                ("stack", _STR, "folded Python stack of its main thread (py-spy), root first; empty if not taken"),
                ("proc_state", _STR, "the rank's process state from /proc (`R` running, `S` sleeping, `D` in "
                 "uninterruptible sleep, `T` stopped, `Z` zombie); empty when unknown"),
            ),
            step_column="step",
        ),
        TableSpec(
            "incidents",
            "Diagnosis results: one row per incident (the `argus diagnose --json` document, flattened).",
            (
                ("id", _STR, "stable incident id"),
                ("class", _STR, "root-cause class: `compute_straggler`, `link_degradation`, `pipeline_imbalance`, "
                 "`host_stall`, `hang`, `fail_stop`, `input_imbalance`, `job_slowdown`, `silent_data_corruption`"),
                ("state", _STR, "`suspected`, `confirmed` or `inconclusive`"),
                ("severity", _STR, "`info`, `warning`, `critical`"),
                ("culprit_ranks", pa.list_(_I32), "culprit ranks"),
                ("hosts", pa.list_(_STR), "hosts of the culprit ranks"),
                ("gpus", pa.list_(_STR), "GPU UUIDs of the culprit ranks"),
                ("start_step", _I64, "first step of the incident window"),
                ("end_step", _I64, "last step of the incident window"),
                ("phase", _STR, "bottleneck phase"),
                ("kernels", pa.list_(_STR), "degraded kernels"),
                ("slowdown_pct", _F64, "share of job step time attributable, in percent"),
                ("gpu_hours_lost", _F64, "job GPUs × extra time, in GPU-hours"),
                ("action", _STR, "`observe`, `raise_trace_fidelity`, `verify`, `cordon_node`, `checkpoint_and_restart`"),
                ("evidence", _STR, "JSON list of evidence references"),
                ("detected_ns", _I64, "wall-clock time of detection (ns since epoch)"),
            ),
            step_column="start_step",
        ),
        TableSpec(
            "logs",
            "The job's own output as events (`argus run`'s job log channel, argus/joblog): one row per line "
            "a signature matched, and per flush one `other` row per rank and stream counting the lines none did.",
            (
                ("rank", _I32, "rank the line belongs to; -1 when it did not say (the launcher's own lines)"),
                ("ts_ns", _I64, "when the line was read (ns since epoch)"),
                ("host", _STR, "host of the `argus run` that read it"),
                ("stream", _STR, "`stdout` or `stderr`"),
                ("kind", _STR, "`nccl_warn`, `nccl_connect`, `nccl_error`, `peer_lost`, `watchdog_timeout`, `cuda_error`, `oom`, `xid`, "
                 "`dataloader`, `exception`, `killed`, `worker_failed`, `stopped`, `checkpoint` (a save the job reports, "
                 "with its path), `launcher_exit` (torchrun's agent could not meet the others at its exit barrier after its "
                 "workers finished), `other`"),
                ("severity", _STR, "`warning` or `error` (`info` for `other`, `checkpoint` and `launcher_exit`)"),
                ("text", _STR, "the line (cut at 500 characters); an exception's last line and innermost frame"),
                ("lines", _I64, "1; for `other`, the number of lines counted"),
            ),
            step_column=None,
        ),
    )
}


#: Columns a writer may leave out (it does not measure them), with the value that means "unknown".
DEFAULTS: dict[tuple[str, str], object] = {("phases", "wait_ns"): -1, ("hangs", "proc_state"): ""}


def conform(table: str, data: pa.Table | Mapping[str, object], *, dictionaries: bool = False) -> pa.Table:
    """Cast ``data`` to ``table``'s canonical schema. Missing or unknown columns are errors
    that name them: a writer bug must not become a silently different file.

    ``dictionaries``: a string column given as ``dictionary<…, string>`` stays one (the
    processor hands its kernel names to the compression and the Perfetto writer as codes and
    a table, ``argus/store/dictionary.py``); files are still written with plain strings,
    since :meth:`WindowUnit.write` conforms again without it."""
    try:
        spec = TABLES[table]
    except KeyError:
        raise StoreError(f"unknown table {table!r}; tables are {', '.join(TABLES)}") from None
    if isinstance(data, pa.Table):
        names = set(data.column_names)
        get = data.column
    else:
        names = set(data)
        get = data.__getitem__  # type: ignore[assignment]
    missing = [c for c in spec.column_names if c not in names and (table, c) not in DEFAULTS]
    extra = sorted(names - set(spec.column_names))
    if missing or extra:
        raise StoreError(f"table {table!r}: missing columns {missing}, unknown columns {extra}")
    arrays = []
    fields = []
    rows = None
    for name, dtype, _ in spec.columns:
        if name not in names:  # an optional column the writer does not measure
            if rows is None:
                rows = len(get(spec.column_names[0]))
            arrays.append(pa.array(np.full(rows, DEFAULTS[(table, name)]), type=dtype))
            fields.append(pa.field(name, dtype, nullable=True))
            continue
        col = get(name)
        if (dictionaries and isinstance(col, (pa.Array, pa.ChunkedArray)) and pa.types.is_string(dtype)
                and pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type)):
            arrays.append(col)
            fields.append(pa.field(name, col.type, nullable=True))
            continue
        fields.append(pa.field(name, dtype, nullable=True))
        if isinstance(col, (pa.Array, pa.ChunkedArray)):
            arr = col if col.type == dtype else col.cast(dtype)
        else:
            values = np.asarray(col) if not isinstance(col, list) else col
            if pa.types.is_string(dtype) and isinstance(values, np.ndarray) and values.dtype.kind in "US":
                values = values.astype(object)
            arr = pa.array(values, type=dtype)
        arrays.append(arr)
    return pa.table(arrays, schema=spec.schema if not dictionaries else pa.schema(fields))


def render_markdown() -> str:
    """The reference part of ``docs/store.md``."""
    lines = [f"## Tables (schema version {SCHEMA_VERSION})", ""]
    for spec in TABLES.values():
        lines += [f"### `{spec.name}`", "", spec.doc, "", "| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{n}` | {t} | {d} |" for n, t, d in spec.columns]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - documentation generator
    print(render_markdown())
