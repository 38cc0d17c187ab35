"""Gather a report's data from a store and a diagnosis: step series, per-incident heatmaps,
kernel CDFs and evidence files.

Aggregation happens in DuckDB and numpy, and everything drawn is bounded whatever the job
size: steps are binned above ``MAX_POINTS``, heatmaps show the culprits plus at most
``SAMPLED_PEERS`` evenly spaced peers and peer quantile rows computed over at most
``QUANTILE_PEERS`` peers, CDFs are reconstructed for at most ``CDF_PEERS`` peers. At 10,240
ranks the costliest part is one grouped scan of the incident window's phases.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.analysis.diagnosis import Diagnosis
from argus.analysis.evidence import EvidenceKind
from argus.compress import log_grid, mixture_cdf
from argus.errors import LayoutError
from argus.report.model import (EvidenceFile, IncidentView, JobLogView, KernelCdfs, PhaseHeatmap, ReportData,
                                StepSeries)
from argus.report.sources import evidence_files, fingerprint, stored_incidents, window_steps
from argus.store import Attempt
from argus.uniques import sorted_unique

__all__ = ["Gatherer", "gather", "incidents_of", "MAX_POINTS", "SAMPLED_PEERS", "QUANTILE_PEERS", "CDF_PEERS",
           "MAX_LOG_PER_KIND", "MAX_LOG_KINDS"]

MAX_POINTS = 1200  # step-time points drawn
SAMPLED_PEERS = 32  # peer rows in a heatmap
QUANTILE_PEERS = 1024  # peers the heatmap's quantile rows are computed over
CDF_PEERS = 256  # peers whose kernel CDFs are reconstructed
MAX_CULPRIT_ROWS = 16
MAX_PHASES = 24
MAX_CDF_KERNELS = 3
MAX_FILES = 20
MAX_LOG_PER_KIND = 20  # job-log events shown per kind (the first ones: the onset)
MAX_LOG_KINDS = 32  # kinds shown (the signature table has 14; a foreign store may hold anything)


#: evidence that names a kernel whose CDFs the report draws
_CDF_KINDS = (EvidenceKind.W1_OUTLIER, EvidenceKind.GROUP_SHIFT, EvidenceKind.W1_MATRIX)


def incidents_of(attempt: Attempt, diagnosis: Diagnosis | None) -> list[tuple[dict[str, Any], str]]:
    """The incidents to show, with their source: the diagnosis's, plus any stored incident
    newer than the data that the diagnosis did not produce (written by another diagnoser)."""
    out: list[tuple[dict[str, Any], str]] = []
    ids: set[str] = set()
    if diagnosis is not None:
        for inc in diagnosis.incidents:
            j = inc.to_json()
            ids.add(j["id"])
            out.append((j, "diagnosis"))
    fp = fingerprint(attempt.path)
    for j in stored_incidents(attempt, fp.data_mtime_ns):
        if j["id"] not in ids:
            out.append((j, "store"))
    return out


def _quantiles(rows: np.ndarray) -> np.ndarray:
    """p10, p50, p90 down the columns, ignoring NaN (an all-NaN column stays NaN, quietly)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanpercentile(rows, [10, 50, 90], axis=0)


def _sample(ranks: np.ndarray, k: int) -> np.ndarray:
    """``k`` evenly spaced members of sorted ``ranks`` (deterministic, spans the set)."""
    if len(ranks) <= k:
        return ranks
    return ranks[sorted_unique(np.linspace(0, len(ranks) - 1, k).round().astype(np.int64))]


