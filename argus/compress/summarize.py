"""Compress one window of raw kernel events into per-kernel distribution summaries.

Per ``(rank, stream, kernel)`` of the window: the paper's KDE summary (one row per mode:
count, p50, p99, min, max) and a mergeable log-bucket sketch. Everything is vectorised over
the window's events: names and kinds categorised once per distinct pair, groups numbered by
a dense code (a block has few ranks, streams and labels: bincounts, no sort), one sort of
the integer (group, duration) key, then array arithmetic; no Python work per group.

Events with a NaN, infinite or negative duration (``-1`` = never finished) are not data:
they are left out of the distributions, never replaced by made-up values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.compress.kde import KdeConfig, cluster_bounds
from argus.compress.refine import RefineConfig, quantile_sorted, refine_clusters
from argus.compress.names import categorize_kernel, normalize_kernel_name
from argus.compress.sketch import DEFAULT_SCHEMA, LogSketch, bucket_index
from argus.store.schema import TABLES

__all__ = ["Cluster", "CompressConfig", "summarize_durations", "summarize_kernel_arrays", "summarize_kernels"]


@dataclass(frozen=True, slots=True)
class CompressConfig:
    kde: KdeConfig = KdeConfig()
    refine: RefineConfig = RefineConfig()  # split clusters whose rows lose the shape (W₁ bound)
    sketch_schema: int = DEFAULT_SCHEMA


@dataclass(frozen=True, slots=True)
class Cluster:
    count: int
    p50: float
    p99: float
    min: float
    max: float


_DUR_SLOT = 1 << 40  # durations share a sort key with their group: 40 bits of ns (18 min)
_DENSE_LIMIT = 1 << 22  # codes below this factorize by lookup table (32 MB at most) instead of a sort


@dataclass
class _Grouped:
    """Valid events sorted by (group, duration), with group boundaries."""

    dur: np.ndarray  # float64 ns, sorted within groups
    starts: np.ndarray
    sizes: np.ndarray
    invalid: int


def _group_sorted(code: np.ndarray, dur: np.ndarray, code_of_group: np.ndarray, n_codes: int) -> _Grouped:
    """Valid events sorted by group, then duration. ``code`` per event orders as its group does
    (``code_of_group``, ascending, all below ``n_codes``: the group index itself or a sparser code)."""
    raw = np.asarray(dur)
    if np.issubdtype(raw.dtype, np.integer) and (raw.size == 0 or raw.max() < _DUR_SLOT):
        # Integer durations below 2^40 ns are their own sort slot: sort the combined key itself
        # (no permutation to gather through) and read the durations back from its low bits.
        valid = raw >= 0
        invalid = int(raw.size - np.count_nonzero(valid))
        if invalid:
            code, raw = code[valid], raw[valid]
        key = np.left_shift(code, 40, dtype=np.int64)
        key |= raw.astype(np.int64, copy=False)
        key.sort(kind="stable")  # timsort: the events arrive in long sorted runs
        sizes = np.bincount(code, minlength=n_codes)[code_of_group]
        key &= _DUR_SLOT - 1
        return _Grouped(key.astype(np.float64), _starts(sizes), sizes, invalid)
    dur = np.asarray(dur, dtype=np.float64)
    valid = np.isfinite(dur) & (dur >= 0)
    invalid = int(dur.size - valid.sum())
    if invalid:
        code, dur = code[valid], dur[valid]
    sizes = np.bincount(code, minlength=n_codes)[code_of_group]
    # Sort by group, then duration: one argsort of a combined key. Durations ≥ 2^40 ns (18 min)
    # share the top sort slot; their exact values are still taken from ``dur``.
    key = (code.astype(np.int64) << 40) | np.minimum(dur, 2.0**40 - 1).astype(np.int64)
    order = np.argsort(key)
    return _Grouped(dur[order], _starts(sizes), sizes, invalid)


def _starts(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)[:-1]])


@dataclass
class _Distinct:
    """The sorted distinct codes of the events, and each event's place among them."""

    values: np.ndarray
    codes: np.ndarray
    inverse: np.ndarray | None  # None: small ids, spread through a lookup table instead

    @classmethod
    def of(cls, codes: np.ndarray) -> "_Distinct":
        """Small non-negative codes (ids) need no sort: a bincount finds them."""
        if codes.size and codes.min() >= 0 and codes.max() < _DENSE_LIMIT:
            return cls(np.flatnonzero(np.bincount(codes)), codes, None)
        values, inverse = np.unique(codes, return_inverse=True)
        return cls(values, codes, inverse)

    def spread(self, per_value: np.ndarray) -> np.ndarray:
        """One value per distinct code → the value of every event (one gather)."""
        if self.inverse is not None:
            return per_value[self.inverse]
        lookup = np.zeros(int(self.values[-1]) + 1, per_value.dtype)
        lookup[self.values] = per_value
        return lookup[self.codes]


