"""``prom://`` → an embedded store: read a job's series back and rebuild the store tables.

The analysis runs unchanged on the result (same tables, same schema, written through
``argus.store``). What comes back (see ``series.py`` for what was sent):

* ``topology`` from ``argus_rank_info``; layout and rank order from ``argus_attempt_info``;
* ``steps``: end at the sample's time (ms), start = end − the exact duration;
* ``phases``: for each (rank, step, phase), ``count`` rows whose durations sum to the sent
  total, the first one the sent minimum (collectives), the rest equal; ``wait_ns`` split in
  proportion, so per-step busy time, minima and calls per step are what the processor saw.
  Rows start at the step start and do not keep the original order within the step;
  ``microbatch`` is -1 (per-microbatch detail is not sent);
* ``kernel_summaries`` per window, ``hw`` samples, and the processors' ``drops``.

Stacks, raw kernels, sketches and evidence stay in the embedded store and object storage.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from argus.errors import TsdbError
from argus.store import Attempt, Store
from argus.topology import RunIdentity, Topology, parse_layout
from argus.tsdb.promql import PromClient, PromUrl, RawSeries, is_prom_url, parse_prom_url

__all__ = ["materialize", "open_attempt"]

_PAD_S = 3600.0  # samples of a window precede its stamp by up to a window's span
_PHASE_LABELS = ("rank", "phase", "category", "group")
_KERNEL_LABELS = ("rank", "kernel", "stream", "category", "op", "cluster")


def open_attempt(store: str, run: str | None = None, attempt: str | None = None) -> Attempt:
    """The attempt to analyse: from a store directory, or a ``prom://`` URL (materialised
    into a temporary store that is removed at exit)."""
    if not is_prom_url(store):
        return Store.open(store).attempt(run, attempt)
    url = parse_prom_url(store)
    for name, given, in_url in (("run", run, url.run), ("attempt", attempt, url.attempt)):
        if given and in_url and given != in_url:
            raise TsdbError(f"--{name} {given} contradicts {name}={in_url} in {store}")
    url = replace(url, run=run or url.run, attempt=attempt or url.attempt)
    out = Path(tempfile.mkdtemp(prefix="argus-prom-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    return materialize(url, out / "store")


def materialize(url: PromUrl | str, out: str | Path, client: PromClient | None = None) -> Attempt:
    """Read one attempt of ``url``'s job into a new store at ``out``; returns the attempt."""
    url = parse_prom_url(url) if isinstance(url, str) else url
    client = client or PromClient(url.base)
    end = url.end_s if url.end_s is not None else time.time() + 3600.0  # mapped stamps may run ahead
    run, attempt, info_lo, info_hi, layout = _find_attempt(client, url, end)
    lo = url.start_s if url.start_s is not None else info_lo - _PAD_S
    hi = min(end, info_hi + 1.0)
    sel = f'{{job="{_q(url.job)}",run="{_q(run)}",attempt="{_q(attempt)}"}}'

    def raw(name: str, labels: tuple[str, ...]) -> RawSeries:
        return client.raw(f"{name}{sel}", lo, hi, labels)

    ranks = raw("argus_rank_info", ("rank", "host", "local_rank", "gpu_uuid"))
    topology = _topology(ranks, layout)
    store = Store.create(out)
    att = store.create_attempt(RunIdentity(run, attempt), topology, source="prometheus",
                               extra={"source_url": url.text or url.base, "job": url.job,
                                      # phases are per-step aggregates: event order within a step is synthetic
                                      "phase_detail": "aggregated"})
    writer = att.writer("prom")
    step_of = _Stamps(raw("argus_step", ("rank",)))
    steps = _steps(raw("argus_step_duration_seconds", ("rank",)), step_of)
    writer.write("steps", steps, window=0)
    phases = {m: raw(f"argus_phase_{m}", _PHASE_LABELS) for m in ("seconds", "count", "unfinished", "wait_seconds",
                                                                      "min_seconds")}
    writer.write("phases", _phases(phases, step_of, steps), window=0)
    windows = _Windows(raw("argus_window_start_step", ("rank",)), raw("argus_window_end_step", ("rank",)))
    kern = {m: raw(f"argus_kernel_{m}", _KERNEL_LABELS) for m in ("count", "p50_seconds", "p99_seconds",
                                                                 "min_seconds", "max_seconds")}
    writer.write("kernel_summaries", _kernels(kern, windows), window=0)
    writer.write("hw", _hw(raw("argus_hw", ("rank", "metric")), topology), window=0)
    drop_labels = ("rank", "host", "table", "reason")
    ev, ba = raw("argus_dropped_events", drop_labels), raw("argus_dropped_batches", drop_labels)
    writer.write("drops", _drops(ev, ba, windows), window=0)
    return att


