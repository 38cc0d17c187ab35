"""Cut incoming record batches into windows of steps, and turn a closed window into tables.

A window is ``window_steps`` consecutive steps. It closes when every connected rank has
reported a step ``close_lag_steps`` past its end (kernel buffers arrive after the step they
ran in), when it has been open ``timeout_s`` (a hang must not hold data forever), or at
shutdown. Memory holds only open windows, capped at ``max_events``: beyond it, batches are
dropped and counted — the counts go to the store's ``drops`` table with the window.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa

from argus.wire.protocol import CATEGORIES, GPU_STEP_PHASE, GROUP_KINDS, KINDS, RERUNS, SENSORS, TABLES_BY_MSG, Msg
from argus.store import WINDOW_STEPS, WindowData
from argus.store import conform
from argus.store.dictionary import first_seen_dictionary
from argus.uniques import sorted_unique

__all__ = ["WindowAssembler", "RankInfo", "WINDOW_TIMEOUT_S"]

_DATA = tuple(TABLES_BY_MSG)
#: A window open this long closes whatever its ranks reported (``argus processor --window-timeout``).
WINDOW_TIMEOUT_S = 30.0
#: Largest step number taken (~10**12; a job runs 10**7 steps at most). A record past it is
#: dropped and counted: one at 2**63-1 would open a window no reader could enumerate to.
MAX_STEP = 1 << 40
#: Windows open at once per attempt. Ranks keep a few open (their last steps, the writer's
#: queue); one batch spread over millions of steps would otherwise make millions of windows.
MAX_OPEN_WINDOWS = 1024


def invalid_records(msg: Msg, records: np.ndarray) -> np.ndarray:
    """Mask of records no producer writes: steps past ``MAX_STEP`` (or a negative one on a
    STEPS record), negative durations or counts, a wait below -1, an end before its start."""
    bad = np.zeros(len(records), bool)
    names = records.dtype.names or ()
    if "step" in names:
        bad |= records["step"] > MAX_STEP
        if msg == Msg.STEPS:
            bad |= records["step"] < 0
    for col in ("dur_ns", "count"):  # (wait_ns -1 means "not measured")
        if col in names:
            bad |= records[col] < 0
    if "wait_ns" in names:
        bad |= records["wait_ns"] < -1
    if "end_ns" in names:
        bad |= (records["end_ns"] >= 0) & (records["end_ns"] < records["start_ns"])
    return bad


@dataclass
class RankInfo:
    """What the processor knows of one rank (from its HELLO) and its name table."""

    rank: int
    gpu_uuid: str = ""
    names: list[str] = field(default_factory=list)
    max_step: int = -1
    step_starts: list[int] = field(default_factory=list)  # recent steps, for placing kernels in time
    step_ids: list[int] = field(default_factory=list)
    #: … and the same steps' starts on the GPU (``GPU_STEP_PHASE``): the CPU runs ahead of the
    #: device, so a kernel belongs to the step the GPU was in when it ran, not the host's
    gpu_step_starts: list[int] = field(default_factory=list)
    gpu_step_ids: list[int] = field(default_factory=list)
    gpu_step_name: int = -1  # its id in ``names``, once seen
    names_checked: int = 0  # how much of ``names`` was searched for it


@dataclass
class _Window:
    index: int
    opened_at: float
    chunks: list[tuple[RankInfo, Msg, np.ndarray, int]] = field(default_factory=list)  # (+ names length)
    events: int = 0
    ranks: set[int] = field(default_factory=set)
    force: bool = False


class WindowAssembler:
    def __init__(self, window_steps: int = WINDOW_STEPS, timeout_s: float = WINDOW_TIMEOUT_S,
                 max_events: int = 20_000_000, close_lag_steps: int = 1,
                 clock: Callable[[], float] = time.monotonic, keep_steps: int = 256, host: str = ""):
        self.host = host
        self.window_steps = window_steps
        self.timeout_s = timeout_s
        self.max_events = max_events
        self.close_lag_steps = close_lag_steps
        self.clock = clock
        self.keep_steps = keep_steps
        self.windows: dict[int, _Window] = {}
        self.buffered_events = 0
        self.drops: dict[tuple[int, int, str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.received_events = 0

    # -- input -----------------------------------------------------------------------------
    def note_drop(self, window: int, rank: int, table: str, events: int, batches: int, reason: str) -> None:
        d = self.drops[(window, rank, table, reason)]
        d[0] += events
        d[1] += batches

    def add(self, info: RankInfo, msg: Msg, records: np.ndarray) -> None:
        """Buffer one decoded batch of ``info.rank``'s records."""
        n = len(records)
        if n == 0:
            return
        table = TABLES_BY_MSG[msg]
        bad = invalid_records(msg, records)
        if bad.any():
            self.note_drop(-1, info.rank, table, int(bad.sum()), 0, "invalid_values")
            records = records[~bad]
            n = len(records)
            if n == 0:
                return
        if msg == Msg.PHASES:
            records = self._take_gpu_steps(info, records)
            n = len(records)
            if n == 0:
                return
        steps, placed = self._steps_of(info, msg, records)
        windows = steps // self.window_steps
        uniq = _distinct(windows)
        if uniq.size <= 64:  # a batch spans a window or two: no sort, no isin
            new = np.array([w for w in uniq.tolist() if w not in self.windows], np.int64)
        else:
            new = uniq[~np.isin(uniq, np.fromiter(self.windows, np.int64, len(self.windows)))]
        room = max(MAX_OPEN_WINDOWS - len(self.windows), 0)
        if len(new) > room:  # the lowest new windows open; records for the rest are dropped
            refused = np.isin(windows, new[room:])
            self.note_drop(-1, info.rank, table, int(refused.sum()), 1, "too_many_windows")
            keep = ~refused
            records, steps, windows = records[keep], steps[keep], windows[keep]
            n = len(records)
            if n == 0:
                return
            uniq = _distinct(windows)
        if placed:
            records = records.copy()
            records["step"] = steps  # store the step each kernel was placed in
        if self.buffered_events + n > self.max_events:
            for w, count in zip(*np.unique(windows, return_counts=True)):
                self.note_drop(int(w), info.rank, table, int(count), 1, "memory_cap")
            return
        if msg == Msg.STEPS:
            self._track_steps(info, records)
        self.received_events += n
        for w in uniq:
            part = records if len(uniq) == 1 else records[windows == w]
            win = self.windows.get(int(w))
            if win is None:
                win = self.windows[int(w)] = _Window(int(w), self.clock())
            win.chunks.append((info, msg, part, len(info.names)))
            win.events += len(part)
            win.ranks.add(info.rank)
        self.buffered_events += n

    def _steps_of(self, info: RankInfo, msg: Msg, records: np.ndarray) -> tuple[np.ndarray, bool]:
        """Each record's step, and whether any was placed by time (a record without one)."""
        if msg == Msg.HW:  # samples carry no step: place them by time like unknown-step kernels
            return self._place(info, records["ts_ns"]), False
        steps = records["step"].astype(np.int64, copy=False)
        unknown = steps < 0
        if not unknown.any():
            return steps, False
        steps = steps.copy()
        steps[unknown] = self._place(info, records["start_ns"][unknown], gpu=msg == Msg.KERNELS)
        return steps, True

    def _take_gpu_steps(self, info: RankInfo, records: np.ndarray) -> np.ndarray:
        """Keep the GPU's step starts out of the phases, for placing kernels."""
        if info.names_checked < len(info.names):
            if info.gpu_step_name < 0 and GPU_STEP_PHASE in info.names[info.names_checked:]:
                info.gpu_step_name = info.names.index(GPU_STEP_PHASE, info.names_checked)
            info.names_checked = len(info.names)
        if info.gpu_step_name < 0:
            return records
        gpu = records["name"] == info.gpu_step_name
        if not gpu.any():
            return records
        got = records[gpu]
        pairs = sorted(zip(got["step"].tolist(), got["start_ns"].tolist()))
        known = dict(zip(info.gpu_step_ids, info.gpu_step_starts))
        known.update(pairs)
        ids = sorted(known)[-self.keep_steps:]
        info.gpu_step_ids, info.gpu_step_starts = ids, [known[i] for i in ids]
        return records[~gpu]

    def _place(self, info: RankInfo, ts: np.ndarray, gpu: bool = False) -> np.ndarray:
        """The step whose start is the latest at or before each timestamp; ``gpu`` (kernels):
        by the GPU's step starts where they reach back that far, else the host's."""
        if gpu and info.gpu_step_starts:
            starts = np.asarray(info.gpu_step_starts)
            idx = np.searchsorted(starts, ts, side="right") - 1
            by_gpu = np.asarray(info.gpu_step_ids)[np.maximum(idx, 0)].astype(np.int64)
            return np.where(idx >= 0, by_gpu, self._place(info, ts))
        if not info.step_starts:
            return np.full(len(ts), max(info.max_step + 1, 0), np.int64)
        starts = np.asarray(info.step_starts)
        idx = np.searchsorted(starts, ts, side="right") - 1
        ids = np.asarray(info.step_ids)
        return np.where(idx >= 0, ids[np.maximum(idx, 0)], ids[0]).astype(np.int64)

    def _track_steps(self, info: RankInfo, records: np.ndarray) -> None:
        done = records[records["end_ns"] >= 0]
        if len(done):
            info.max_step = max(info.max_step, int(done["step"].max()))
        order = np.argsort(records["start_ns"])
        info.step_starts.extend(records["start_ns"][order].tolist())
        info.step_ids.extend(records["step"][order].tolist())
        if len(info.step_starts) > self.keep_steps:
            del info.step_starts[:-self.keep_steps]
            del info.step_ids[:-self.keep_steps]

    # -- closing ---------------------------------------------------------------------------
    def force_all(self) -> list[int]:
        for w in self.windows.values():
            w.force = True
        return sorted(self.windows)

    def ready(self, active: dict[int, RankInfo], final: bool = False) -> list[int]:
        """Windows that can be written now, oldest first."""
        now = self.clock()
        out = []
        for idx, win in sorted(self.windows.items()):
            end_step = (idx + 1) * self.window_steps - 1
            waiting = [r for r in active.values() if r.max_step < end_step + self.close_lag_steps]
            if final or win.force or not waiting or now - win.opened_at >= self.timeout_s:
                out.append(idx)
        return out

    def take(self, index: int) -> tuple[WindowData, set[int]]:
        """Remove window ``index`` and return it as store tables, with its contributing ranks."""
        win = self.windows.pop(index)
        self.buffered_events -= win.events
        lo = index * self.window_steps
        data = WindowData(window=index, start_step=lo, end_step=lo + self.window_steps - 1)
        by_msg: dict[Msg, list] = defaultdict(list)
        for info, msg, recs, n_names in win.chunks:
            by_msg[msg].append((info, recs, n_names))
        for msg, parts in by_msg.items():
            setattr(data, _TABLE[msg], _materialise(msg, parts))
        data.drops = self._take_drops(index)
        return data, win.ranks

    def _take_drops(self, index: int) -> pa.Table | None:
        keys = [k for k in self.drops if k[0] in (index, -1)]
        if not keys:
            return None
        rows: dict[str, list] = {"window": [], "rank": [], "host": [], "table": [], "events": [], "batches": [],
                                 "reason": []}
        for key in keys:
            events, batches = self.drops.pop(key)
            window, rank, table, reason = key
            for col, v in zip(rows, (window, rank, self.host, table, events, batches, reason)):
                rows[col].append(v)
        return conform("drops", rows)


