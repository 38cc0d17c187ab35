"""What a closed window becomes in a TSDB: series names, labels, values and timestamps.

Every series carries ``job``, ``run``, ``attempt``; per-rank series add ``host``, ``rank``
and the rank's coordinates on the axes of size > 1 (``tp``, ``cp``, ``ep``, ``dp``, ``pp``).
Coordinates and host are functions of the rank, so they add no series, only ways to group
in PromQL. The step is a *value* (``argus_step``), never a label: a label per step would
create new series every step. ``docs/tsdb.md`` lists the series and their cardinality.

Time. Samples need near-current timestamps (Prometheus refuses samples older than its head
block, ~1 h), and a step's samples must share one timestamp so a reader can join them. Each
attempt's host clock is therefore shifted by one constant, fixed at its first window so that
the window's last activity maps to "now"; a (rank, step) is stamped at its mapped end (the
last activity when it never ended), made strictly increasing per rank. Durations travel as
values, exactly; only positions in time are rounded to the millisecond.

Phases are aggregated per (rank, step, phase): the analysis compares per-step totals of
busy time between peers (L2), reads link transfer times from per-step minima, and counts
calls per step (L3); those survive exactly. Event order within a step does not (see
``docs/tsdb.md``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.topology import Layout
from argus.uniques import sorted_unique


__all__ = ["WindowJob", "AttemptClock", "SeriesBatch", "build_window_series", "rank_label_names", "METRICS",
           "HISTOGRAM"]

#: Series Argus writes (name → what one sample is). ``docs/tsdb.md`` has the full table.
METRICS = {
    "argus_attempt_info": "1, per window and processor host; labels carry layout, order, world size",
    "argus_rank_info": "1, per window and rank; labels carry local rank and GPU UUID",
    "argus_step": "step number of the (rank, step) stamped at this time",
    "argus_step_duration_seconds": "step wall time; +Inf for a step that never ended",
    "argus_phase_seconds": "sum of the phase's finished durations in the step",
    "argus_phase_count": "occurrences of the phase in the step (finished or not)",
    "argus_phase_unfinished": "occurrences that never finished (only when > 0)",
    "argus_phase_wait_seconds": "compute/host phases: waiting inside them (measured, else nested collectives)",
    "argus_phase_min_seconds": "collectives: shortest finished occurrence (the transfer time)",
    "argus_window_start_step": "first step of the window (stamped at the window's time)",
    "argus_window_end_step": "last step of the window",
    "argus_kernel_count": "kernel events in the cluster over the window",
    "argus_kernel_p50_seconds": "median duration of the cluster",
    "argus_kernel_p99_seconds": "99th percentile duration of the cluster",
    "argus_kernel_min_seconds": "shortest duration of the cluster",
    "argus_kernel_max_seconds": "longest duration of the cluster",
    "argus_hw": "hardware sample (label metric: sm_clock_mhz, pcie_gen, …)",
    "argus_kernel_duration_nanoseconds": "native histogram of the kernel's durations over the window (opt-in): "
                                         "the mergeable sketch itself",
    "argus_dropped_events": "records the processor dropped in the window (labels table, reason)",
    "argus_dropped_batches": "batches the processor dropped in the window",
}

_AXES = ("tp", "cp", "ep", "dp", "pp")
HISTOGRAM = "argus_kernel_duration_nanoseconds"  # ns, not s: the sketch's buckets stay exact
_NS_PER_MS = 1_000_000


def rank_label_names(layout: Layout) -> tuple[str, ...]:
    """Coordinate labels a series of this layout carries (axes of size > 1)."""
    return tuple(a for a in _AXES if getattr(layout, a) > 1)


@dataclass
class WindowJob:
    """One closed window handed to a sink: the store tables plus who the ranks are
    (built from the pipeline's ``ClosedWindow`` by ``argus.ingest.window_job``)."""

    run_id: str
    attempt_id: str
    host: str  # the processor's host
    layout: Layout
    ranks: dict[int, tuple[str, int, str]]  # rank → (host, local rank, GPU UUID)
    window: int
    start_step: int
    end_step: int
    steps: pa.Table | None = None
    phases: pa.Table | None = None
    hw: pa.Table | None = None
    drops: pa.Table | None = None
    summaries: pa.Table | None = None
    sketches: pa.Table | None = None  # kernel_sketches rows: sent as native histograms when enabled

    @property
    def key(self) -> tuple[str, str]:
        return (self.run_id, self.attempt_id)



@dataclass
class AttemptClock:
    """Per-attempt mapping of the host clock to remote-write time, and the last stamps."""

    offset_ns: int | None = None
    last_rank_ms: dict[int, int] = field(default_factory=dict)
    last_window_ms: int = -1


@dataclass
class SeriesBatch:
    """Samples of many series: ``keys[i]`` is series i's sorted label pairs (with __name__)."""

    keys: list[tuple[tuple[str, str], ...]] = field(default_factory=list)
    series: list[np.ndarray] = field(default_factory=list)
    ts_ms: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    _index: dict[tuple, int] = field(default_factory=dict)
    #: native histograms: (sorted label pairs with __name__, ts_ms, kernel_sketches row as a dict)
    histograms: list[tuple[tuple[tuple[str, str], ...], int, dict]] = field(default_factory=list)

    def add(self, name: str, base: Sequence[tuple[str, str]], label_cols: dict[str, np.ndarray],
            ts_ms: np.ndarray, values: np.ndarray, rank: np.ndarray | None = None,
            rank_labels: dict[int, tuple[tuple[str, str], ...]] | None = None) -> None:
        """Add one metric: rows are samples; series are the distinct label combinations."""
        self.add_family({name: (values, None)}, base, label_cols, ts_ms, rank, rank_labels)

    def add_family(self, metrics: dict[str, tuple[np.ndarray, np.ndarray | None]], base: Sequence[tuple[str, str]],
                   label_cols: dict[str, np.ndarray], ts_ms: np.ndarray, rank: np.ndarray | None = None,
                   rank_labels: dict[int, tuple[tuple[str, str], ...]] | None = None) -> None:
        """Add metrics that share rows and labels (``name → (values, row mask or None)``).
        Rows are grouped once with numpy; each series' labels are built once per window, so
        the Python work is per series, never per sample."""
        n = len(ts_ms)
        if n == 0:
            return
        cols = dict(label_cols)
        if rank is not None:
            cols = {"rank": np.asarray(rank), **cols}
        codes, vocab = [], []
        for col in cols.values():
            u, inv = np.unique(np.asarray(col), return_inverse=True)
            codes.append(inv.astype(np.int64))
            vocab.append(u)
        key = np.zeros(n, np.int64)
        for c, u in zip(codes, vocab):  # re-compacted after each column: never overflows
            key = np.unique(key * len(u) + c, return_inverse=True)[1].astype(np.int64)
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        names = list(cols)
        tails = []  # each series' labels but __name__, sorted ("__name__" sorts before lower-case names)
        for row in first.tolist():
            pairs = list(base)
            for lname, c, u in zip(names, codes, vocab):
                value = u[c[row]]
                if lname == "rank":
                    pairs += rank_labels[int(value)] if rank_labels else [("rank", str(int(value)))]
                else:
                    pairs.append((lname, str(value)))
            tails.append(tuple(sorted(pairs)))
        ts_ms = np.asarray(ts_ms, np.int64)
        for name, (values, mask) in metrics.items():
            head = (("__name__", name),)
            sids = np.full(len(uniq), -1, np.int64)
            used = np.ones(len(uniq), bool) if mask is None else np.bincount(inv[mask], minlength=len(uniq)) > 0
            for i in np.flatnonzero(used).tolist():
                k = head + tails[i]
                sid = self._index.get(k)
                if sid is None:
                    sid = self._index[k] = len(self.keys)
                    self.keys.append(k)
                sids[i] = sid
            rows = slice(None) if mask is None else mask
            self.series.append(sids[inv[rows]])
            self.ts_ms.append(ts_ms[rows])
            self.values.append(np.asarray(values, np.float64)[rows])

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(series, ts_ms, values) sorted by series then time."""
        if not self.series:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
        s, t, v = (np.concatenate(x) for x in (self.series, self.ts_ms, self.values))
        order = np.lexsort((t, s))
        return s[order], t[order], v[order]

    @property
    def n_samples(self) -> int:
        return int(sum(len(s) for s in self.series))


def _np(table: pa.Table, col: str) -> np.ndarray:
    return table.column(col).to_numpy(zero_copy_only=False)


def _phase_waits(rank: np.ndarray, start: np.ndarray, dur: np.ndarray, comm: np.ndarray,
                 wait: np.ndarray) -> np.ndarray:
    """Waiting inside each compute/host phase: the producer's ``wait_ns`` where measured, else
    the finished collectives of the same rank that start inside it (as L2 computes busy time)."""
    out = np.where(wait >= 0, wait, 0).astype(np.float64)
    need = (~comm) & (wait < 0) & (dur > 0)
    if not need.any() or not comm.any():
        return out
    base = int(start.min())
    key = (rank.astype(np.int64) << 46) | (start - base)
    c = np.flatnonzero(comm)
    c = c[np.argsort(key[c], kind="stable")]
    ckey = key[c]
    cum = np.concatenate([[0.0], np.cumsum(np.where(dur[c] > 0, dur[c], 0).astype(np.float64))])
    w = np.flatnonzero(need)
    lo = np.searchsorted(ckey, key[w], side="left")
    hi = np.searchsorted(ckey, (rank[w].astype(np.int64) << 46) | (start[w] - base + dur[w]), side="left")
    out[w] = np.minimum(cum[hi] - cum[lo], dur[w])
    return out


def _monotonic(ms: np.ndarray, last: int) -> np.ndarray:
    """Strictly increasing stamps (one rank's, in step order), all after ``last``."""
    i = np.arange(len(ms))
    return i + np.maximum(np.maximum.accumulate(ms - i), last + 1)


def build_window_series(job: WindowJob, clock: AttemptClock, job_label: str,
                        now_ns: int | None = None) -> SeriesBatch:
    """The series of one closed window (see :data:`METRICS`)."""
    batch = SeriesBatch()
    base = (("job", job_label), ("run", job.run_id), ("attempt", job.attempt_id))
    coords_names = rank_label_names(job.layout)
    ranks_known = np.array(sorted(job.ranks), np.int64)
    coords = job.layout.coords(ranks_known) if len(ranks_known) else {}
    rank_labels: dict[int, tuple[tuple[str, str], ...]] = {}
    for i, r in enumerate(ranks_known.tolist()):
        rank_labels[r] = (("host", job.ranks[r][0]), ("rank", str(r)),
                          *((a, str(int(coords[a][i]))) for a in coords_names))

    def labels_of(ranks: np.ndarray) -> dict[int, tuple[tuple[str, str], ...]]:
        for r in sorted_unique(ranks).tolist():
            if r not in rank_labels:  # a rank seen in data but not in HELLO (should not happen)
                rank_labels[r] = (("host", job.host), ("rank", str(r)))
        return rank_labels

    # -- (rank, step) stamps -------------------------------------------------------------
    steps, phases = job.steps, job.phases
    parts_r, parts_s, parts_t = [], [], []
    if steps is not None and steps.num_rows:
        s_rank, s_step = _np(steps, "rank").astype(np.int64), _np(steps, "step").astype(np.int64)
        s_start, s_end = _np(steps, "start_ns").astype(np.int64), _np(steps, "end_ns").astype(np.int64)
        parts_r.append(s_rank)
        parts_s.append(s_step)
        parts_t.append(np.where(s_end >= 0, s_end, s_start))
    if phases is not None and phases.num_rows:
        p_rank, p_step = _np(phases, "rank").astype(np.int64), _np(phases, "step").astype(np.int64)
        p_start, p_dur = _np(phases, "start_ns").astype(np.int64), _np(phases, "dur_ns").astype(np.int64)
        parts_r.append(p_rank)
        parts_s.append(p_step)
        parts_t.append(p_start + np.maximum(p_dur, 0))
    hw = job.hw
    raw_max = [int(t.max()) for t in parts_t if len(t)]
    if hw is not None and hw.num_rows:
        raw_max.append(int(_np(hw, "ts_ns").max()))
    if clock.offset_ns is None:
        if not raw_max:
            return batch
        clock.offset_ns = (now_ns if now_ns is not None else time.time_ns()) - max(raw_max)
    off = clock.offset_ns

    stamp: dict[tuple[int, int], int] = {}
    rs_rank = rs_step = rs_ms = np.empty(0, np.int64)
    if parts_r:
        r, s, t = np.concatenate(parts_r), np.concatenate(parts_s), np.concatenate(parts_t)
        key = r * (1 << 40) + s
        uniq, inv = np.unique(key, return_inverse=True)
        raw = np.full(len(uniq), np.iinfo(np.int64).min)
        np.maximum.at(raw, inv, t)
        if steps is not None and steps.num_rows:  # a finished step is stamped at its end, exactly
            fin = s_end >= 0
            pos = np.searchsorted(uniq, (s_rank * (1 << 40) + s_step)[fin])
            raw[pos] = s_end[fin]
        rs_rank, rs_step = uniq >> 40, uniq & ((1 << 40) - 1)
        rs_ms = (raw + off) // _NS_PER_MS
        for rank in sorted_unique(rs_rank).tolist():  # ranks per host: a handful
            m = rs_rank == rank
            rs_ms[m] = _monotonic(rs_ms[m], clock.last_rank_ms.get(rank, -1))
            clock.last_rank_ms[rank] = int(rs_ms[m][-1])
        stamp = dict(zip(uniq.tolist(), rs_ms.tolist()))
        labels_of(rs_rank)
        batch.add("argus_step", base, {}, rs_ms, rs_step, rank=rs_rank, rank_labels=rank_labels)

    def ts_of(rank: np.ndarray, step: np.ndarray) -> np.ndarray:
        return np.fromiter((stamp[k] for k in (rank * (1 << 40) + step).tolist()), np.int64, len(rank))

    if steps is not None and steps.num_rows:
        dur = np.where(s_end >= 0, (s_end - s_start) / 1e9, np.inf)
        batch.add("argus_step_duration_seconds", base, {}, ts_of(s_rank, s_step), dur, rank=s_rank,
                  rank_labels=rank_labels)
    if phases is not None and phases.num_rows:
        _add_phases(batch, base, phases, p_rank, p_step, p_start, p_dur, ts_of, rank_labels)

    # -- window-level series ---------------------------------------------------------------
    window_ms = int(rs_ms.max()) if len(rs_ms) else -1
    if hw is not None and hw.num_rows:
        window_ms = max(window_ms, (int(_np(hw, "ts_ns").max()) + off) // _NS_PER_MS)
    window_ms = max(window_ms, clock.last_window_ms + 1)
    clock.last_window_ms = window_ms
    win_ranks = sorted_unique(np.concatenate([rs_rank, np.array(sorted(job.ranks), np.int64)]))
    labels_of(win_ranks)
    wts = np.full(len(win_ranks), window_ms, np.int64)
    batch.add("argus_window_start_step", base, {}, wts, np.full(len(win_ranks), job.start_step), rank=win_ranks,
              rank_labels=rank_labels)
    batch.add("argus_window_end_step", base, {}, wts, np.full(len(win_ranks), job.end_step), rank=win_ranks,
              rank_labels=rank_labels)
    batch.add("argus_attempt_info", (*base, ("host", job.host), ("layout", str(job.layout)),
                                     ("order", job.layout.order_str), ("world_size", str(job.layout.world_size))),
              {}, np.array([window_ms]), np.array([1.0]))
    info = [(r, *job.ranks[r]) for r in sorted(job.ranks)]
    if info:
        all_coords = job.layout.coords(np.array([i[0] for i in info]))
        cols: dict[str, Any] = {"rank": np.array([i[0] for i in info]), "host": np.array([i[1] for i in info]),
                                "local_rank": np.array([i[2] for i in info]),
                                "gpu_uuid": np.array([i[3] for i in info])}
        cols.update({a: all_coords[a] for a in _AXES})
        batch.add("argus_rank_info", base, cols, np.full(len(info), window_ms), np.ones(len(info)))
    if job.summaries is not None and job.summaries.num_rows:
        _add_kernels(batch, base, job.summaries, window_ms, labels_of)
    if job.sketches is not None and job.sketches.num_rows:
        labels_of(_np(job.sketches, "rank").astype(np.int64))
        for row in job.sketches.to_pylist():
            pairs = (*base, *rank_labels[int(row["rank"])], ("kernel", str(row["kernel"])),
                     ("stream", str(int(row["stream"]))), ("category", str(row["category"])), ("op", str(row["op"])))
            batch.histograms.append(((("__name__", HISTOGRAM),) + tuple(sorted(pairs)), window_ms, row))
    if hw is not None and hw.num_rows:
        h_rank = _np(hw, "rank").astype(np.int64)
        labels_of(h_rank)
        batch.add("argus_hw", base, {"metric": _np(hw, "metric").astype(str)},
                  (_np(hw, "ts_ns").astype(np.int64) + off) // _NS_PER_MS, _np(hw, "value"), rank=h_rank,
                  rank_labels=rank_labels)
    if job.drops is not None and job.drops.num_rows:
        d = job.drops
        cols = {"table": _np(d, "table").astype(str), "reason": _np(d, "reason").astype(str),
                "rank": _np(d, "rank").astype(str)}
        ts = np.full(d.num_rows, window_ms)
        batch.add("argus_dropped_events", (*base, ("host", job.host)), cols, ts, _np(d, "events"))
        batch.add("argus_dropped_batches", (*base, ("host", job.host)), cols, ts, _np(d, "batches"))
    return batch


def _add_phases(batch: SeriesBatch, base, phases: pa.Table, rank: np.ndarray, step: np.ndarray, start: np.ndarray,
                dur: np.ndarray, ts_of, rank_labels) -> None:
    name_ids, names = _dict(phases.column("name"))
    cat_ids, cats = _dict(phases.column("category"))
    grp_ids, groups = _dict(phases.column("group_kind"))
    comm_code = cats.index("comm") if "comm" in cats else -1
    comm = cat_ids == comm_code
    wait = _np(phases, "wait_ns").astype(np.int64) if "wait_ns" in phases.column_names else np.full(len(rank), -1)
    waited = _phase_waits(rank, start, dur, comm, wait)
    key = (((rank * (1 << 24) + step) * len(names) + name_ids) * len(cats) + cat_ids) * len(groups) + grp_ids
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    fin = dur >= 0
    n = len(uniq)
    total = np.bincount(inv, weights=np.where(fin, dur, 0), minlength=n) / 1e9
    count = np.bincount(inv, minlength=n).astype(np.float64)
    unfinished = np.bincount(inv, weights=~fin, minlength=n)
    wait_s = np.bincount(inv, weights=np.where(fin & ~comm, waited, 0), minlength=n) / 1e9
    mn = np.full(n, np.inf)
    np.minimum.at(mn, inv[fin], dur[fin].astype(np.float64))
    g_rank, g_step, g_comm = rank[first], step[first], comm[first]
    ts = ts_of(g_rank, g_step)
    labels = {"phase": np.asarray(names, object)[name_ids[first]].astype(str),
              "category": np.asarray(cats, object)[cat_ids[first]].astype(str),
              "group": np.asarray(groups, object)[grp_ids[first]].astype(str)}

    batch.add_family({"argus_phase_seconds": (total, None), "argus_phase_count": (count, None),
                      "argus_phase_unfinished": (unfinished, unfinished > 0),
                      "argus_phase_wait_seconds": (wait_s, ~g_comm),
                      "argus_phase_min_seconds": (mn / 1e9, g_comm & np.isfinite(mn))},
                     base, labels, ts, rank=g_rank, rank_labels=rank_labels)


def _add_kernels(batch: SeriesBatch, base, summ: pa.Table, window_ms: int, labels_of) -> None:
    rank = _np(summ, "rank").astype(np.int64)
    rank_labels = labels_of(rank)
    cols = {"kernel": _np(summ, "kernel").astype(str), "stream": _np(summ, "stream").astype(np.int64),
            "category": _np(summ, "category").astype(str), "op": _np(summ, "op").astype(str),
            "cluster": _np(summ, "cluster").astype(np.int64)}
    ts = np.full(len(rank), window_ms, np.int64)
    metrics: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        "argus_kernel_count": (_np(summ, "count").astype(np.float64), None)}
    metrics.update({f"argus_kernel_{name}_seconds": (_np(summ, col) / 1e9, None)
                    for col, name in (("p50_ns", "p50"), ("p99_ns", "p99"), ("min_ns", "min"), ("max_ns", "max"))})
    batch.add_family(metrics, base, cols, ts, rank=rank, rank_labels=rank_labels)


def _dict(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    d = pc.dictionary_encode(col.fill_null(""))
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    return d.indices.to_numpy(zero_copy_only=False).astype(np.int64), d.dictionary.to_pylist()