class Gatherer:
    """One attempt's report data. Holds a DuckDB connection (guarded: the web UI shares one
    gatherer between request threads) and the topology, read once."""

    def __init__(self, attempt: Attempt):
        self.attempt = attempt
        self.layout = attempt.layout
        self.hosts = attempt.topology().hosts
        self._lock = threading.Lock()
        self._con = attempt.duckdb()
        self._windows: dict[int, tuple[int, int]] | None = None
        self._files: list[EvidenceFile] | None = None

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> "Gatherer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sql(self, query: str, **tables: pa.Table) -> pa.Table:
        with self._lock:
            for name, t in tables.items():
                self._con.register(name, t)
            try:
                return self._con.sql(query).to_arrow_table()
            finally:
                for name in tables:
                    self._con.unregister(name)

    def host(self, rank: int) -> str:
        return str(self.hosts[rank]) if 0 <= rank < len(self.hosts) else "?"

    # -- job level -----------------------------------------------------------------------
    def step_series(self, max_points: int = MAX_POINTS) -> StepSeries:
        t = self.sql("SELECT step, median(d) AS job, quantile_cont(d, 0.1) AS p10, quantile_cont(d, 0.9) AS p90, "
                     "count(*) FILTER (WHERE end_ns < 0) AS unfinished FROM (SELECT step, end_ns, "
                     "CASE WHEN end_ns >= 0 THEN (end_ns - start_ns) / 1e9 END AS d FROM steps) "
                     "GROUP BY step ORDER BY step")
        steps = t.column("step").to_numpy().astype(np.int64)
        cols = [np.array(t.column(c).to_numpy(zero_copy_only=False), np.float64) for c in ("job", "p10", "p90")]
        unfinished = steps[t.column("unfinished").to_numpy() > 0]
        job, p10, p90 = cols
        job[np.isin(steps, unfinished)] = np.nan
        per = 1
        if len(steps) > max_points:
            per = int(np.ceil(len(steps) / max_points))
            n = int(np.ceil(len(steps) / per))
            pad = n * per - len(steps)

            def binned(a: np.ndarray, fn: Any) -> np.ndarray:
                m = np.concatenate([a, np.full(pad, np.nan)]).reshape(n, per)
                with np.errstate(all="ignore"):
                    return fn(m, axis=1)

            steps = steps[::per]
            job, p10, p90 = binned(job, np.nanmax), binned(p10, np.nanmin), binned(p90, np.nanmax)
        return StepSeries(steps, job, p10, p90, [int(s) for s in unfinished[:100]], per)

    def windows(self) -> dict[int, tuple[int, int]]:
        if self._windows is None:
            with self._lock:
                self._windows = window_steps(self.attempt)
        return self._windows

    def evidence(self, refresh: bool = False) -> list[EvidenceFile]:
        if self._files is None or refresh:
            self._files = evidence_files(self.attempt, self.windows())
        return self._files

    def job_log(self, per_kind: int = MAX_LOG_PER_KIND) -> JobLogView | None:
        """The ``logs`` table by kind: two grouped scans of a table of at most tens of thousands
        of rows (the scanner keeps 10,000 events per ``argus run``). None without one."""
        if not self.attempt.files("logs"):
            return None
        counts = self.sql("SELECT kind, count(*) AS n, sum(lines) AS lines, min(ts_ns) AS first FROM logs "
                          "GROUP BY kind ORDER BY first, kind")
        kinds = [str(k) for k in counts.column("kind").to_pylist()]
        n = counts.column("n").to_pylist()
        lines = counts.column("lines").to_pylist()
        other = sum(int(x or 0) for k, x in zip(kinds, lines) if k == "other")
        shown = {k: int(c) for k, c in zip(kinds, n) if k != "other"}
        keep = list(shown)[:MAX_LOG_KINDS]
        rows = self.sql("SELECT rank, ts_ns, host, stream, kind, severity, text FROM (SELECT *, row_number() OVER "
                        "(PARTITION BY kind ORDER BY ts_ns, rank) AS i FROM logs SEMI JOIN sel USING (kind)) "
                        f"WHERE i <= {int(per_kind)} ORDER BY ts_ns, rank",
                        sel=pa.table({"kind": pa.array(keep, pa.string())})).to_pylist() if keep else []
        return JobLogView({k: shown[k] for k in keep}, rows, other)

    # -- one incident --------------------------------------------------------------------
    def incident(self, inc: dict[str, Any], source: str = "diagnosis") -> IncidentView:
        view = IncidentView(inc, source=source)
        window = inc.get("window") or {}
        lo, hi = window.get("start_step"), window.get("end_step")
        culprits = [int(r) for r in inc.get("culprit_ranks") or [] if 0 <= int(r) < self.layout.world_size]
        if lo is None or hi is None:
            return view
        lo, hi = int(lo), int(hi)
        if culprits:
            view.heatmap = self.phase_heatmap(culprits, lo, hi, str(inc.get("phase") or ""))
        view.cdfs = self.kernel_cdfs(inc.get("evidence") or [], culprits, lo, hi)
        files = [f for f in self.evidence() if f.steps is None or (f.steps[0] <= hi and f.steps[1] >= lo)]
        hosts = set(inc.get("hosts") or [])
        files.sort(key=lambda f: (f.host not in hosts, f.window if f.window is not None else -1, f.host))
        view.files_total = len(files)
        view.files = files[:MAX_FILES]
        return view

    def peers_of(self, culprits: list[int], kind: str = "dp") -> np.ndarray:
        """Members of the culprits' groups of ``kind`` (default: the peer sets), minus culprits."""
        try:
            gid = self.layout.group_index(kind)
        except LayoutError:  # an unknown group kind in hand-made evidence: fall back to peer sets
            gid = self.layout.group_index("dp")
        mine = np.isin(gid, gid[np.asarray(culprits, np.int64)])
        mine[np.asarray(culprits, np.int64)] = False
        return np.flatnonzero(mine)

    def phase_heatmap(self, culprits: list[int], lo: int, hi: int, phase: str) -> PhaseHeatmap | None:
        shown_culprits = sorted(culprits)[:MAX_CULPRIT_ROWS]
        peers = self.peers_of(culprits)
        quant = _sample(peers, QUANTILE_PEERS)
        shown_peers = _sample(quant, SAMPLED_PEERS)
        ranks = sorted_unique(np.concatenate([np.asarray(shown_culprits, np.int64), quant]))
        t = self.sql("SELECT p.rank, p.name, avg(p.dur_ns) / 1e6 AS ms FROM phases p "
                     f"SEMI JOIN sel ON p.rank = sel.rank WHERE p.step BETWEEN {int(lo)} AND {int(hi)} "
                     "AND p.dur_ns >= 0 GROUP BY p.rank, p.name",
                     sel=pa.table({"rank": pa.array(ranks, pa.int32())}))
        if t.num_rows == 0:
            return None
        rank = t.column("rank").to_numpy().astype(np.int64)
        enc = pc.dictionary_encode(t.column("name")).combine_chunks()
        name_id = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        names = [str(n) for n in enc.dictionary.to_pylist()]
        ms = t.column("ms").to_numpy()
        row_of = np.full(self.layout.world_size, -1, np.int64)
        row_of[ranks] = np.arange(len(ranks))
        grid = np.full((len(ranks), len(names)), np.nan)
        grid[row_of[rank], name_id] = ms
        peer_rows = row_of[quant]
        q = _quantiles(grid[peer_rows] if len(peer_rows) else grid)
        order = np.argsort(-np.nan_to_num(q[1], nan=-1.0))
        cols = [int(c) for c in order if np.isfinite(q[1][c])][:MAX_PHASES]
        if phase in names:  # the incident's phase leads
            cols = [names.index(phase)] + [c for c in cols if c != names.index(phase)][:MAX_PHASES - 1]
        rows_ms = [grid[row_of[r], cols] for r in shown_culprits] + [grid[row_of[r], cols] for r in shown_peers] + \
                  [q[i, cols] for i in range(3)]
        labels = ([f"rank {r} · {self.host(r)} (culprit)" for r in shown_culprits]
                  + [f"rank {int(r)} · {self.host(int(r))}" for r in shown_peers]
                  + [f"peers p{p} ({len(quant)} ranks)" for p in (10, 50, 90)])
        mean_ms = np.vstack(rows_ms) if rows_ms else np.zeros((0, len(cols)))
        with np.errstate(all="ignore"):
            ratio = mean_ms / q[1, cols][None, :]
        n_c = len(shown_culprits)
        return PhaseHeatmap(labels, [*shown_culprits, *map(int, shown_peers), None, None, None],
                            [names[c] for c in cols], mean_ms, ratio, list(range(n_c)),
                            [n_c, n_c + len(shown_peers)], len(peers), len(quant), (lo, hi))

    def kernel_cdfs(self, evidence: Iterable[Any], culprits: list[int], lo: int, hi: int) -> list[KernelCdfs]:
        """CDFs for the kernels the evidence names (``w1_outlier``, ``group_shift``,
        ``w1_matrix``), strongest first, culprits vs the peers the evidence compared them with."""
        wanted: dict[tuple[str, int], dict[str, Any]] = {}
        for ev in evidence:
            if not isinstance(ev, dict) or ev.get("kind") not in _CDF_KINDS:
                continue
            kernel, stream = ev.get("kernel"), ev.get("stream")
            if not isinstance(kernel, str) or not isinstance(stream, (int, float)):
                continue
            key = (kernel, int(stream))
            if key not in wanted and len(wanted) >= MAX_CDF_KERNELS:
                continue
            w = wanted.setdefault(key, {"culprits": set(), "peers": None, "kind": ev.get("kind")})
            if ev.get("kind") == EvidenceKind.W1_OUTLIER and isinstance(ev.get("rank"), int):
                w["culprits"].add(int(ev["rank"]))
                w["peers"] = w["peers"] or ev.get("peers")
            elif ev.get("kind") == EvidenceKind.W1_MATRIX:
                w["culprits"].update(int(r) for r in ev.get("culprits") or [])
            else:
                w["culprits"].update(r for r in culprits if r in set(ev.get("ranks") or []))
        out = []
        for (kernel, stream), w in wanted.items():
            c = sorted(w["culprits"] or set(culprits))
            if c:
                cdfs = self._kernel_cdfs(kernel, stream, c, w["peers"], w["kind"] == EvidenceKind.GROUP_SHIFT, lo, hi)
                if cdfs is not None:
                    out.append(cdfs)
        return out

    def _kernel_cdfs(self, kernel: str, stream: int, culprits: list[int], peer_kind: str | None, everyone: bool,
                     lo: int, hi: int) -> KernelCdfs | None:
        f = pc.field
        t = self.attempt.read("kernel_summaries", columns=["rank", "count", "p50_ns", "p99_ns", "min_ns", "max_ns"],
                              filter=(f("kernel") == kernel) & (f("stream") == stream) & (f("start_step") <= hi)
                              & (f("end_step") >= lo))
        if t.num_rows == 0:
            return None
        rank = t.column("rank").to_numpy().astype(np.int64)
        present = sorted_unique(rank)
        shown = [r for r in culprits if r in set(present.tolist())][:6]
        if not shown:
            return None
        peers = present[~np.isin(present, culprits)] if everyone else \
            np.intersect1d(self.peers_of(shown, peer_kind or "dp"), present)
        peers = _sample(peers, CDF_PEERS)
        keep = np.isin(rank, np.concatenate([np.asarray(shown), peers]))
        cols = {c: t.column(c).to_numpy()[keep].astype(np.float64) for c in ("count", "p50_ns", "p99_ns", "min_ns",
                                                                             "max_ns")}
        rank = rank[keep]
        ids, dist = np.unique(rank, return_inverse=True)
        grid = log_grid(max(float(cols["min_ns"].min()) * 0.9, 1.0), float(cols["max_ns"].max()) * 1.1, 200)
        cdf = mixture_cdf(grid, dist, cols["count"], cols["p50_ns"], cols["p99_ns"], n_dist=len(ids),
                          lo=cols["min_ns"], hi=cols["max_ns"])
        pos = {int(r): i for i, r in enumerate(ids)}
        pc_rows = cdf[[pos[int(r)] for r in peers]] if len(peers) else np.full((1, len(grid)), np.nan)
        q = _quantiles(pc_rows)
        return KernelCdfs(kernel, stream, grid / 1e6, [(r, cdf[pos[r]]) for r in shown], q[1], q[0], q[2],
                          len(peers), (lo, hi))

    # -- the whole report ------------------------------------------------------------------
    def report(self, diagnosis: Diagnosis | None, incidents: list[tuple[dict[str, Any], str]] | None = None,
               details: bool = True) -> ReportData:
        """Everything the report shows. ``details=False`` skips per-incident plots (the web
        UI's run page draws them only when an incident is opened)."""
        a = self.attempt
        l1 = diagnosis.l1 if diagnosis is not None else None
        baseline = float(l1.baseline_s) if l1 is not None and np.isfinite(l1.baseline_s) else None
        found = incidents if incidents is not None else incidents_of(a, diagnosis)
        views = [self.incident(j, src) if details else IncidentView(j, source=src) for j, src in found]
        return ReportData(
            run_id=a.identity.run_id, attempt_id=a.identity.attempt_id, layout=str(self.layout),
            ranks=self.layout.world_size, hosts=len(set(self.hosts.tolist())), source=str(a.meta.get("source", "")),
            scenario=a.meta.get("scenario"), series=self.step_series(), baseline_s=baseline,
            l1_windows=[w.to_json() for w in l1.windows] if l1 is not None else [], incidents=views,
            attempt_path=str(a.path), diagnosed=diagnosis is not None,
            diagnosis_s=diagnosis.timings_s.get("total") if diagnosis is not None else None,
            generated_ns=time.time_ns(),
            missing=list((diagnosis.missing if diagnosis is not None else None) or [d.reason for d in a.damage]),
            nodes=_node_standings(a, set(self.hosts.astype(str).tolist())), job_log=self.job_log())


