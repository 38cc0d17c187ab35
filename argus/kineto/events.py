"""Per-event fields collected from one trace, and their assembly into per-rank arrays.

The reader's scan loop only appends numbers to typed arrays (:class:`Collected`); everything
that needs the whole trace — timestamps to ns, which profiler step each record belongs to,
pairing GPU annotation spans with their CPU ranges, finding a collective's process group —
happens here, vectorised with numpy where the data is big (kernels) and in plain loops over
annotations, which are few (tens to thousands per rank).
"""

from __future__ import annotations

import bisect
import json
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.kineto.limits import MAX_INT32, MAX_NAME_CHARS, MAX_WORLD_SIZE, Rejects, as_world_size
from argus.kineto.names import phase_name

__all__ = ["StepArrays", "PhaseArrays", "KernelArrays", "Collected", "StepIndex", "ns", "build_steps",
           "build_kernels", "build_phases", "process_groups", "group_descriptions", "RPC_GROUP_KEYS",
           "kernel_group_key"]

_EMPTY: dict[str, Any] = {}
_BIG = np.iinfo(np.int64).max


@dataclass
class StepArrays:
    step: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    end_ns: np.ndarray  # int64, -1 = never finished


@dataclass
class PhaseArrays:
    name: np.ndarray  # object (str)
    category: np.ndarray  # object (str)
    group_kind: np.ndarray  # object (str); empty when unknown
    group_ref: np.ndarray  # int32 index into ``RankTrace.groups`` (the collective's ranks), -1 none
    microbatch: np.ndarray  # int32
    step: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64, -1 = never finished
    on_gpu: np.ndarray | None = None  # bool: timed on the device (a GPU annotation), else on the host

    def __len__(self) -> int:
        return len(self.start_ns)

    def host_waits(self) -> np.ndarray:
        """``wait_ns`` per phase: for host-timed work, the host-timed collectives inside it (what
        blocked the host thread); -1 for the rest (the analysis then subtracts nested comm). A
        device-timed collective overlapping a host-timed phase did not block it — NCCL launches
        return at once — and must not be taken off the host's work (on a real DDP trace the
        backward's all-reduces run on the device during the next forward: its peers' forwards
        looked 30 ms shorter than the one a 30 ms host stall had moved them out of)."""
        out = np.full(len(self), -1, np.int64)
        if self.on_gpu is None or not len(self):
            return out
        comm = (self.category == "comm") & ~self.on_gpu & (self.dur_ns > 0)
        work = (self.category != "comm") & ~self.on_gpu & (self.dur_ns >= 0)
        if not work.any():
            return out
        c = np.flatnonzero(comm)
        order = c[np.argsort(self.start_ns[c], kind="stable")]
        starts = self.start_ns[order]
        cum = np.concatenate([[0], np.cumsum(self.dur_ns[order])])
        w = np.flatnonzero(work)
        lo = np.searchsorted(starts, self.start_ns[w], side="left")
        hi = np.searchsorted(starts, self.start_ns[w] + self.dur_ns[w], side="left")
        out[w] = np.minimum(cum[hi] - cum[lo], self.dur_ns[w])
        return out


@dataclass
class KernelArrays:
    kind: np.ndarray  # int8 code into ``format.KIND_NAMES``
    device: np.ndarray  # int32
    stream: np.ndarray  # int32
    name_id: np.ndarray  # int32 index into ``names``
    names: list[str]
    step: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    #: int32 index into the trace's ``groups`` for a collective's kernel whose args name its
    #: process group (NCCL kernels of recent PyTorch), else -1
    group_ref: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    #: member ranks → the ``Process Group Description`` the kernels' args gave
    group_descs: dict[tuple[int, ...], str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.start_ns)


