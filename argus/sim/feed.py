"""Simulated steps as the per-rank record batches a producer would send to its processor.

Used by the processor's tests and benchmarks: a simulated job streamed through real
sockets. Names keep the engine's ids (each client's interner is pre-filled in engine
order), so packing needs no string work.
"""

from __future__ import annotations

import numpy as np

from argus.wire.client import Interner
from argus.wire.protocol import CATEGORIES, DTYPES, GROUP_KINDS, KINDS, Msg
from argus.sim.records import NameTable, StepRecords

__all__ = ["engine_interner", "step_batches"]


def engine_interner(names: NameTable) -> Interner:
    """An interner whose ids equal the engine's name ids (all names still to be sent)."""
    it = Interner()
    for name in names.names:
        it.id(name)
    return it


def _code_table(names: NameTable, vocabulary: tuple[str, ...]) -> np.ndarray:
    out = np.zeros(len(names.names) + 1, np.uint8)
    for code, word in enumerate(vocabulary):
        if word in names._ids:
            out[names.id(word)] = code
    return out


def step_batches(rec: StepRecords) -> dict[int, dict[Msg, np.ndarray]]:
    """``{rank: {Msg.STEPS: …, Msg.PHASES: …, Msg.KERNELS: …}}`` for one simulated step."""
    names = rec.names
    cat_code = _code_table(names, CATEGORIES)
    grp_code = _code_table(names, GROUP_KINDS)
    kind_code = _code_table(names, KINDS)
    out: dict[int, dict[Msg, np.ndarray]] = {}

    ranks = np.flatnonzero(np.isfinite(rec.step_start))
    steps = np.zeros(len(ranks), DTYPES[Msg.STEPS])
    steps["step"] = rec.step
    steps["start_ns"] = rec.to_ns(ranks, rec.step_start[ranks])
    end = rec.step_end[ranks]
    steps["end_ns"] = np.where(np.isfinite(end), rec.to_ns(ranks, np.nan_to_num(end, posinf=0.0)), -1)
    _scatter(out, Msg.STEPS, ranks, steps)

    if rec.phase_chunks:
        sizes = [len(c[0]) for c in rec.phase_chunks]
        r = np.concatenate([c[0] for c in rec.phase_chunks])
        start = np.concatenate([c[5] for c in rec.phase_chunks])
        dur = np.concatenate([c[6] for c in rec.phase_chunks])
        keep = np.isfinite(start)
        ph = np.zeros(int(keep.sum()), DTYPES[Msg.PHASES])
        ph["step"] = rec.step
        ph["start_ns"], ph["dur_ns"] = rec.intervals(r[keep], start[keep], dur[keep])
        ph["microbatch"] = np.repeat([c[1] for c in rec.phase_chunks], sizes)[keep]
        ph["name"] = np.repeat([c[2] for c in rec.phase_chunks], sizes)[keep]
        ph["category"] = cat_code[np.repeat([c[3] for c in rec.phase_chunks], sizes)[keep]]
        ph["group_kind"] = grp_code[np.repeat([c[4] for c in rec.phase_chunks], sizes)[keep]]
        ph["wait_ns"] = -1  # the simulator models waiting by nested comm phases
        _scatter(out, Msg.PHASES, r[keep], ph)

    if rec.kernel_chunks:
        a = rec.kernel_arrays()
        keep = np.isfinite(a["start"])
        k = np.zeros(int(keep.sum()), DTYPES[Msg.KERNELS])
        k["step"] = rec.step
        k["start_ns"], k["dur_ns"] = rec.intervals(a["rank"][keep], a["start"][keep], a["dur"][keep])
        k["name"] = a["name_id"][keep]
        k["stream"] = a["stream"][keep]
        k["device"] = a["device"][keep]
        k["kind"] = kind_code[a["kind_id"][keep]]
        _scatter(out, Msg.KERNELS, a["rank"][keep], k)
    return out


def _scatter(out: dict, msg: Msg, ranks: np.ndarray, records: np.ndarray) -> None:
    order = np.argsort(ranks, kind="stable")
    ranks, records = ranks[order], records[order]
    bounds = np.flatnonzero(np.diff(ranks)) + 1
    for part_ranks, part in zip(np.split(ranks, bounds), np.split(records, bounds)):
        if len(part):
            out.setdefault(int(part_ranks[0]), {})[msg] = part