def _q(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _find_attempt(client: PromClient, url: PromUrl, end: float):
    sel = [f'job="{_q(url.job)}"'] + [f'{k}="{_q(v)}"' for k, v in (("run", url.run), ("attempt", url.attempt)) if v]
    info = client.raw("argus_attempt_info{" + ",".join(sel) + "}", end - url.lookback_s, end,
                      ("run", "attempt", "layout", "order", "world_size"))
    if len(info) == 0:
        what = ", ".join(s.replace('"', "") for s in sel)
        raise TsdbError(f"{url.base}: no Argus series for {what} in the {url.lookback_s / 86400:g} days before "
                        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(end))} UTC (check the job label: the "
                        "processor's --remote-write-job, default 'argus'; widen with &lookback=30d)")
    keys = list(zip(info.labels["run"], info.labels["attempt"]))
    latest: dict[tuple[str, str], int] = {}
    for k, t in zip(keys, info.ts_ms.tolist()):
        latest[k] = max(latest.get(k, t), t)
    run, attempt = max(latest, key=latest.__getitem__)
    m = np.array([k == (run, attempt) for k in keys])
    layouts = {(a, b, c) for a, b, c in zip(info.labels["layout"][m], info.labels["order"][m],
                                           info.labels["world_size"][m])}
    if len(layouts) != 1:
        raise TsdbError(f"{url.base}: attempt {run}/{attempt} reports several layouts: {sorted(layouts)}")
    text, order, world = layouts.pop()
    layout = parse_layout(text, world_size=int(world), order=order)
    ts = info.ts_ms[m]
    return run, attempt, ts.min() / 1000.0, ts.max() / 1000.0, layout


def _topology(r: RawSeries, layout) -> Topology:
    n = layout.world_size
    hosts, local, gpus = np.full(n, "unknown", object), np.full(n, -1, np.int64), np.full(n, "", object)
    if len(r):
        order = np.argsort(r.ts_ms, kind="stable")  # the latest report of a rank wins
        rank = r.labels["rank"][order].astype(np.int64)
        ok = (rank >= 0) & (rank < n)
        hosts[rank[ok]] = r.labels["host"][order][ok]
        local[rank[ok]] = r.labels["local_rank"][order][ok].astype(np.int64)
        gpus[rank[ok]] = r.labels["gpu_uuid"][order][ok]
    return Topology(layout=layout, hosts=hosts.astype(str), local_ranks=local, gpu_uuids=gpus.astype(str))


