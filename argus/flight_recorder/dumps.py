"""Per-rank Flight Recorder dumps as typed records.

PyTorch's process groups keep a ring of their recent collectives (the Flight Recorder: on by
default for NCCL, ``TORCH_FR_BUFFER_SIZE`` for gloo) and write it per rank on a watchdog timeout
to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank, or on request (``_dump_fr_trace``). A dump is a
dict: ``version`` ("2.0" … "2.10" so far), ``pg_config`` (group name → description and ranks; gloo
stores one entry under an empty name), ``pg_status`` (per group: the last collective enqueued,
started and completed, from 2.2) and ``entries``, each with its group, its sequence number in that
group, the op, sizes, dtypes, state, times and the Python stack that issued it. Fields are read
by name with defaults, so the versions in between read alike; a file that is not a dict with
``entries`` is not a dump.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argus.flight_recorder.plain import FlightRecorderError, load_plain

__all__ = ["Frame", "Entry", "GroupStatus", "RankDump", "DumpSet", "read_dump", "read_dumps"]


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.name} ({self.filename}:{self.line})"


#: Collectives whose members pass tensors of one shape (by their profiling names, backend prefix
#: dropped): their shapes are compared member to member, no other op's are.
EQUAL_SHAPES = frozenset({"all_reduce", "allreduce", "allreduce_coalesced", "all_reduce_coalesced", "broadcast",
                          "_broadcast_oop", "reduce", "_reduce_oop", "_all_gather_base", "_allgather_base",
                          "all_gather_single", "all_gather_into_tensor", "allgather_into_tensor_coalesced",
                          "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_tensor",
                          "reduce_scatter_tensor_coalesced", "barrier", "all_reduce_barrier"})


def equal_shapes(op: str) -> bool:
    """Whether every member of collective ``op`` ("nccl:all_reduce") passes the same shapes."""
    return op.rsplit(":", 1)[-1].strip().lower() in EQUAL_SHAPES


@dataclass(frozen=True)
class Entry:
    """One collective (or point-to-point op) as one rank recorded it."""

    record_id: int
    group: str  # the process group's name ("0" is the default group)
    group_desc: str  # e.g. "default_pg", "TENSOR_MODEL_PARALLEL_GROUP"
    seq: int  # its sequence number in the group (collectives and p2p count apart)
    is_p2p: bool
    op: str  # profiling name, e.g. "nccl:all_reduce"
    input_sizes: tuple
    input_dtypes: tuple[str, ...]
    output_sizes: tuple
    output_dtypes: tuple[str, ...]
    state: str  # "scheduled" | "started" | "completed"
    created_ns: int | None
    started_ns: int | None
    completed_ns: int | None
    retired: bool
    timeout_ms: int | None
    frames: tuple[Frame, ...]

    @property
    def signature(self) -> tuple:
        """What every member must agree on for the collective to match: the op and its dtypes;
        the shapes only where the collective needs them equal on every member — an all_to_all's
        per-rank split sizes, a gather's or scatter's lists (and an op not known here) differ by
        design (a real MoE job's all_to_all was "confirmed" a divergence for them)."""
        if equal_shapes(self.op):
            return self.op, self.input_sizes, self.input_dtypes, self.output_sizes, self.output_dtypes
        return (self.op, (), tuple(sorted(set(self.input_dtypes))), (),
                tuple(sorted(set(self.output_dtypes))))

    def where(self) -> str:
        """The innermost frame outside torch (frames run innermost first): the job's line that
        issued it."""
        for f in self.frames:
            if not _in_torch(f):
                return str(f)
        return str(self.frames[0]) if self.frames else ""

    def stack(self, limit: int = 16) -> tuple[str, ...]:
        """The job's frames that issued it, innermost first, at most ``limit`` (torch's own
        frames left out; all of them where there is nothing else)."""
        outside = [f for f in self.frames if not _in_torch(f)]
        return tuple(str(f) for f in (outside or list(self.frames))[:limit])


def _in_torch(f: Frame) -> bool:
    return f"{os.sep}torch{os.sep}" in f.filename


@dataclass(frozen=True)
class GroupStatus:
    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass
class RankDump:
    rank: int
    path: Path
    version: str
    group_desc: dict[str, str]  # group name → description (from pg_config and the entries)
    group_ranks: dict[str, tuple[int, ...]]  # group name → member ranks, where the dump says
    status: dict[str, GroupStatus]
    entries: list[Entry]

    def groups(self) -> set[str]:
        """Groups this rank belongs to, as far as its dump shows (gloo's pg_config names none)."""
        return set(self.status) | {e.group for e in self.entries} | {g for g, r in self.group_ranks.items()
                                                                       if self.rank in r}


@dataclass
class DumpSet:
    dumps: dict[int, RankDump]
    unreadable: dict[int, str] = field(default_factory=dict)  # rank → why (an empty file is evidence)
    world: int = 0  # ranks expected: given, or the highest seen + 1

    @property
    def missing(self) -> list[int]:
        """Ranks with no readable dump."""
        return [r for r in range(self.world) if r not in self.dumps]


def _int(v: Any, default: int | None = None) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _i(v: Any, default: int) -> int:
    got = _int(v)
    return default if got is None else got


def _sizes(v: Any) -> tuple:
    """A list of shapes ([[16, 4], [8]]) as nested tuples of plain values."""
    return tuple(_dim(x) for x in v) if isinstance(v, (list, tuple)) else ()


def _dim(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_dim(x) for x in v)
    return v if isinstance(v, (int, float, str)) or v is None else str(v)


def _ranks(v: Any) -> tuple[int, ...] | None:
    """pg_config's ranks: a list, or its repr as a string ("[0, 1]"); empty = not said."""
    if isinstance(v, str):
        try:
            v = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return None
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v):
        return tuple(sorted(v))
    return None