class Collected:
    """Per-event fields, appended in the scan loop (typed arrays; names interned)."""

    def __init__(self) -> None:
        self.n = 0
        self.k_kind, self.k_name = array("b"), array("i")
        self.k_dev, self.k_stream, self.k_corr = array("q"), array("q"), array("q")
        self.k_ts, self.k_dur = array("d"), array("d")
        self.k_names: dict[str, int] = {}
        # a kernel's process-group args (``RPC_GROUP_KEYS`` and the description), interned: -1 none
        self.k_group = array("i")
        self.k_groups: dict[tuple, int] = {}
        # External id → the group of a collective kernel launched under it: names the group of a
        # collective's annotation that no ``record_param_comms`` op encloses (Megatron-style traces)
        self.k_ext_group: dict[int, int] = {}
        self.rt_corr, self.rt_ts = array("q"), array("d")
        self.steps: list[tuple[int, float, float, bool]] = []
        # (name, ts, dur, external id, tid, on_gpu, argus metadata or None)
        self.ann: list[tuple[str, float, float, int, Any, bool, dict | None]] = []
        # annotations an older schema wrote as CPU ops (``Operator``): the same tuples, used
        # where no annotation of that name and start exists (``merge_op_annotations``)
        self.op_ann: list[tuple[str, float, float, int, Any, bool, dict | None]] = []
        # record_param_comms: (ts, dur, tid, the args that name its group)
        self.rpc: list[tuple[float, float, Any, dict]] = []
        self.strings: dict[str, str] = {}  # annotation names and group strings, one copy each
        self.rejects = Rejects()  # events left out for a bad value

    def merge_op_annotations(self) -> None:
        """Older Kineto schemas put ``record_function`` ranges among the CPU ops: they are
        annotations all the same (newer traces carry both kinds; a range seen as both counts once)."""
        if self.op_ann:
            seen = {(a[0], a[1]) for a in self.ann if not a[5]}
            self.ann += [a for a in self.op_ann if (a[0], a[1]) not in seen]
            self.op_ann = []

    def time_range(self) -> tuple[float, float] | None:
        """First start and last end (µs) over the events kept, or None when there are none."""
        starts = [np.frombuffer(self.k_ts, np.float64), np.frombuffer(self.rt_ts, np.float64),
                  np.asarray([a[1] for a in self.ann], np.float64)]
        ends = [starts[0] + np.frombuffer(self.k_dur, np.float64), starts[1],
                starts[2] + np.asarray([a[2] for a in self.ann], np.float64)]
        if not any(a.size for a in starts):
            return None
        return (float(min(a.min() for a in starts if a.size)), float(max(a.max() for a in ends if a.size)))


def ns(us: Any) -> np.ndarray:
    """µs (int or float) → int64 ns, ``round(ts * 1000)`` without losing the integer part to
    float rounding (absolute µs timestamps × 1000 exceed float64's exact range)."""
    a = np.asarray(us, dtype=np.float64)
    whole = np.floor(a)
    return whole.astype(np.int64) * 1000 + np.rint((a - whole) * 1000).astype(np.int64)


class StepIndex:
    """Which profiler step a timestamp falls in: ``start <= t < end`` (HTA's rule)."""

    def __init__(self, steps: StepArrays):
        order = np.argsort(steps.start_ns, kind="stable")
        self.starts = steps.start_ns[order]
        ends = steps.end_ns[order]
        self.ends = np.where(ends < 0, _BIG, ends)
        self.numbers = steps.step[order]

    def of(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.int64)
        if not len(self.starts) or not t.size:
            return np.full(t.shape, -1, np.int64)
        idx = np.searchsorted(self.starts, t, side="right") - 1
        safe = np.clip(idx, 0, None)
        inside = (idx >= 0) & (t < self.ends[safe])
        return np.where(inside, self.numbers[safe], -1)


