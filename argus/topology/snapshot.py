"""Run identity and the per-attempt topology snapshot (rank → host, local rank, GPU, coords).

Ranks are reassigned across restarts, so an incident must resolve to attempt + rank + host
+ GPU; the snapshot is what makes that possible and is stored with every attempt.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from argus.errors import LayoutError
from argus.topology.layout import AXES, Layout, parse_layout

if TYPE_CHECKING:  # pyarrow is imported where tables are built: the producer never needs it
    import pyarrow as pa

__all__ = ["RunIdentity", "Topology", "new_run_id"]


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True)
class RunIdentity:
    """Which job (``run_id``) and which (re)start of it (``attempt_id``)."""

    run_id: str
    attempt_id: str = "0"

    def __post_init__(self) -> None:
        for name in ("run_id", "attempt_id"):
            value = getattr(self, name)
            if not value or "/" in value or value.startswith(".") or "\\" in value:
                raise LayoutError(f"{name} {value!r} must be non-empty, without '/' and not start with '.'")


@dataclass(frozen=True)
class Topology:
    """Placement of every rank of one attempt. Arrays are indexed by rank."""

    layout: Layout
    hosts: np.ndarray  # str, per rank
    local_ranks: np.ndarray  # int, per rank
    gpu_uuids: np.ndarray  # str, per rank
    version: int = 1

    def __post_init__(self) -> None:
        n = self.layout.world_size
        for name in ("hosts", "local_ranks", "gpu_uuids"):
            if len(getattr(self, name)) != n:
                raise LayoutError(f"topology {name} has {len(getattr(self, name))} entries for {n} ranks")

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @classmethod
    def uniform(cls, layout: Layout, gpus_per_host: int = 8, host_prefix: str = "node", seed: str = "") -> "Topology":
        """Consecutive ranks packed ``gpus_per_host`` to a host, as torchrun/Slurm place them."""
        if gpus_per_host < 1:
            raise LayoutError(f"gpus_per_host must be at least 1, got {gpus_per_host}")
        ranks = np.arange(layout.world_size)
        host_ids = ranks // gpus_per_host
        width = max(4, len(str(int(host_ids.max()))))
        hosts = np.array([f"{host_prefix}-{h:0{width}d}" for h in range(int(host_ids.max()) + 1)])[host_ids]
        local = ranks % gpus_per_host
        uuids = np.array([_gpu_uuid(f"{seed}/{h}/{lr}") for h, lr in zip(hosts, local)])
        return cls(layout=layout, hosts=hosts, local_ranks=local, gpu_uuids=uuids)

    def host_of(self, ranks: np.ndarray | int) -> np.ndarray:
        return self.hosts[np.asarray(ranks)]

    def ranks_on(self, host: str) -> np.ndarray:
        return np.flatnonzero(self.hosts == host)

    @property
    def host_names(self) -> list[str]:
        """Hosts in first-rank order."""
        _, first = np.unique(self.hosts, return_index=True)
        return [str(self.hosts[i]) for i in np.sort(first)]

    def to_table(self) -> pa.Table:
        import pyarrow as pa

        coords = self.layout.coords()
        cols = {
            "rank": pa.array(np.arange(self.world_size), pa.int32()),
            "host": pa.array(self.hosts.astype(str), pa.string()),
            "local_rank": pa.array(self.local_ranks, pa.int32()),
            "gpu_uuid": pa.array(self.gpu_uuids.astype(str), pa.string()),
        }
        for axis in AXES:
            cols[axis] = pa.array(coords[axis], pa.int32())
        cols["topology_version"] = pa.array(np.full(self.world_size, self.version), pa.int32())
        return pa.table(cols)

    @classmethod
    def from_table(cls, table: pa.Table, layout: Layout) -> "Topology":
        """Rebuild from stored rows. Each host writes its own ranks' rows, so ranks may be
        missing (host not heard from: ``unknown``) or repeated (a restarted processor): the
        row with the highest ``topology_version``, then the last written, wins."""
        n = layout.world_size
        ranks = table.column("rank").to_numpy()
        if ranks.size and (ranks.min() < 0 or ranks.max() >= n):
            raise LayoutError(f"topology table has rank {int(ranks.max())} outside a world of {n}")
        versions = table.column("topology_version").to_numpy()
        order = np.lexsort((np.arange(len(ranks)), versions))  # last row of the highest version wins
        hosts = np.full(n, "unknown", dtype=object)
        local = np.full(n, -1, dtype=np.int64)
        gpus = np.full(n, "", dtype=object)
        h, lr, g = (np.asarray(table.column(c).to_pylist(), dtype=object) for c in ("host", "local_rank", "gpu_uuid"))
        hosts[ranks[order]] = h[order]
        local[ranks[order]] = lr[order].astype(np.int64)
        gpus[ranks[order]] = g[order]
        version = int(versions.max()) if versions.size else 1
        return cls(layout=layout, hosts=hosts.astype(str), local_ranks=local, gpu_uuids=gpus.astype(str),
                   version=version)

    def rows(self, ranks: np.ndarray) -> pa.Table:
        """The topology rows of some ranks only (what one host's processor knows)."""
        import pyarrow as pa

        return self.to_table().take(pa.array(np.asarray(ranks, dtype=np.int64)))

    @classmethod
    def from_layout_string(cls, text: str, world_size: int | None = None, order: str | None = None,
                           gpus_per_host: int = 8) -> "Topology":
        return cls.uniform(parse_layout(text, world_size, order), gpus_per_host)


def _gpu_uuid(key: str) -> str:
    h = hashlib.sha1(key.encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
