"""Parallel layouts (tp, cp, ep, dp, pp), rank order, and the groups they induce.

Conventions (DESIGN.md §3): the five sizes multiply to the world size; with ``ep > 1``,
``dp`` is the data-parallel size *outside* the expert dimension. The rank order lists
axes from fastest- to slowest-varying; the default ``tp-cp-ep-dp-pp`` is Megatron-core's.

Group kinds (each rank is in exactly one group of each kind):

========  ======================  ==============================================
kind      varies axes             meaning
========  ======================  ==============================================
``tp``    tp                      tensor-parallel group
``cp``    cp                      context-parallel group
``ep``    ep                      expert-parallel group (MoE all-to-all)
``pp``    pp                      pipeline: one rank per stage, same other coords
``dp``    cp, ep, dp              dense-parameter data-parallel group; also the
                                  **peer set**: same stage and same TP shard
``edp``   dp                      expert-parameter data-parallel group
``world`` all                     every rank (global collectives, barriers)
========  ======================  ==============================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping

import numpy as np

from argus.errors import LayoutError
from argus.vocab import GroupKind  # re-exported: the kinds live in the shared vocabulary
from argus.uniques import sorted_unique

__all__ = ["AXES", "DEFAULT_ORDER", "GROUP_KINDS", "GroupKind", "Layout", "parse_layout", "parse_order"]

AXES: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
#: The axes each group kind varies (the table above, in its order).
GROUP_AXES: Mapping[str, tuple[str, ...]] = {
    GroupKind.TP: ("tp",),
    GroupKind.CP: ("cp",),
    GroupKind.EP: ("ep",),
    GroupKind.PP: ("pp",),
    GroupKind.DP: ("cp", "ep", "dp"),
    GroupKind.EDP: ("dp",),
    GroupKind.WORLD: AXES,
}
#: Every group kind (``GroupKind``'s order: the wire's code order).
GROUP_KINDS: tuple[GroupKind, ...] = tuple(GroupKind)
assert set(GROUP_KINDS) == set(GROUP_AXES)


def parse_order(text: str | Iterable[str] | None, sizes: Mapping[str, int] | None = None) -> tuple[str, ...]:
    """Parse ``"tp-cp-ep-dp-pp"`` (fastest first). Axes left out must have size 1; they are
    appended in default order so every order is a full permutation."""
    if text is None:
        return DEFAULT_ORDER
    parts = [p.strip().lower() for p in (text.split("-") if isinstance(text, str) else text)]
    parts = [p for p in parts if p]
    if not parts:
        raise LayoutError(f"empty rank order {text!r}; expected e.g. 'tp-cp-ep-dp-pp'")
    unknown = [p for p in parts if p not in AXES]
    if unknown:
        raise LayoutError(f"unknown axis {unknown[0]!r} in rank order {text!r}; axes are {', '.join(AXES)}")
    dup = {p for p in parts if parts.count(p) > 1}
    if dup:
        raise LayoutError(f"axis {sorted(dup)[0]!r} appears twice in rank order {text!r}")
    missing = [a for a in DEFAULT_ORDER if a not in parts]
    if sizes is not None:
        needed = [a for a in missing if sizes.get(a, 1) > 1]
        if needed:
            raise LayoutError(
                f"rank order {text!r} leaves out {', '.join(needed)}, whose size is > 1; list every such axis"
            )
    return tuple(parts) + tuple(missing)


def parse_layout(text: str | Mapping[str, int], world_size: int | None = None, order: str | None = None) -> "Layout":
    """Parse ``"tp=2,pp=4,dp=8"``. Sizes left out are 1, except ``dp`` which, when a world
    size is given, is derived from it. Every mistake is a :class:`LayoutError` that names it."""
    sizes: dict[str, int] = {}
    if isinstance(text, Mapping):
        items = [(str(k), str(v)) for k, v in text.items()]
    else:
        items = []
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            if not sep:
                raise LayoutError(f"layout item {part!r} in {text!r} is not key=value (e.g. 'tp=2,pp=4,dp=8')")
            items.append((key, value))
    for key, value in items:
        key = key.strip().lower()
        if key not in AXES:
            raise LayoutError(f"unknown layout key {key!r} in {text!r}; keys are {', '.join(AXES)}")
        if key in sizes:
            raise LayoutError(f"layout key {key!r} given twice in {text!r}")
        try:
            size = int(str(value).strip())
        except ValueError:
            raise LayoutError(f"layout size {key}={str(value).strip()!r} in {text!r} is not an integer") from None
        if size < 1:
            raise LayoutError(f"layout size {key}={size} in {text!r} must be at least 1")
        sizes[key] = size
    if world_size is not None:
        if world_size < 1:
            raise LayoutError(f"world size {world_size} must be at least 1")
        if "dp" not in sizes:
            rest = int(np.prod([sizes.get(a, 1) for a in AXES if a != "dp"]))
            if world_size % rest:
                raise LayoutError(
                    f"layout {text!r}: tp·cp·ep·pp = {rest} does not divide the world size {world_size}"
                )
            sizes["dp"] = world_size // rest
    layout = Layout(**sizes, order=parse_order(order, sizes))
    if world_size is not None and layout.world_size != world_size:
        raise LayoutError(
            f"layout {layout} has {layout.world_size} ranks but the world size is {world_size}"
        )
    return layout


@dataclass(frozen=True, slots=False)
class Layout:
    """Sizes of the five parallel axes and the rank order (fastest-varying axis first)."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    order: tuple[str, ...] = field(default=DEFAULT_ORDER)

    def __post_init__(self) -> None:
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, (int, np.integer)) or size < 1:
                raise LayoutError(f"layout size {axis}={size!r} must be a positive integer")
        object.__setattr__(self, "order", parse_order(self.order, self.sizes))

    # -- basic facts ---------------------------------------------------------------
    @property
    def sizes(self) -> dict[str, int]:
        return {a: int(getattr(self, a)) for a in AXES}

    @property
    def world_size(self) -> int:
        return int(np.prod(list(self.sizes.values())))

    @property
    def order_str(self) -> str:
        return "-".join(self.order)

    def __str__(self) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in AXES)

    @cached_property
    def strides(self) -> dict[str, int]:
        """Rank distance between neighbours along each axis."""
        strides, acc = {}, 1
        for axis in self.order:
            strides[axis] = acc
            acc *= getattr(self, axis)
        return strides

    # -- coordinates ---------------------------------------------------------------
    def coords(self, ranks: np.ndarray | int | None = None) -> dict[str, np.ndarray]:
        """Coordinates of ``ranks`` (all ranks when None) along each axis."""
        r = np.arange(self.world_size) if ranks is None else np.asarray(ranks, dtype=np.int64)
        if r.size and (r.min() < 0 or r.max() >= self.world_size):
            raise LayoutError(f"rank out of range for a world of {self.world_size}")
        return {a: (r // self.strides[a]) % getattr(self, a) for a in AXES}

    def rank_of(self, **coords: np.ndarray | int) -> np.ndarray:
        """Inverse of :meth:`coords`; missing axes are coordinate 0."""
        rank = np.zeros(np.broadcast(*[np.asarray(v) for v in coords.values()]).shape if coords else (), np.int64)
        for axis, value in coords.items():
            if axis not in AXES:
                raise LayoutError(f"unknown axis {axis!r}")
            rank = rank + np.asarray(value, dtype=np.int64) * self.strides[axis]
        return rank

    # -- groups --------------------------------------------------------------------
    def group_index(self, kind: str) -> np.ndarray:
        """For every rank, the index of its group of ``kind`` (0..n_groups-1, by lowest member)."""
        return self._group_tables(kind)[0]

    def groups(self, kind: str) -> np.ndarray:
        """All groups of ``kind`` as an ``(n_groups, group_size)`` array of ranks, rows sorted."""
        return self._group_tables(kind)[1]

    def group_size(self, kind: str) -> int:
        return int(np.prod([getattr(self, a) for a in self._axes(kind)]))

    def group_of(self, kind: str, rank: int) -> np.ndarray:
        """The members of ``rank``'s group of ``kind``."""
        index, table = self._group_tables(kind)
        return table[index[rank]]

    def peer_set(self, rank: int) -> np.ndarray:
        """Ranks that execute the same work as ``rank``: same pipeline stage, same TP shard."""
        return self.group_of(GroupKind.DP, rank)

    def stage_of(self, ranks: np.ndarray | int) -> np.ndarray:
        """Pipeline stage of ``ranks`` (the one axis computed: this runs over millions of events)."""
        r = np.asarray(ranks, dtype=np.int64)
        if r.size and (r.min() < 0 or r.max() >= self.world_size):
            raise LayoutError(f"rank out of range for a world of {self.world_size}")
        return (r // self.strides["pp"]) % self.pp

    def _axes(self, kind: str) -> tuple[str, ...]:
        try:
            return GROUP_AXES[kind]
        except KeyError:
            raise LayoutError(f"unknown group kind {kind!r}; kinds are {', '.join(GROUP_AXES)}") from None

    def _group_tables(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        cache = self.__dict__.setdefault("_group_cache", {})
        if kind not in cache:
            axes = self._axes(kind)
            ranks = np.arange(self.world_size)
            coords = self.coords(ranks)
            # Zero the varying axes: what remains identifies the group; its lowest member.
            key = ranks - sum((coords[a] * self.strides[a] for a in axes), np.zeros_like(ranks))
            leaders, index = np.unique(key, return_inverse=True)
            order = np.argsort(index, kind="stable")
            table = ranks[order].reshape(len(leaders), -1)
            cache[kind] = (index.astype(np.int64), table)
        return cache[kind]


#: Megatron-core's names for its process groups (``pg_desc`` in a trace's ``pg_config``): the
#: layout kinds, and two groups no layout kind describes — ``MODEL_PARALLEL_GROUP`` (tp × pp:
#: the gradient-norm all-reduce) and ``EMBEDDING_GROUP`` (the first and the last stage: the
#: tied embedding's gradients). The analysis keeps the latter as kinds of their own.
MEGATRON_DESC: Mapping[str, str] = {
    GroupKind.TP: "TENSOR_MODEL_PARALLEL_GROUP", GroupKind.CP: "CONTEXT_PARALLEL_GROUP",
    GroupKind.EP: "EXPERT_MODEL_PARALLEL_GROUP", GroupKind.DP: "DATA_PARALLEL_GROUP",
    GroupKind.EDP: "EXPERT_DATA_PARALLEL_GROUP", GroupKind.PP: "PIPELINE_MODEL_PARALLEL_GROUP",
    GroupKind.WORLD: "default_pg", "model_parallel": "MODEL_PARALLEL_GROUP", "embedding": "EMBEDDING_GROUP",
}


def megatron_desc(layout: Layout, kind: str) -> str:
    """Megatron-core's name for a group of ``kind``: with context parallelism the gradients are
    reduced over ``DATA_PARALLEL_GROUP_WITH_CP`` (our ``dp`` kind spans cp, ep and dp)."""
    if kind == GroupKind.DP and layout.cp > 1:
        return "DATA_PARALLEL_GROUP_WITH_CP"
    return MEGATRON_DESC.get(kind, kind.upper())


def megatron_group(layout: Layout, kind: str, rank: int) -> np.ndarray | None:
    """Members of ``rank``'s group of ``kind`` — a layout kind or one of Megatron's own
    (``model_parallel``, ``embedding``); None for a kind it does not know, or an embedding
    group without a pipeline."""
    if kind in GROUP_AXES:
        return layout.group_of(kind, rank)
    if kind == "model_parallel":
        line = layout.group_of(GroupKind.PP, rank)
        return sorted_unique(np.concatenate([layout.group_of(GroupKind.TP, int(q)) for q in line]))
    if kind == "embedding" and layout.pp > 1:
        line = layout.group_of(GroupKind.PP, rank)
        by_stage = line[np.argsort(layout.stage_of(line))]
        return np.array(sorted({int(by_stage[0]), int(by_stage[-1])}), np.int64)
    return None