def build_steps(c: Collected, base_ns: int, notes: list[str]) -> StepArrays:
    """Steps from ``ProfilerStep#N`` CPU spans; without any, the whole trace is step 0."""
    if not c.steps:
        span = c.time_range()
        if span is None:
            return StepArrays(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        notes.append("no ProfilerStep#N annotations (profiler.step() not called?): the whole trace is step 0")
        lo, hi = ns(span) + base_ns
        return StepArrays(np.array([0], np.int64), np.array([lo]), np.array([hi + 1]))
    by_step: dict[int, list] = {}
    for n, ts, dur, unfinished in c.steps:  # one row per step, even if several threads annotate it
        s, e = int(ns([ts])[0]), int(ns([ts])[0] + ns([dur])[0])
        cur = by_step.get(n)
        by_step[n] = [s, -1 if unfinished else e] if cur is None else [
            min(cur[0], s), -1 if (unfinished or cur[1] < 0) else max(cur[1], e)]
    numbers = np.array(sorted(by_step), np.int64)
    start = np.array([by_step[n][0] for n in numbers], np.int64) + base_ns
    end = np.array([by_step[n][1] for n in numbers], np.int64)
    end = np.where(end < 0, -1, end + base_ns)
    return StepArrays(numbers, start, end)


#: The kernel args that name its process group (NCCL kernels): the group keys and its description.
KERNEL_GROUP_KEYS = (*("Process Group Ranks", "Process Group Name", "Global rank start", "Global rank stride",
                       "Group size"), "Process Group Description")


def kernel_group_key(args: dict) -> tuple | None:
    """What names a device kernel's process group, hashable; None for a kernel without one."""
    if "Process Group Ranks" not in args and "Process Group Name" not in args:
        return None
    key = tuple(args.get(k) for k in KERNEL_GROUP_KEYS)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def build_kernels(c: Collected, base_ns: int, index: StepIndex, dropped: dict[str, int],
                  pgs: dict[str, tuple[int, ...]] | None = None,
                  groups: list[tuple[int, ...]] | None = None) -> KernelArrays:
    """Device records with the step of their launch (``correlation`` → ``cuda_runtime`` event);
    a collective's kernel with its group's members in ``groups`` (``group_ref``)."""
    start = ns(np.frombuffer(c.k_ts, np.float64)) + base_ns
    dur = np.rint(np.frombuffer(c.k_dur, np.float64) * 1000).astype(np.int64)
    corr = np.frombuffer(c.k_corr, np.int64)
    # The step of a kernel is the step its launch happened in: GPUs run behind the CPU.
    anchor = start.copy()
    if len(c.rt_corr) and corr.size:
        rt_corr = np.frombuffer(c.rt_corr, np.int64)
        order = np.argsort(rt_corr, kind="stable")
        rt_sorted = rt_corr[order]
        rt_ts = ns(np.frombuffer(c.rt_ts, np.float64)[order]) + base_ns
        pos = np.clip(np.searchsorted(rt_sorted, corr), 0, len(rt_sorted) - 1)
        found = (corr >= 0) & (rt_sorted[pos] == corr)
        anchor = np.where(found, rt_ts[pos], start)
    step = index.of(anchor)
    fallback = step < 0
    if fallback.any():  # launched outside every step (e.g. during warm-up): its own time decides
        step[fallback] = index.of(start[fallback])
    keep = step >= 0
    if not keep.all():
        dropped["kernels"] = int((~keep).sum())
    names = [""] * len(c.k_names)
    for name, i in c.k_names.items():
        names[i] = name
    group_ref = np.full(int(keep.sum()), -1, np.int32)
    descs: dict[tuple[int, ...], str] = {}
    if c.k_groups and groups is not None and len(c.k_group) == len(keep):
        cache = _GroupCache(pgs or {}, groups)
        lut = np.full(len(c.k_groups) + 1, -1, np.int32)
        for key, i in c.k_groups.items():
            args = dict(zip(KERNEL_GROUP_KEYS, key))
            members = cache.ranks(args)
            if members:
                lut[i] = cache.ref(members)
                desc = args.get("Process Group Description")
                if type(desc) is str and 0 < len(desc) <= 128:
                    descs.setdefault(members, desc)
        group_ref = lut[np.frombuffer(c.k_group, np.int32)[keep]]
    return KernelArrays(
        kind=np.frombuffer(c.k_kind, np.int8)[keep].copy(),
        device=np.frombuffer(c.k_dev, np.int64)[keep].astype(np.int32),
        stream=np.frombuffer(c.k_stream, np.int64)[keep].astype(np.int32),
        name_id=np.frombuffer(c.k_name, np.int32)[keep].copy(),
        names=names, step=step[keep], start_ns=start[keep], dur_ns=dur[keep], group_ref=group_ref,
        group_descs=descs)


def _parse_ranks(value: Any) -> tuple[int, ...] | None:
    """A list of ranks (or its JSON text): ints in ``[0, MAX_WORLD_SIZE)``, at most that many."""
    if isinstance(value, str):
        if len(value) > 16 * MAX_WORLD_SIZE:  # longer than the list of every possible rank
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if (isinstance(value, (list, tuple)) and len(value) <= MAX_WORLD_SIZE
            and all(type(v) is int and 0 <= v < MAX_WORLD_SIZE for v in value)):
        return tuple(sorted(value))
    return None


def group_descriptions(dist: dict) -> dict[tuple[int, ...], str]:
    """``distributedInfo.pg_config`` → member ranks → ``pg_desc`` (Megatron names its groups
    there: ``TENSOR_MODEL_PARALLEL_GROUP``, ``MODEL_PARALLEL_GROUP`` …), where given."""
    cfg = dist.get("pg_config")
    entries = cfg.values() if isinstance(cfg, dict) else cfg if isinstance(cfg, list) else []
    out: dict[tuple[int, ...], str] = {}
    for e in entries:
        if isinstance(e, dict) and type(e.get("pg_desc")) is str and len(e["pg_desc"]) <= 128:
            ranks = _parse_ranks(e.get("ranks"))
            if ranks:
                out.setdefault(ranks, e["pg_desc"])
    return out


def process_groups(dist: dict) -> dict[str, tuple[int, ...]]:
    """``distributedInfo.pg_config`` → pg name → member ranks (``[]`` with the world's size = all)."""
    cfg = dist.get("pg_config")
    entries = cfg.values() if isinstance(cfg, dict) else cfg if isinstance(cfg, list) else []
    world = as_world_size(dist.get("world_size"))
    everyone = tuple(range(world)) if world is not None else ()  # one tuple, however many groups say "all"
    out: dict[str, tuple[int, ...]] = {}
    for e in entries:
        if not isinstance(e, dict):
            continue
        ranks = _parse_ranks(e.get("ranks"))
        if not ranks and world is not None and type(e.get("pg_size")) is int and e.get("pg_size") == world:
            ranks = everyone
        if ranks:
            out[str(e.get("pg_name", len(out)))] = ranks
    return out


class _GroupCache:
    """Member tuples by what described them, and group refs by tuple identity: a group of up
    to a million ranks is parsed and hashed once, not once per collective."""

    def __init__(self, pgs: dict[str, tuple[int, ...]], groups: list[tuple[int, ...]]):
        self.pgs = pgs
        self.groups = groups
        self._ranks: dict[Any, tuple[int, ...] | None] = {}
        self._refs: dict[int, int] = {}
        self._by_value = {g: i for i, g in enumerate(groups)}

    def ranks(self, args: dict) -> tuple[int, ...] | None:
        key = tuple(args.get(k) for k in RPC_GROUP_KEYS)
        try:
            return self._ranks[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable value: no group from it
            return None
        found = self._ranks[key] = _rpc_ranks(args, self.pgs)
        return found

    def ref(self, ranks: tuple[int, ...]) -> int:
        ref = self._refs.get(id(ranks))
        if ref is None:
            ref = self._by_value.get(ranks)
            if ref is None:
                ref = self._by_value[ranks] = len(self.groups)
                self.groups.append(ranks)
            self._refs[id(ranks)] = ref  # the tuple stays alive in ``_ranks`` or ``pgs``
        return ref


#: The ``record_param_comms`` args that say which ranks a collective ran among (all the reader keeps).
RPC_GROUP_KEYS = ("Process Group Ranks", "Process Group Name", "Global rank start", "Global rank stride",
                  "Group size")


def _rpc_ranks(args: dict, pgs: dict[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    """Members of the group a ``record_param_comms`` event ran in."""
    ranks = _parse_ranks(args.get("Process Group Ranks"))
    if ranks:
        return ranks
    name = args.get("Process Group Name")
    if type(name) in (str, int) and str(name) in pgs:
        return pgs[str(name)]
    start, stride, size = args.get("Global rank start"), args.get("Global rank stride"), args.get("Group size")
    if (type(start) is int and type(stride) is int and type(size) is int and start >= 0 and stride > 0 and size > 0
            and start + stride * (size - 1) < MAX_WORLD_SIZE):
        return tuple(range(start, start + stride * size, stride))
    return None


def build_phases(c: Collected, base_ns: int, index: StepIndex, pgs: dict[str, tuple[int, ...]],
                 groups: list[tuple[int, ...]], dropped: dict[str, int]) -> PhaseArrays:
    """Phases from annotations: GPU spans preferred, each in the step its (CPU) start falls in;
    a collective's member ranks go to ``groups`` (``group_ref``) for the importer to name."""
    ann = c.ann
    n = len(ann)
    start = ns([a[1] for a in ann]) + base_ns if n else np.zeros(0, np.int64)
    dur = np.rint(np.asarray([a[2] for a in ann], np.float64) * 1000).astype(np.int64) if n else start.copy()
    on_gpu = np.fromiter((a[5] for a in ann), bool, n)
    # A record_function range measured on the GPU carries the External id of its CPU range: the
    # GPU span replaces the CPU one (device time), the CPU one still decides the step and group.
    cpu_of: dict[tuple[str, int], int] = {(a[0], a[3]): i for i, a in enumerate(ann) if not a[5] and a[3] >= 0}
    twin = np.full(n, -1, np.int64)
    replaced = np.zeros(n, bool)
    gpu_only_names: set[str] = set()
    for j in np.flatnonzero(on_gpu):
        a = ann[j]
        cpu_i = cpu_of.get((a[0], a[3])) if a[3] >= 0 else None
        if cpu_i is None:
            gpu_only_names.add(a[0])
        else:
            twin[j] = cpu_i
            replaced[cpu_i] = True
    keep = on_gpu | ~replaced
    if gpu_only_names:  # no ids to pair by: prefer the GPU spans of that name wholesale
        keep &= on_gpu | ~np.fromiter((a[0] in gpu_only_names for a in ann), bool, n)
    anchor_idx = np.where(twin >= 0, twin, np.arange(n))
    step = index.of(start[anchor_idx]) if n else np.zeros(0, np.int64)
    outside = keep & (step < 0)
    if outside.any():
        dropped["phases"] = int(outside.sum())
    keep &= step >= 0

    rows = np.flatnonzero(keep)
    names, cats, kinds, mbs, unfinished = [], [], [], [], []
    group_ref = np.full(len(rows), -1, np.int32)
    rpc_sorted = sorted(c.rpc, key=lambda r: r[0])
    rpc_starts = [r[0] for r in rpc_sorted]
    cache = _GroupCache(pgs, groups)
    single_pg = next(iter(pgs.values())) if len(pgs) == 1 else None
    kernel_groups = {gid: key for key, gid in c.k_groups.items()}
    for out_i, i in enumerate(rows):
        a = ann[i]
        info = phase_name(a[0])
        meta = a[6] or (ann[twin[i]][6] if twin[i] >= 0 else None) or _EMPTY
        names.append(_text(meta.get("name"), info.name))
        cat = _text(meta.get("category"), info.category)
        cats.append(cat)
        kinds.append(_text(meta.get("group_kind"), info.group_kind))
        mb = meta.get("microbatch", info.microbatch)
        mbs.append(mb if type(mb) is int and 0 <= mb <= MAX_INT32 else -1)
        unfinished.append(meta.get("unfinished") is True)
        if cat != "comm" or kinds[-1] or "group_kind" in meta:
            continue
        anchor = ann[anchor_idx[i]]
        ranks = (_collective_ranks(anchor, rpc_sorted, rpc_starts, cache) or _kernel_ranks(anchor, c, kernel_groups, cache)
                 or single_pg)
        if ranks:
            group_ref[out_i] = cache.ref(ranks)
    return PhaseArrays(
        name=np.array(names, dtype=object), category=np.array(cats, dtype=object),
        group_kind=np.array(kinds, dtype=object), group_ref=group_ref,
        microbatch=np.array(mbs, np.int32), step=step[rows].astype(np.int64), start_ns=start[rows],
        dur_ns=np.where(np.array(unfinished, bool), -1, dur[rows]), on_gpu=on_gpu[rows])


def _text(value: Any, default: str) -> str:
    """A string field of Argus' own metadata; anything else (or an absurdly long one) → ``default``."""
    return value if type(value) is str and len(value) <= MAX_NAME_CHARS else default


def _kernel_ranks(ann: tuple, c: Collected, kernel_groups: dict[int, tuple],
                  cache: _GroupCache) -> tuple[int, ...] | None:
    """The group of the collective kernel launched under the annotation's ``External id``
    (``kernel_groups``: the interned kernel groups by id)."""
    gid = c.k_ext_group.get(ann[3]) if ann[3] >= 0 else None
    if gid is None:
        return None
    key = kernel_groups.get(gid)
    return cache.ranks(dict(zip(KERNEL_GROUP_KEYS, key))) if key is not None else None


def _collective_ranks(ann: tuple, rpc: list[tuple], rpc_starts: list[float],
                      cache: _GroupCache) -> tuple[int, ...] | None:
    """The ``record_param_comms`` op around (or inside) a collective's annotation, on its thread."""
    ts, dur, tid = ann[1], ann[2], ann[4]
    i = bisect.bisect_right(rpc_starts, ts) - 1
    candidates = []
    if i >= 0 and rpc[i][0] + rpc[i][1] >= ts:
        candidates.append(rpc[i])  # parent: PyTorch wraps ``nccl:all_reduce`` in record_param_comms
    if i + 1 < len(rpc) and rpc[i + 1][0] <= ts + dur:
        candidates.append(rpc[i + 1])  # child
    for r in candidates:
        if r[2] == tid:
            ranks = cache.ranks(r[3])
            if ranks:
                return ranks
    return None
