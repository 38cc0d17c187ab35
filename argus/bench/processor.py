"""``argus bench processor``: compression rate, socket throughput, CPU cost at a realistic
rate, and memory over a long stream — against a real ``argus processor`` process.

Clients replay one simulated window (8 ranks of the standard workload, or its steps and
phases with the production workload's kernels: ``workload="production"``) with advancing
step numbers over real unix sockets. The processor's CPU time comes from ``/proc/<pid>/stat``
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
from typing import Any

import numpy as np
import pyarrow as pa

from argus.errors import ConfigError
from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import DTYPES, encode_array, encode_json

__all__ = ["run_compression", "run_evidence", "run_perfetto", "run_socket", "window_tables", "RowMajorWire",
           "WORKLOADS"]

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


WORKLOADS = ("standard", "production")


def _window(ranks: int = 8, steps: int = 5, seed: int = 0, workload: str = "standard"
            ) -> tuple[list[str], list[dict[int, dict[Msg, np.ndarray]]]]:
    """One host-window as the clients send it: the interned names and, per step, each rank's
    record batches.

    ``standard``: the simulator's job (≈ 1,350 events per rank-step). ``production``: the same
    steps and phases, each rank-step's kernels replaced by the production workload's 12,370
    launches of 207 kernels (:class:`~argus.sim.production.ProductionWorkload`) at their own
    offsets from the step's start. Their timeline (≈ 1.4 s) outlasts the simulator's step
    (≈ 0.6 s), so each step is moved later, phases with it, until it starts after every
    rank's previous kernels have ended, and ends with its own: a stream's kernels never
    overlap, as on a GPU. Names are appended to the simulator's, so ids stay one table."""
    from argus.sim import Engine, SimConfig
    from argus.sim.feed import step_batches

    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r} (one of {', '.join(WORKLOADS)})")
    engine = Engine(SimConfig(ranks=ranks, steps=steps + 2, layout="tp=2,pp=2,ep=2", seed=seed))
    batches = [step_batches(r) for r in list(engine.run())[2:]]
    names = list(engine.names.names)
    if workload == "production":
        from argus.sim.production import ProductionWorkload

        k = ProductionWorkload().generate(ranks, steps)
        base = len(names)
        names += k.names
        shift, kernels_end = 0, dict[int, int]()  # rank → end of its previous step's kernels (shifted)
        for s, by_rank in enumerate(batches):
            offsets = {}
            for r, by_msg in by_rank.items():
                m = (k.rank == r) & (k.step == s)
                offsets[r] = (k.start_ns[m] - k.start_ns[m].min(), m)
                shift = max(shift, kernels_end.get(r, 0) - int(by_msg[Msg.STEPS]["start_ns"][0]))
            for r, by_msg in by_rank.items():
                offset, m = offsets[r]
                st, ph = by_msg[Msg.STEPS], by_msg[Msg.PHASES]
                st["start_ns"] += shift
                ph["start_ns"] += shift
                rec = np.zeros(int(m.sum()), DTYPES[Msg.KERNELS])
                rec["step"] = st["step"][0]
                rec["start_ns"] = st["start_ns"][0] + offset
                rec["dur_ns"], rec["name"], rec["stream"], rec["device"] = k.dur_ns[m], base + k.name_id[m], k.stream[m], r
                by_msg[Msg.KERNELS] = rec  # kind 0: kernel
                kernels_end[r] = int((rec["start_ns"] + rec["dur_ns"]).max())
                if st["end_ns"][0] >= 0:
                    st["end_ns"] = max(int(st["end_ns"][0]) + shift, kernels_end[r])
    return names, batches


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
               duration_s: float | None = None, evidence: bool = True, window_steps: int = 5,
               evidence_interval_s: float = 0.0, workload: str = "standard") -> dict:
    """Stream through a real processor, as fast as possible or paced at
    ``rate_per_min_per_rank``, until ``events`` are sent or ``duration_s`` has passed.

    ``evidence_interval_s`` 0 writes a Perfetto trace of every window (the worst case: every
    window slow); the daemon's default (10 s) writes one for slow windows and one per interval
    otherwise. The evidence left in the store gives the bytes per rank-step. ``workload``: see
    :func:`_window`."""
    names, steps = _window(workload=workload)
    ranks = sorted(steps[0])
    tmp = Path(tempfile.mkdtemp(prefix="argus-pb-"))
    sock = tmp / "p.sock"
    args = [sys.executable, "-m", "argus", "processor", "--store", str(tmp / "store"), "--socket", str(sock),
            "--host", "bench", "--window-steps", str(window_steps), "--no-fsync", "--no-host-counters"]
    args += ["--evidence-interval", str(evidence_interval_s)] if evidence else ["--no-evidence"]
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
        per_step = [sum(len(b) for rb in s.values() for b in rb.values()) for s in steps]
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
            sent += per_step[step % len(steps)]
            for r, by_msg in batches.items():
                for msg in (Msg.PHASES, Msg.KERNELS, Msg.STEPS):
                    recs = by_msg[msg].copy()
                    recs["step"] = step
                    clients[r].send_raw(encode_array(msg, recs))
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
        traces = [p.stat().st_size for p in (tmp / "store").rglob("*.pftrace")]
        third = max(len(rss) // 3, 1)
        mid = rss[third:-third] or rss
        return {
            "bench": "processor", "mode": mode, "workload": workload, "ranks": len(ranks), "evidence": evidence,
            "evidence_interval_s": evidence_interval_s if evidence else None, "evidence_files": len(traces),
            "evidence_bytes_per_rank_step": round(sum(traces) / len(traces) / (len(ranks) * window_steps))
            if traces else None,
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



def run_evidence(repeat: int = 7) -> dict:
    """One window's Perfetto trace (8 ranks × 5 steps, pipeline-parallel: ``pp-send`` slices
    straddle compute), built the current way and the old way — the row-major encoder it
    replaced and the per-slice lane loop for every group that does not nest — interleaved
    ``repeat`` times; CPU seconds (``time.process_time``), best of each, and whether the bytes
    are the same. (The rest of the "before" is the current build: for the whole earlier
    build side by side, see :func:`run_perfetto` with ``before``.)"""
    from argus.evidence import perfetto

    from argus.sim import Engine, SimConfig

    engine = Engine(SimConfig(ranks=8, steps=7, layout="tp=2,pp=2,ep=2", seed=0))
    recs = list(engine.run())[2:]
    phases = pa.concat_tables([r.phases_table() for r in recs])
    kernels = pa.concat_tables([r.kernels_table() for r in recs])
    n = phases.num_rows + kernels.num_rows
    current: tuple[Any, Any, Any] = (perfetto._Wire, perfetto._two_lane_groups, perfetto._chain_lanes)
    # the old paths: the row-major encoder, a Python step per slice of every group that does not nest
    before: tuple[Any, Any, Any] = (RowMajorWire, lambda *a: set(), lambda *a, **k: None)
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    out: dict[str, bytes] = {}
    try:
        for _ in range(repeat):
            for label, (wire, two_lanes, chains) in (("before", before), ("after", current)):
                setattr(perfetto, "_Wire", wire)
                setattr(perfetto, "_two_lane_groups", two_lanes)
                setattr(perfetto, "_chain_lanes", chains)
                t0 = time.process_time()
                out[label] = perfetto.build_perfetto_trace(phases=phases, kernels=kernels, title="bench")
                cpu[label].append(time.process_time() - t0)
    finally:
        setattr(perfetto, "_Wire", current[0])
        setattr(perfetto, "_two_lane_groups", current[1])
        setattr(perfetto, "_chain_lanes", current[2])
    best = {k: min(v) for k, v in cpu.items()}
    return {"bench": "processor", "mode": "evidence", "events": n, "ranks": 8, "steps": len(recs),
            "trace_bytes": len(out["after"]), "bytes_identical": out["before"] == out["after"],
            "evidence_bytes_per_rank_step": round(len(out["after"]) / (8 * len(recs))),
            "before_cpu_ms": round(1e3 * best["before"], 1), "after_cpu_ms": round(1e3 * best["after"], 1),
            "before_events_per_cpu_s": round(n / best["before"]), "after_events_per_cpu_s": round(n / best["after"]),
            "speedup": round(best["before"] / best["after"], 2)}


def window_tables(workload: str = "production", ranks: int = 8, steps: int = 5) -> tuple[pa.Table, pa.Table]:
    """One host-window's ``phases`` and ``kernels`` as the processor hands them to the
    Perfetto writer: the clients' batches of :func:`_window`, materialised by the assembler's
    own code (names decoded from each rank's table, categories and kinds as strings), chunks
    in arrival order (step by step, rank by rank)."""
    from types import SimpleNamespace

    from argus.processor.assembler import _materialise

    names, batches = _window(ranks, steps, workload=workload)
    infos = {r: SimpleNamespace(rank=r, names=names) for r in sorted(batches[0])}
    parts: dict[Msg, list] = {Msg.PHASES: [], Msg.KERNELS: []}
    for by_rank in batches:
        for r, by_msg in sorted(by_rank.items()):
            for msg, chunks in parts.items():
                chunks.append((infos[r], by_msg[msg], len(names)))
    return _materialise(Msg.PHASES, parts[Msg.PHASES]), _materialise(Msg.KERNELS, parts[Msg.KERNELS])


def run_perfetto(workload: str = "production", repeat: int = 3, before: str | None = None,
                 overlapping: bool = False) -> dict:
    """One host-window's Perfetto trace (8 ranks × 5 steps, as the processor writes it):
    CPU seconds per build (``time.process_time``, best of ``repeat``), µs per event, bytes,
    and a digest of the bytes (a change of output shows as a new digest).

    ``before``: a source tree (e.g. a ``git worktree`` of an older commit) whose
    ``argus/evidence/perfetto.py`` is built too, interleaved with the current one, for a
    before/after in one process. ``overlapping``: each step's kernels 0.8 s earlier per step,
    so that every stream's kernels overlap the next step's (as the first harness of
    ``docs/scale.md`` M2 laid them): the lane assignment's worst case."""
    import hashlib
    import importlib.util

    from argus.evidence import perfetto

    phases, kernels = window_tables(workload)
    if overlapping:
        step = kernels.column("step").to_numpy()
        start = kernels.column("start_ns").to_numpy() - (step - step.min()) * 800_000_000
        kernels = kernels.set_column(kernels.column_names.index("start_ns"), "start_ns", pa.array(start, pa.int64()))
    n = phases.num_rows + kernels.num_rows
    builds: dict[str, Any] = {"after": perfetto}
    if before is not None:
        path = Path(before) / "argus" / "evidence" / "perfetto.py"
        if not path.is_file():
            raise ConfigError(f"argus bench perfetto --before {before}: no {path}")
        spec = importlib.util.spec_from_file_location("argus_perfetto_before", path)
        assert spec is not None and spec.loader is not None
        builds["before"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(builds["before"])
    hosts = {r: "bench" for r in range(8)}
    cpu: dict[str, list[float]] = {label: [] for label in builds}
    digest: dict[str, str] = {}
    data = b""
    for _ in range(repeat):
        for label in sorted(builds, reverse=True):  # before, then after
            t0 = time.process_time()
            data = builds[label].build_perfetto_trace(phases=phases, kernels=kernels, hosts=hosts,
                                                      title="bench window 0 (bench)")
            cpu[label].append(time.process_time() - t0)
            digest[label] = hashlib.sha256(data).hexdigest()
    best = min(cpu["after"])
    row = {"bench": "processor", "mode": "perfetto", "workload": workload, "overlapping": overlapping, "events": n,
           "phases": phases.num_rows, "kernels": kernels.num_rows, "build_cpu_s": round(best, 3),
           "build_cpu_s_all": [round(c, 3) for c in cpu["after"]], "us_per_event": round(1e6 * best / n, 3),
           "events_per_cpu_s": round(n / best), "trace_bytes": len(data), "sha256": digest["after"]}
    if before is not None:
        old = min(cpu["before"])
        row.update({"before": before, "before_cpu_s": round(old, 3),
                    "before_cpu_s_all": [round(c, 3) for c in cpu["before"]],
                    "before_us_per_event": round(1e6 * old / n, 3), "bytes_identical": digest["before"] == digest["after"],
                    "speedup": round(old / best, 2),
                    "speedup_median": round(float(np.median(cpu["before"]) / np.median(cpu["after"])), 2)})
    return row


_VARINT_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)


def _row_major_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | int]:
    v = np.asarray(values)
    v = v if v.dtype == np.uint64 else v.astype(np.int64).view(np.uint64)
    lengths = np.searchsorted(_VARINT_LIMITS, v, side="right").astype(np.int64) + 1
    lo, hi = (int(lengths.min()), int(lengths.max())) if v.size else (1, 1)
    out = np.empty((v.size, hi), np.uint8)
    for k in range(hi):
        byte = (v >> np.uint64(7 * k)) & np.uint64(0x7F)
        if k < lo - 1:
            byte |= np.uint64(0x80)
        elif k < hi - 1:
            byte |= np.where(k < lengths - 1, np.uint64(0x80), np.uint64(0))
        out[:, k] = byte
    return out, (hi if lo == hi else lengths)


class RowMajorWire:
    """The Perfetto column encoder before its byte-major layout (verbatim but for names, and
    for ``index`` and ``prefix``, which its successors take: gathered and prepended here): the
    "before" of the evidence mode, and the reference its replacements must match byte for byte."""

    def __init__(self, n: int):
        self.n = n
        self._segs: list[tuple[np.ndarray, np.ndarray | int]] = []

    def _append(self, data, lengths, where) -> None:
        if where is not None:
            lengths = np.where(where, lengths, 0)
            if not lengths.any():
                return
        elif isinstance(lengths, int) and self._segs and isinstance(self._segs[-1][1], int):
            prev, width = self._segs.pop()
            if prev.shape[0] != data.shape[0]:
                prev, data = (np.broadcast_to(a, (self.n, a.shape[1])) for a in (prev, data))
            data, lengths = np.concatenate([prev, data], axis=1), width + lengths
        self._segs.append((data, lengths))

    def raw(self, data: bytes, where=None) -> None:
        self._append(np.frombuffer(data, np.uint8)[None, :], len(data), where)

    def varint(self, field: int, values, where=None, index=None) -> None:
        values = values if index is None else np.asarray(values)[index]
        self.raw(_tag(field, 0), where)
        self._append(*_row_major_varints(values if where is None else np.where(where, values, 0)), where)

    def fixed64(self, field: int, values, where=None, index=None) -> None:
        values = values if index is None else np.asarray(values)[index]
        self.raw(_tag(field, 1), where)
        self._append(np.ascontiguousarray(values, dtype="<u8").view(np.uint8).reshape(-1, 8), 8, where)

    def message(self, field: int, sub: RowMajorWire, where=None) -> None:
        self.raw(_tag(field, 2), where)
        self._append(*_row_major_varints(sub.lengths()), where)
        for data, lengths in sub._segs:
            self._append(data, lengths, where)

    def lengths(self) -> np.ndarray:
        total = np.zeros(self.n, np.int64)
        for _, lengths in self._segs:
            total += lengths
        return total

    def tobytes(self, prefix: bytes = b"") -> bytes:
        if self.n == 0 or not self._segs:
            return prefix
        data = np.concatenate([np.broadcast_to(d, (self.n, d.shape[1])) for d, _ in self._segs], axis=1)
        used = np.concatenate([np.ones((self.n, d.shape[1]), bool) if isinstance(u, int)
                               else np.arange(d.shape[1]) < u[:, None] for d, u in self._segs], axis=1)
        return prefix + data[used].tobytes()

    def tobuffer(self, prefix: bytes = b"") -> bytearray:
        return bytearray(self.tobytes(prefix))



def _tag(field: int, wire_type: int) -> bytes:
    value, out = field << 3 | wire_type, bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