def _node_standings(attempt: Attempt, hosts: set[str]) -> list[dict[str, Any]]:
    """The job's hosts as the store's kept health checks judge them (none kept: empty). The
    attempt lives at ``<store>/runs/<run>/<attempt>``."""
    from argus.healthcheck.records import stored_health
    from argus.healthcheck.standing import node_standings

    try:
        root = Path(attempt.path).parents[2]
        nodes = [n.to_json() for n in node_standings(root) if n.host in hosts]
        latest: dict[str, list[dict[str, Any]]] = {}
        for _, doc in stored_health(root):  # newest first: the node's last check, figure by figure
            host = str(doc.get("host"))
            if host in hosts and host not in latest:
                latest[host] = _figures(doc)
            if len(latest) == len(hosts):
                break
        for n in nodes:
            n["figures"] = latest.get(n["host"], [])
        return nodes
    except Exception:  # noqa: BLE001 - the report stands without them
        return []


#: figures of a node's last check shown in the report (failures first)
MAX_NODE_FIGURES = 12


def _figures(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A kept health document's verdicts as the report shows them: what was measured on what,
    against the node's own baseline and its peers, and the verdict — failures first."""
    rows = [v for v in doc.get("verdicts") or [] if isinstance(v, dict)]
    rows.sort(key=lambda v: (v.get("status") != "fail", -(v.get("deficit") or 0.0)))
    keep = ("metric", "subject", "value", "unit", "size_bytes", "baseline", "peers", "expected", "deficit", "status")
    return [{k: v.get(k) for k in keep} for v in rows[:MAX_NODE_FIGURES]]


def gather(attempt: Attempt, diagnosis: Diagnosis | None = None) -> ReportData:
    """Report data for ``attempt`` given its diagnosis (``argus.analysis.diagnose``'s result,
    or None to show only stored incidents)."""
    with Gatherer(attempt) as g:
        return g.report(diagnosis)
