"""NCCL-format Flight Recorder dumps of a 16-rank Megatron-style MoE job in which one rank dies,
written here from the documented schema (format 2.x: ``pg_config`` with ``desc`` and ``ranks``,
``entries`` with ``process_group``, ``collective_seq_id``, ``state``) — no code shared with Argus.

Layout: tp=2, ep=4, pp=4 over 16 ranks. Groups (name → desc):

* ``TENSOR_MODEL_PARALLEL_GROUP``: {0,1}, {2,3}, …, {14,15}
* ``EXPERT_MODEL_PARALLEL_GROUP``: {0–3}, {4–7}, {8–11}, {12–15} (all_to_all, unequal splits)
* ``EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP``: the same four sets (``_all_gather_base``)
* ``PIPELINE_MODEL_PARALLEL_GROUP``: {0,4,8,12}, {1,5,9,13}, {2,6,10,14}, {3,7,11,15}

Every group ran ``HISTORY`` collectives to completion. Then ``dead`` never joins its expert-tensor
group's ``_all_gather_base``; its group mates issued it and wait. Everything else is blocked behind
that: each waiting rank's tensor-parallel all-reduce, pipeline all-reduces, every expert
group's all_to_all (per-rank split sizes that differ by design) — issued by every member and
completed by none (NCCL runs a rank's collectives in order)."""

from __future__ import annotations

import pickle
from pathlib import Path

WORLD = 16
HISTORY = 5
GROUPS: dict[str, tuple[str, list[list[int]]]] = {
    "tp": ("TENSOR_MODEL_PARALLEL_GROUP", [[2 * i, 2 * i + 1] for i in range(8)]),
    "ep": ("EXPERT_MODEL_PARALLEL_GROUP", [list(range(4 * i, 4 * i + 4)) for i in range(4)]),
    "etmp": ("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", [list(range(4 * i, 4 * i + 4)) for i in range(4)]),
    "pp": ("PIPELINE_MODEL_PARALLEL_GROUP", [[j, j + 4, j + 8, j + 12] for j in range(4)]),
}
OPS = {"tp": "nccl:all_reduce", "ep": "nccl:all_to_all", "etmp": "nccl:_all_gather_base", "pp": "nccl:all_reduce"}


def _name(kind: str, i: int) -> str:
    return str(1 + list(GROUPS).index(kind) * 8 + i)


def _groups_of(rank: int) -> list[tuple[str, str, list[int]]]:
    return [(kind, _name(kind, i), ranks) for kind, (_, sets) in GROUPS.items() for i, ranks in enumerate(sets)
            if rank in ranks]


def _entry(rid: int, kind: str, name: str, seq: int, state: str, rank: int) -> dict:
    op = OPS[kind]
    if kind == "ep":  # tokens routed to each expert: split sizes differ per rank and per step
        shape = [[64 + 8 * ((rank * 7 + seq * 3) % 5), 1024]]
    elif kind == "etmp":
        shape = [[256, 1024]]
    else:
        shape = [[4096]]
    return {"record_id": rid, "pg_id": int(name), "process_group": (name, GROUPS[kind][0]),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": op,
            "time_created_ns": 1_000_000 * rid, "input_sizes": shape, "input_dtypes": ["BFloat16"],
            "output_sizes": shape, "output_dtypes": ["BFloat16"], "state": state,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": False,
            "timeout_ms": 600_000, "is_p2p": False,
            "frames": [{"name": f"{kind}_step", "filename": "/job/megatron/model.py", "line": 100 + rid % 7}]}


def dump_of(rank: int, dead: int) -> dict:
    """Rank ``rank``'s dump when ``dead`` never joins its expert-tensor group's collective."""
    entries: list[dict] = []
    mine = _groups_of(rank)
    for seq in range(1, HISTORY + 1):
        for kind, name, _ in mine:
            entries.append(_entry(len(entries), kind, name, seq, "completed", rank))
    if rank != dead:
        stuck_with_dead = any(kind == "etmp" and dead in ranks for kind, _, ranks in mine)
        # the dead rank's expert-tensor mates wait in its _allgather_base, the rest of the job in
        # the collectives behind (an expert all_to_all, a pipeline or tensor-parallel all-reduce)
        order = ["etmp", "tp", "ep", "pp"] if stuck_with_dead else ["ep", "tp", "pp"]
        for i, kind in enumerate(order):
            name = next(n for k, n, _ in mine if k == kind)
            entries.append(_entry(len(entries), kind, name, HISTORY + 1, "started" if i == 0 else "scheduled", rank))
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(WORLD)))}}
    for kind, (desc, sets) in GROUPS.items():
        for i, ranks in enumerate(sets):
            pg_config[_name(kind, i)] = {"name": _name(kind, i), "desc": desc, "ranks": str(ranks)}
    return {"version": "2.9", "nccl_version": "2.27.3", "pg_config": pg_config, "entries": entries}


def write(out: Path, dead: int = 12, without: tuple[int, ...] = ()) -> Path:
    """The dump set, one ``nccl_trace_rank_N`` per rank (none for the ranks in ``without``)."""
    out.mkdir(parents=True)
    for rank in range(WORLD):
        if rank not in without:
            (out / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump_of(rank, dead)))
    return out