class _Stamps:
    """(rank, stamp) → value of a per-rank series (the step a sample belongs to)."""

    def __init__(self, r: RawSeries):
        self.key = _key(r.labels["rank"].astype(np.int64), r.ts_ms)
        order = np.argsort(self.key)
        self.key, self.value = self.key[order], r.values[order]

    def lookup(self, rank: np.ndarray, ts_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Values and a mask of the pairs found."""
        k = _key(rank, ts_ms)
        i = np.minimum(np.searchsorted(self.key, k), max(len(self.key) - 1, 0))
        found = (self.key[i] == k) if len(self.key) else np.zeros(len(k), bool)
        return (self.value[i] if len(self.key) else np.zeros(len(k))), found


def _key(rank: np.ndarray, ts_ms: np.ndarray) -> np.ndarray:
    return rank.astype(np.int64) * (1 << 44) + ts_ms.astype(np.int64)


def _steps(r: RawSeries, step_of: _Stamps) -> pa.Table:
    rank = r.labels["rank"].astype(np.int64)
    step, found = step_of.lookup(rank, r.ts_ms)
    rank, ts, dur, step = rank[found], r.ts_ms[found], r.values[found], step[found].astype(np.int64)
    end = ts * 1_000_000
    done = np.isfinite(dur)
    dur_ns = np.rint(np.where(done, dur, 0) * 1e9).astype(np.int64)
    return pa.table({"rank": pa.array(rank, pa.int32()), "step": step,
                     "start_ns": np.where(done, end - dur_ns, end), "end_ns": np.where(done, end, -1)})


def _align(base: RawSeries, others: dict[str, RawSeries], cols: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Values of ``others`` at ``base``'s (labels, stamp) rows (nan where absent): label
    combinations become integer ids over all inputs at once, then one sorted search each."""
    parts = [base, *others.values()]
    key = np.zeros(sum(len(p) for p in parts), np.int64)
    for c in cols:
        u, inv = np.unique(np.concatenate([p.labels[c] for p in parts]).astype(str), return_inverse=True)
        key = np.unique(key * len(u) + inv, return_inverse=True)[1].astype(np.int64)
    ts = np.concatenate([p.ts_ms for p in parts])
    full = (key << 42) | (ts - (ts.min() if len(ts) else 0))
    bounds = np.cumsum([0, *(len(p) for p in parts)])
    base_key = full[: bounds[1]]
    out = {}
    for j, (name, other) in enumerate(others.items(), start=1):
        k = full[bounds[j]: bounds[j + 1]]
        order = np.argsort(k, kind="stable")
        k, v = k[order], other.values[order]
        i = np.minimum(np.searchsorted(k, base_key), max(len(k) - 1, 0))
        hit = (k[i] == base_key) if len(k) else np.zeros(len(base_key), bool)
        out[name] = np.where(hit, v[i] if len(k) else 0.0, np.nan)
    return out


def _phases(m: dict[str, RawSeries], step_of: _Stamps, steps: pa.Table) -> pa.Table:
    base = m["seconds"]
    rank = base.labels["rank"].astype(np.int64)
    step, found = step_of.lookup(rank, base.ts_ms)
    cols = ("phase", "category", "group")
    extra = _align(base, {k: m[k] for k in ("count", "unfinished", "wait_seconds", "min_seconds")}, _PHASE_LABELS)
    count = np.nan_to_num(extra["count"], nan=1.0)
    unfinished = np.nan_to_num(extra["unfinished"], nan=0.0)
    wait, mn = extra["wait_seconds"], extra["min_seconds"]
    keep = found & (count > 0)
    sel = np.flatnonzero(keep)
    rank, step = rank[sel], step[sel].astype(np.int64)
    total_ns = np.rint(base.values[sel] * 1e9).astype(np.int64)
    n = count[sel].astype(np.int64)
    fin = np.maximum(n - unfinished[sel].astype(np.int64), 0)
    first = np.where(np.isfinite(mn[sel]), np.rint(mn[sel] * 1e9), total_ns / np.maximum(fin, 1)).astype(np.int64)
    first = np.where(fin > 0, np.minimum(first, total_ns), 0)
    rest_each = np.where(fin > 1, (total_ns - first) // np.maximum(fin - 1, 1), 0)
    remainder = np.where(fin > 1, (total_ns - first) - rest_each * (fin - 1), 0)
    # one row per occurrence
    g = np.repeat(np.arange(len(sel)), n)
    i = np.arange(len(g)) - np.repeat(np.cumsum(n) - n, n)
    dur = np.where(i == 0, first[g], rest_each[g] + np.where(i == fin[g] - 1, remainder[g], 0))
    dur = np.where(i < fin[g], dur, -1)
    w_total = np.rint(np.nan_to_num(wait[sel], nan=-1.0) * 1e9).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where((total_ns[g] > 0) & (dur > 0), dur / np.maximum(total_ns[g], 1), 0.0)
    wait_ns = np.where((w_total[g] >= 0) & (dur >= 0), np.rint(w_total[g] * share), -1).astype(np.int64)
    st_key = _key(steps.column("rank").to_numpy().astype(np.int64), steps.column("step").to_numpy())
    order = np.argsort(st_key)
    st_key, st_start = st_key[order], steps.column("start_ns").to_numpy()[order]
    want = _key(rank, step)
    j = np.minimum(np.searchsorted(st_key, want), max(len(st_key) - 1, 0))
    have = (st_key[j] == want) if len(st_key) else np.zeros(len(want), bool)
    starts = np.where(have, st_start[j] if len(st_key) else 0, base.ts_ms[sel] * 1_000_000).astype(np.int64)
    spacing = np.where(fin > 0, total_ns // np.maximum(fin, 1), 0)
    lab = {c: base.labels[c][sel] for c in cols}
    return pa.table({"rank": pa.array(rank[g], pa.int32()), "step": step[g], "microbatch": np.full(len(g), -1, np.int32),
                     "name": pa.array(lab["phase"][g].astype(str)), "category": pa.array(lab["category"][g].astype(str)),
                     "group_kind": pa.array(lab["group"][g].astype(str)), "start_ns": starts[g] + i * spacing[g],
                     "dur_ns": dur, "wait_ns": wait_ns})


class _Windows:
    """(rank, stamp) → (window, start step, end step); also by stamp alone (drops)."""

    def __init__(self, start: RawSeries, end: RawSeries):
        self.start = _Stamps(start)
        self.end = _Stamps(end)
        self.by_ts = dict(zip(start.ts_ms.tolist(), start.values.tolist()))
        self.end_by_ts = dict(zip(end.ts_ms.tolist(), end.values.tolist()))

    def lookup(self, rank: np.ndarray, ts_ms: np.ndarray):
        lo, ok1 = self.start.lookup(rank, ts_ms)
        hi, ok2 = self.end.lookup(rank, ts_ms)
        lo, hi = lo.astype(np.int64), hi.astype(np.int64)
        return lo // np.maximum(hi - lo + 1, 1), lo, hi, ok1 & ok2


def _kernels(m: dict[str, RawSeries], windows: _Windows) -> pa.Table:
    base = m["count"]
    rank = base.labels["rank"].astype(np.int64)
    window, lo, hi, found = windows.lookup(rank, base.ts_ms)
    cols = _KERNEL_LABELS[1:]
    got = {k: v * 1e9 for k, v in _align(base, {k: m[k] for k in ("p50_seconds", "p99_seconds", "min_seconds",
                                                                   "max_seconds")}, _KERNEL_LABELS).items()}
    ok = found & np.all([np.isfinite(v) for v in got.values()], axis=0)
    lab = {c: base.labels[c][ok] for c in cols}
    return pa.table({"window": window[ok], "start_step": lo[ok], "end_step": hi[ok],
                     "rank": pa.array(rank[ok], pa.int32()), "stream": lab["stream"].astype(np.int64),
                     "kernel": pa.array(lab["kernel"].astype(str)), "category": pa.array(lab["category"].astype(str)),
                     "op": pa.array(lab["op"].astype(str)), "cluster": lab["cluster"].astype(np.int64),
                     "count": np.rint(base.values[ok]).astype(np.int64), "p50_ns": got["p50_seconds"][ok],
                     "p99_ns": got["p99_seconds"][ok], "min_ns": got["min_seconds"][ok],
                     "max_ns": got["max_seconds"][ok]})


def _hw(r: RawSeries, topology: Topology) -> pa.Table:
    rank = r.labels["rank"].astype(np.int64)
    ok = (rank >= 0) & (rank < topology.world_size)
    return pa.table({"rank": pa.array(rank[ok], pa.int32()), "gpu_uuid": pa.array(topology.gpu_uuids[rank[ok]]),
                     "ts_ns": r.ts_ms[ok] * 1_000_000, "metric": pa.array(r.labels["metric"][ok].astype(str)),
                     "value": r.values[ok]})


def _drops(ev: RawSeries, ba: RawSeries, windows: _Windows) -> pa.Table:
    batches = np.nan_to_num(_align(ev, {"b": ba}, ("rank", "host", "table", "reason"))["b"])
    rows: dict[str, list] = {k: [] for k in ("window", "rank", "host", "table", "events", "batches", "reason")}
    for i, (rank, ts) in enumerate(zip(ev.labels["rank"].tolist(), ev.ts_ms.tolist())):
        lo, hi = windows.by_ts.get(ts), windows.end_by_ts.get(ts)
        rows["window"].append(int(lo // (hi - lo + 1)) if lo is not None and hi is not None else -1)
        rows["rank"].append(int(rank))
        rows["host"].append(str(ev.labels["host"][i]))
        rows["table"].append(str(ev.labels["table"][i]))
        rows["events"].append(int(ev.values[i]))
        rows["batches"].append(int(batches[i]))
        rows["reason"].append(str(ev.labels["reason"][i]))
    return pa.table(rows) if rows["window"] else pa.table({k: pa.array([], pa.int64()) for k in rows}).cast(
        pa.schema([(k, pa.string() if k in ("host", "table", "reason") else pa.int64()) for k in rows]))