def _group_codes(rank: np.ndarray, stream: np.ndarray, label: np.ndarray, n_labels: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The groups' keys ``rank << 32 | (stream & 0xFFFF) << 16 | label``, ascending (as
    ``np.unique`` gives them); per event a code that orders as its key; each group's code; and
    the codes' bound. A block of ranks has few streams and labels: a dense code (rank offset,
    stream's index among the streams present, label) orders as the key does and needs no sort."""
    stream = np.asarray(stream)
    stream16 = stream.view(np.uint16) if stream.dtype in (np.int16, np.uint16) else stream.astype(np.int64) & 0xFFFF
    rank = np.asarray(rank)
    if rank.size and n_labels <= 0xFFFF:
        r_lo = int(rank.min())
        present = _Distinct.of(stream16)
        streams, n_streams = present.values, len(present.values)
        space = (int(rank.max()) - r_lo + 1) * n_streams * n_labels
        if space <= max(_DENSE_LIMIT, rank.size):  # counts no larger than the codes themselves
            code = rank.astype(np.int64)
            code -= r_lo
            code *= n_streams
            code += present.spread(np.arange(n_streams, dtype=np.int64))
            code *= n_labels
            code += label
            ucode = np.flatnonzero(np.bincount(code, minlength=space))
            g_rank = ucode // (n_streams * n_labels) + r_lo
            ukeys = (g_rank << 32) | (streams.astype(np.int64)[(ucode // n_labels) % n_streams] << 16) | (ucode % n_labels)
            return ukeys, code, ucode, space
    key = (rank.astype(np.int64) << 32) | (stream16.astype(np.int64) << 16) | label
    ukeys, gid = np.unique(key, return_inverse=True)
    return ukeys, gid, np.arange(len(ukeys)), len(ukeys)


def _clusters(g: _Grouped, config: CompressConfig) -> tuple[np.ndarray, ...]:
    """Per cluster: group index, cluster index, start, size (into the sorted durations): the
    KDE's modes, then split where the stored rows would lose the shape (``refine.py``)."""
    keep = g.sizes > 0
    starts, sizes = g.starts[keep], g.sizes[keep]
    groups = np.flatnonzero(keep)
    logd = np.log(np.maximum(g.dur, 1.0))  # a 0 ns event counts at 1 ns for the density only
    cuts = cluster_bounds(logd, starts, sizes, config.kde)
    n_cuts = np.array([len(c) for c in cuts], dtype=np.int64)
    c_group = np.repeat(groups, n_cuts + 1)
    c_index = np.arange(len(c_group)) - np.repeat(np.cumsum(n_cuts + 1) - (n_cuts + 1), n_cuts + 1)
    rel = np.zeros(len(c_group), np.int64)  # cluster start relative to its group
    multi = np.flatnonzero(n_cuts)
    if multi.size:
        first = np.cumsum(n_cuts + 1) - (n_cuts + 1)
        for i in multi:
            rel[first[i] + 1: first[i] + 1 + n_cuts[i]] = cuts[i]
    g_start = np.repeat(starts, n_cuts + 1)
    g_size = np.repeat(sizes, n_cuts + 1)
    nxt = np.append(rel[1:], 0)
    last = np.append(c_index[1:] == 0, True)
    c_size = np.where(last, g_size, nxt) - rel
    if config.refine.max_w1_rel_mean is None:
        return c_group, c_index, g_start + rel, c_size
    return refine_clusters(g.dur, g.starts, g.sizes, c_group, g_start + rel, c_size, config.refine, logd)


def summarize_durations(durations: np.ndarray, config: CompressConfig = CompressConfig()) -> list[Cluster]:
    """The KDE summary of one distribution (for tests and one-off use)."""
    d = np.asarray(durations, dtype=np.float64).ravel()
    g = _group_sorted(np.zeros(d.size, np.int64), d, np.zeros(1, np.int64), 1)
    if g.sizes.sum() == 0:
        return []
    _, _, c_start, c_size = _clusters(g, config)
    return [Cluster(int(n), float(quantile_sorted(g.dur, np.array([s]), np.array([n]), 0.5)[0]),
                    float(quantile_sorted(g.dur, np.array([s]), np.array([n]), 0.99)[0]),
                    float(g.dur[s]), float(g.dur[s + n - 1])) for s, n in zip(c_start, c_size)]


def summarize_kernels(kernels: pa.Table, window: int, start_step: int, end_step: int,
                      config: CompressConfig = CompressConfig()) -> tuple[pa.Table, pa.Table]:
    """``kernels`` (store schema) → (``kernel_summaries``, ``kernel_sketches``) tables."""
    if kernels.num_rows == 0:
        return summarize_kernel_arrays(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64),
                                       np.empty(0, np.int64), np.empty(0), [], [], window, start_step, end_step, config)
    names = pc.dictionary_encode(kernels.column("name")).combine_chunks()
    kinds = pc.dictionary_encode(kernels.column("kind")).combine_chunks()
    return summarize_kernel_arrays(
        kernels.column("rank").to_numpy(), kernels.column("stream").to_numpy(), names.indices.to_numpy(),
        kinds.indices.to_numpy(), kernels.column("dur_ns").to_numpy(), names.dictionary.to_pylist(),
        kinds.dictionary.to_pylist(), window, start_step, end_step, config)


def summarize_kernel_arrays(rank: np.ndarray, stream: np.ndarray, name_id: np.ndarray, kind_id: np.ndarray,
                            dur_ns: np.ndarray, names: list[str], kinds: list[str], window: int, start_step: int,
                            end_step: int, config: CompressConfig = CompressConfig()) -> tuple[pa.Table, pa.Table]:
    """The same, from arrays with names and kinds as ids into ``names``/``kinds`` (no strings
    per event: the simulator and the processor already hold interned ids)."""
    if len(dur_ns) == 0:
        return TABLES["kernel_summaries"].schema.empty_table(), TABLES["kernel_sketches"].schema.empty_table()
    n_kinds = max(len(kinds), 1)
    # Few distinct (name, kind) pairs: normalise and categorise them once each.
    pair = np.asarray(name_id).astype(np.int64)
    pair *= n_kinds
    pair += kind_id
    pairs = _Distinct.of(pair)
    labels = []
    for p in pairs.values:
        raw, kind = names[p // n_kinds], kinds[p % n_kinds]
        labels.append((normalize_kernel_name(raw), *categorize_kernel(raw, kind)))
    label_index = {lab: i for i, lab in enumerate(dict.fromkeys(labels))}
    pair_label = np.array([label_index[lab] for lab in labels], np.int64)
    ukeys, code, code_of_group, n_codes = _group_codes(rank, stream, pairs.spread(pair_label), len(label_index))
    g = _group_sorted(code, dur_ns, code_of_group, n_codes)
    g_rank, g_stream, g_label = ukeys >> 32, (ukeys >> 16) & 0xFFFF, ukeys & 0xFFFF
    label_list = list(label_index)
    short = np.array([lab[0] for lab in label_list], dtype=object)
    cat = np.array([lab[1] for lab in label_list], dtype=object)
    op = np.array([lab[2] for lab in label_list], dtype=object)

    c_group, c_index, c_start, c_size = _clusters(g, config)
    summaries = pa.table({
        "window": np.full(len(c_group), window, np.int64),
        "start_step": np.full(len(c_group), start_step, np.int64),
        "end_step": np.full(len(c_group), end_step, np.int64),
        "rank": pa.array(g_rank[c_group], pa.int32()),
        "stream": pa.array(g_stream[c_group], pa.int32()),
        "kernel": pa.array(short[g_label[c_group]], pa.string()),
        "category": pa.array(cat[g_label[c_group]], pa.string()),
        "op": pa.array(op[g_label[c_group]], pa.string()),
        "cluster": pa.array(c_index, pa.int32()),
        "count": c_size.astype(np.int64),
        "p50_ns": quantile_sorted(g.dur, c_start, c_size, 0.5),
        "p99_ns": quantile_sorted(g.dur, c_start, c_size, 0.99),
        "min_ns": g.dur[c_start],
        "max_ns": g.dur[c_start + c_size - 1],
    }, schema=TABLES["kernel_summaries"].schema)
    sketches = _sketch_table(g, g_rank, g_stream, short[g_label], cat[g_label], op[g_label],
                             window, start_step, end_step, config.sketch_schema)
    return summaries, sketches


def _sketch_table(g: _Grouped, g_rank, g_stream, short, cat, op, window, start_step, end_step, schema) -> pa.Table:
    keep = g.sizes > 0
    starts, sizes = g.starts[keep], g.sizes[keep]
    pos = g.dur > 0
    if len(pos) and pos.all():  # the usual case: no zero durations, so every event has a bucket
        b = bucket_index(g.dur, schema)
        # Run-length encode (group, bucket) over the sorted events: a run also starts at each group.
        change = np.empty(len(b), bool)
        change[0] = True
        np.not_equal(b[1:], b[:-1], out=change[1:])
        change[starts] = True
        run_start = np.flatnonzero(change)
        run_counts = np.diff(np.append(run_start, len(b)))
        run_group = np.searchsorted(starts, run_start, side="right") - 1
        run_bucket = b[run_start].astype(np.int64)
        zero = np.zeros(len(starts), np.int64)
    else:
        run_counts, run_group, run_bucket, zero = _bucket_runs(g.dur, starts, sizes, pos, schema)
    per_group = np.bincount(run_group, minlength=len(starts))
    offsets = np.concatenate([[0], np.cumsum(per_group)]).astype(np.int32)
    sums = np.add.reduceat(g.dur, starts) if len(g.dur) else np.zeros(len(starts))
    idx = np.flatnonzero(keep)
    n = len(starts)
    return pa.table({
        "window": np.full(n, window, np.int64),
        "start_step": np.full(n, start_step, np.int64),
        "end_step": np.full(n, end_step, np.int64),
        "rank": pa.array(g_rank[idx], pa.int32()),
        "stream": pa.array(g_stream[idx], pa.int32()),
        "kernel": pa.array(short[idx], pa.string()),
        "category": pa.array(cat[idx], pa.string()),
        "op": pa.array(op[idx], pa.string()),
        "schema": pa.array(np.full(n, schema), pa.int32()),
        "count": sizes.astype(np.int64),
        "zero_count": zero.astype(np.int64),
        "sum_ns": sums,
        "min_ns": g.dur[starts],
        "max_ns": g.dur[starts + sizes - 1],
        "buckets": pa.ListArray.from_arrays(pa.array(offsets), pa.array(run_bucket.astype(np.int32))),
        "counts": pa.ListArray.from_arrays(pa.array(offsets), pa.array(run_counts.astype(np.int64))),
    }, schema=TABLES["kernel_sketches"].schema)


def _bucket_runs(dur: np.ndarray, starts: np.ndarray, sizes: np.ndarray, pos: np.ndarray, schema: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Runs of equal (group, bucket) over the sorted positive durations: counts, group, bucket;
    and each group's zero durations, counted apart."""
    group_of = np.repeat(np.arange(len(starts)), sizes)
    b = np.zeros(len(dur), np.int64)
    b[pos] = bucket_index(dur[pos], schema)
    sel = np.flatnonzero(pos)
    if sel.size:
        grp_b = group_of[sel]
        change = np.ones(sel.size, bool)
        change[1:] = (grp_b[1:] != grp_b[:-1]) | (b[sel][1:] != b[sel][:-1])
        run_start = np.flatnonzero(change)
        run_counts = np.diff(np.append(run_start, sel.size))
        run_group = grp_b[run_start]
        run_bucket = b[sel][run_start]
    else:
        run_counts = run_group = run_bucket = np.empty(0, np.int64)
    zero = sizes - np.bincount(group_of[sel], minlength=len(starts)) if sel.size else sizes.copy()
    return run_counts, run_group, run_bucket, zero


def sketch_from_row(row: dict) -> LogSketch:
    """A :class:`LogSketch` from one ``kernel_sketches`` row (as a dict)."""
    return LogSketch(int(row["schema"]), int(row["count"]), int(row["zero_count"]), float(row["sum_ns"]),
                     float(row["min_ns"]), float(row["max_ns"]), np.asarray(row["buckets"], np.int32),
                     np.asarray(row["counts"], np.int64))
