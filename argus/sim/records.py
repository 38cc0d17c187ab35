"""Per-step output of the simulation engine, kept as column chunks until asked for tables.

The engine appends one chunk per operation (arrays over the ranks of one stage), never one
row at a time. Times inside the engine are float64 ns on a true global clock; materialising
adds each host's clock offset and turns "never finished" (inf) into ``-1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

__all__ = ["NameTable", "StepRecords"]


class NameTable:
    """Interns every string the engine emits (names, categories, group kinds) as small integers."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}

    def id(self, name: str) -> int:
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = len(self.names)
            self.names.append(name)
        return found

    def dictionary(self) -> pa.Array:
        return pa.array(self.names, pa.string())


def _strings(ids: np.ndarray, names: NameTable) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(ids, pa.int32()), names.dictionary()).cast(pa.string())


@dataclass
class StepRecords:
    """Everything one simulated step produced, for all ranks."""

    step: int
    names: NameTable
    clock_offset_ns: np.ndarray  # per rank (small: the host's clock error), added when materialising
    epoch_ns: int = 0  # added in int64 after rounding: float64 cannot hold 1.7e18 to the ns
    step_start: np.ndarray = field(default_factory=lambda: np.empty(0))  # per rank
    step_end: np.ndarray = field(default_factory=lambda: np.empty(0))
    # (ranks, microbatch, name_id, category_id, group_id, start, dur)
    phase_chunks: list[tuple] = field(default_factory=list)
    # (ranks, device, stream, name_ids (K,), kind_id, start (C,K), dur (C,K))
    kernel_chunks: list[tuple] = field(default_factory=list)
    stacks: pa.Table | None = None
    hw: pa.Table | None = None

    # -- counts --------------------------------------------------------------------------
    @property
    def n_phase_events(self) -> int:
        return sum(len(c[0]) for c in self.phase_chunks)

    @property
    def n_kernel_events(self) -> int:
        return sum(c[5].size for c in self.kernel_chunks)

    # -- tables --------------------------------------------------------------------------
    def to_ns(self, ranks: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Engine times of ``ranks`` → int64 timestamps on each host's own clock."""
        return (t + self.clock_offset_ns[ranks]).astype(np.int64) + np.int64(self.epoch_ns)

    def _keep(self, start: np.ndarray) -> np.ndarray | slice:
        finite = np.isfinite(start)
        return slice(None) if finite.all() else finite

    def _times(self, ranks: np.ndarray, start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Keep rows that started; offset starts; unfinished durations become -1."""
        keep = self._keep(start)
        ranks = ranks[keep]
        return (ranks, *self.intervals(ranks, start[keep], dur[keep]))

    def intervals(self, ranks: np.ndarray, start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(start_ns, dur_ns)`` of started intervals; the duration comes from the rounded end,
        so a child that ends with its parent ends at the same nanosecond (exact nesting)."""
        start_ns = self.to_ns(ranks, start)
        finite = np.isfinite(dur)
        end_ns = self.to_ns(ranks, start + np.where(finite, dur, 0.0))
        return start_ns, np.where(finite, end_ns - start_ns, -1)

    def steps_table(self) -> pa.Table:
        ranks = np.flatnonzero(np.isfinite(self.step_start))
        start = self.to_ns(ranks, self.step_start[ranks])
        end_t = self.step_end[ranks]
        end = np.where(np.isfinite(end_t), self.to_ns(ranks, np.nan_to_num(end_t, posinf=0.0)), -1)
        return pa.table({"rank": pa.array(ranks, pa.int32()), "step": pa.array(np.full(len(ranks), self.step)),
                         "start_ns": start, "end_ns": end})

    def phases_table(self) -> pa.Table:
        if not self.phase_chunks:
            return _empty("phases")
        sizes = [len(c[0]) for c in self.phase_chunks]
        ranks = np.concatenate([c[0] for c in self.phase_chunks])
        mb = np.repeat([c[1] for c in self.phase_chunks], sizes)
        name = np.repeat([c[2] for c in self.phase_chunks], sizes)
        cat = np.repeat([c[3] for c in self.phase_chunks], sizes)
        grp = np.repeat([c[4] for c in self.phase_chunks], sizes)
        start = np.concatenate([c[5] for c in self.phase_chunks])
        dur = np.concatenate([c[6] for c in self.phase_chunks])
        keep = self._keep(start)
        ranks, start_ns, dur_ns = self._times(ranks, start, dur)
        return pa.table({
            "rank": pa.array(ranks, pa.int32()),
            "step": pa.array(np.full(len(ranks), self.step, np.int64)),
            "microbatch": pa.array(mb[keep], pa.int32()),
            "name": _strings(name[keep], self.names),
            "category": _strings(cat[keep], self.names),
            "group_kind": _strings(grp[keep], self.names),
            "start_ns": start_ns,
            "dur_ns": dur_ns,
        })

    def kernel_arrays(self) -> dict[str, np.ndarray]:
        """Flat kernel columns (name as interned id) for consumers that avoid strings."""
        if not self.kernel_chunks:
            return {k: np.empty(0, np.int64) for k in ("rank", "device", "stream", "name_id", "kind_id", "start", "dur")}
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "device", "stream", "name_id", "kind_id", "start", "dur")}
        for ranks, device, stream, name_ids, kind_id, start, dur in self.kernel_chunks:
            c, k = start.shape
            parts["rank"].append(np.repeat(ranks, k))
            parts["device"].append(np.repeat(device, k))
            parts["stream"].append(np.full(c * k, stream, np.int32))
            parts["name_id"].append(np.tile(name_ids, c))
            parts["kind_id"].append(np.full(c * k, kind_id, np.int32))
            parts["start"].append(start.ravel())
            parts["dur"].append(dur.ravel())
        return {k: np.concatenate(v) for k, v in parts.items()}

    def kernels_table(self) -> pa.Table:
        if not self.kernel_chunks:
            return _empty("kernels")
        a = self.kernel_arrays()
        keep = self._keep(a["start"])
        ranks, start_ns, dur_ns = self._times(a["rank"], a["start"], a["dur"])
        return pa.table({
            "rank": pa.array(ranks, pa.int32()),
            "step": pa.array(np.full(len(ranks), self.step, np.int64)),
            "kind": _strings(a["kind_id"][keep], self.names),
            "device": pa.array(a["device"][keep], pa.int32()),
            "stream": pa.array(a["stream"][keep], pa.int32()),
            "name": _strings(a["name_id"][keep], self.names),
            "start_ns": start_ns,
            "dur_ns": dur_ns,
        })


def _empty(table: str) -> pa.Table:
    from argus.store.schema import TABLES

    return TABLES[table].schema.empty_table()