_TABLE = TABLES_BY_MSG


def _names(parts: list, field_name: str) -> pa.Array:
    """Decode interned ids (each rank has its own name table) to strings with one ``take``."""
    return _name_dictionary(parts, field_name).cast(pa.string())


def _name_dictionary(parts: list, field_name: str) -> pa.DictionaryArray:
    """Interned ids (each rank has its own name table) as one dictionary column: codes into
    the window's distinct names, numbered as ``dictionary_encode`` of the strings would
    (``argus/store/dictionary.py``) — no string per row.

    The tables of all chunks are laid end to end, each chunk's ids shifted to its table; a
    table only grows, so the longest prefix any of its chunks saw serves them all. (A
    dictionary and a cast per chunk cost ~0.1 ms each: ~40 chunks per table per window.)"""
    if not parts:
        return pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), pa.array([], pa.string()))
    longest: dict[int, tuple[RankInfo, int]] = {}
    for info, _, n_names in parts:
        if longest.get(id(info), (info, -1))[1] < n_names:
            longest[id(info)] = (info, n_names)
    offset, start, names = {}, 0, []
    for key, (info, n_names) in longest.items():
        offset[key] = start
        names.extend(info.names[:n_names])
        start += n_names
    codes = _concat([recs[field_name].astype(np.int32) + np.int32(offset[id(info)]) for info, recs, _ in parts])
    return first_seen_dictionary(codes, names)


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of a batch's windows; one window (the usual batch) without a sort."""
    lo, hi = int(values.min()), int(values.max())
    return np.array([lo], np.int64) if lo == hi else sorted_unique(values)


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate`` for chunks of one dtype, without its per-chunk dtype promotion
    (~0.2 ms per structured chunk: most of a window's materialisation); contiguous even when
    the chunks are strided (a field of structured records)."""
    if len(arrays) == 1 or any(a.dtype != arrays[0].dtype for a in arrays):
        return np.concatenate(arrays)
    out = np.empty(sum(len(a) for a in arrays), arrays[0].dtype)
    i = 0
    for a in arrays:
        out[i:i + len(a)] = a
        i += len(a)
    return out


def _codes(values: np.ndarray, table: tuple[str, ...]) -> pa.Array:
    codes = np.minimum(values.astype(np.int32), len(table) - 1)
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(table)).cast(pa.string())


def _code_dictionary(values: np.ndarray, table: tuple[str, ...]) -> pa.DictionaryArray:
    """A vocabulary code column (past the table: its last entry) as a dictionary column."""
    return first_seen_dictionary(np.minimum(values.astype(np.int32), len(table) - 1), table)


class _Fields:
    """The chunks' records, a field at a time: ``recs["step"]`` is that field of every chunk in
    one contiguous array, copied once (concatenating the records first, then taking a strided
    field out of them for Arrow, copied each byte twice)."""

    def __init__(self, chunks: list[np.ndarray]):
        self._chunks = chunks

    def __getitem__(self, name: str) -> np.ndarray:
        return _concat([c[name] for c in self._chunks])


def _materialise(msg: Msg, parts: list) -> pa.Table:
    recs = _Fields([p[1] for p in parts])
    ranks = np.repeat(np.array([p[0].rank for p in parts], np.int32), [len(p[1]) for p in parts])
    if msg == Msg.STEPS:
        cols = {"rank": ranks, "step": recs["step"], "start_ns": recs["start_ns"], "end_ns": recs["end_ns"]}
    elif msg == Msg.PHASES:
        cols = {"rank": ranks, "step": recs["step"], "microbatch": recs["microbatch"], "name": _names(parts, "name"),
                "category": _codes(recs["category"], CATEGORIES), "group_kind": _codes(recs["group_kind"], GROUP_KINDS),
                "start_ns": recs["start_ns"], "dur_ns": recs["dur_ns"], "wait_ns": recs["wait_ns"]}
    elif msg == Msg.KERNELS:  # names and kinds stay codes: the compression and the trace take them so
        cols = {"rank": ranks, "step": recs["step"], "kind": _code_dictionary(recs["kind"], KINDS),
                "device": recs["device"], "stream": recs["stream"], "name": _name_dictionary(parts, "name"),
                "start_ns": recs["start_ns"], "dur_ns": recs["dur_ns"]}
        return conform("kernels", cols, dictionaries=True)
    elif msg == Msg.STACKS:
        cols = {"rank": ranks, "step": recs["step"], "start_ns": recs["start_ns"], "end_ns": recs["end_ns"],
                "thread": _names(parts, "thread"), "frames": _names(parts, "frames"), "count": recs["count"]}
    elif msg == Msg.CHECKS:  # the u64 digest kept bit for bit in a signed column
        gpus = np.concatenate([np.full(len(p[1]), p[0].gpu_uuid, object) for p in parts])
        cols = {"rank": ranks, "gpu_uuid": gpus, "step": recs["step"], "ts_ns": recs["ts_ns"],
                "sensor": _codes(recs["sensor"], SENSORS), "tensors": recs["tensors"], "elements": recs["elements"],
                "digest": recs["digest"].view(np.int64), "nonfinite": recs["nonfinite"],
                "violations": recs["violations"], "rerun": _codes(np.maximum(recs["rerun"], 0), RERUNS)}
    else:
        gpus = np.concatenate([np.full(len(p[1]), p[0].gpu_uuid, object) for p in parts])
        cols = {"rank": ranks, "gpu_uuid": gpus, "ts_ns": recs["ts_ns"], "metric": _names(parts, "metric"),
                "value": recs["value"]}
    return conform(_TABLE[msg], cols)