def _frames(v: Any) -> tuple[Frame, ...]:
    out = []
    for f in v if isinstance(v, list) else []:
        if isinstance(f, dict):
            out.append(Frame(str(f.get("name", "")), str(f.get("filename", "")), _i(f.get("line"), 0)))
    return tuple(out)


def _entry(e: dict) -> Entry:
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        group, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
    else:
        group, desc = str(e.get("pg_id", "")), ""
    p2p = bool(e.get("is_p2p", False))
    seq = e.get("p2p_seq_id" if p2p else "collective_seq_id", e.get("seq_id"))
    return Entry(
        record_id=_i(e.get("record_id"), -1), group=group, group_desc=desc, seq=_i(seq, -1),
        is_p2p=p2p, op=str(e.get("profiling_name", "")), input_sizes=_sizes(e.get("input_sizes", [])),
        input_dtypes=tuple(map(str, e.get("input_dtypes", []) or [])), output_sizes=_sizes(e.get("output_sizes", [])),
        output_dtypes=tuple(map(str, e.get("output_dtypes", []) or [])), state=str(e.get("state", "")),
        created_ns=_int(e.get("time_created_ns")), started_ns=_int(e.get("time_discovered_started_ns")),
        completed_ns=_int(e.get("time_discovered_completed_ns")), retired=bool(e.get("retired", False)),
        timeout_ms=_int(e.get("timeout_ms")), frames=_frames(e.get("frames")))


def read_dump(path: Path, rank: int) -> RankDump:
    """One rank's dump (pickle or JSON). Raises :class:`FlightRecorderError`."""
    d = load_plain(Path(path))
    if not isinstance(d, dict) or not isinstance(d.get("entries", []), list) or \
            not ("entries" in d or "pg_config" in d or "version" in d):
        raise FlightRecorderError(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    try:
        entries = [_entry(e) for e in d.get("entries", []) if isinstance(e, dict)]
    except (TypeError, AttributeError) as exc:
        raise FlightRecorderError(f"{path}: an entry is not what a dump holds ({exc})") from None
    desc: dict[str, str] = {}
    ranks: dict[str, tuple[int, ...]] = {}
    for name, cfg in (d.get("pg_config") or {}).items():
        if isinstance(cfg, dict) and str(name):
            desc[str(name)] = str(cfg.get("desc", ""))
            r = _ranks(cfg.get("ranks"))
            if r is not None:
                ranks[str(name)] = r
    for e in entries:
        desc.setdefault(e.group, e.group_desc)
    # pg_status is keyed by the process's own pg id (its n-th group), not the group's name: the
    # entries pair the two (rank 2's "2" is the group named "3" when it joined a group before)
    by_id = {str(e.get("pg_id")): str(e["process_group"][0]) for e in d.get("entries", [])
             if isinstance(e, dict) and isinstance(e.get("process_group"), (list, tuple)) and e["process_group"]}
    by_id.setdefault("0", "0")
    status = {}
    for key, st in (d.get("pg_status") or {}).items():
        if isinstance(st, dict) and str(key) in by_id:  # a group none of whose entries is left: unknown
            status[by_id[str(key)]] = GroupStatus(_i(st.get("last_enqueued_collective"), -1),
                                                  _i(st.get("last_started_collective"), -1),
                                                  _i(st.get("last_completed_collective"), -1))
    return RankDump(rank, Path(path), str(d.get("version", "")), desc, ranks, status, entries)


_RANK = re.compile(r"^(.*?)(\d+)(\.json)?$")


def read_dumps(paths: list[Path], prefix: str | None = None, world: int | None = None) -> DumpSet:
    """Every rank's dump among ``paths`` (files, or directories holding them): the rank is the
    number the file name ends with (``<prefix><rank>``, as torch names them). Files that cannot
    be read are kept as such — an empty file from a rank killed before it wrote is evidence."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file())
        elif p.exists():
            files.append(p)
        else:
            raise FlightRecorderError(f"{p}: no such file or directory")
    named: dict[int, Path] = {}
    prefixes: dict[str, int] = {}
    for f in files:
        m = _RANK.match(f.name)
        if not m or (prefix is not None and m.group(1) != prefix):
            continue
        prefixes[m.group(1)] = prefixes.get(m.group(1), 0) + 1
        named[int(m.group(2))] = f
    if prefix is None and len(prefixes) > 1:
        raise FlightRecorderError(f"files of {len(prefixes)} prefixes ({', '.join(sorted(prefixes)[:4])}): "
                                  f"say which with --prefix")
    if not named:
        raise FlightRecorderError(f"no dump files (named <prefix><rank>) in {', '.join(map(str, paths))}")
    out = DumpSet({}, world=0)
    for rank, f in sorted(named.items()):
        try:
            out.dumps[rank] = read_dump(f, rank)
        except FlightRecorderError as exc:
            if "refused" in str(exc):
                raise  # an object in a dump is an attack or a wrong file: never skip past it
            out.unreadable[rank] = str(exc)
    out.world = max(world or 0, max(named) + 1)
    for d in out.dumps.values():
        for r in d.group_ranks.values():
            out.world = max(out.world, max(r) + 1)
    return out
