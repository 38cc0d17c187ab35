"""Which ranks a large job's attribution replays: the model replicas that hold a suspect and a few
healthy ones spread over the data-parallel axis, every group inside them whole (pipeline lines,
TP, CP and EP groups), so the data-parallel collectives keep one member per replayed replica —
enough for their last arrival and their transfer. Cost and memory are those of a few replicas
at any world size."""

from __future__ import annotations

import math

import numpy as np

from argus.topology import Layout
from argus.uniques import sorted_unique

__all__ = ["replay_ranks", "FULL_REPLAY_RANKS", "REPLAY_PEERS", "MIN_HEALTHY_REPLICAS"]

#: Up to this world size every rank is replayed (what L2 compares exactly, ``DiagnoseConfig.exact_ranks``).
FULL_REPLAY_RANKS = 2048
#: Above it: healthy peers (same work, other replicas) replayed per suspect, for the typical its work is set to;
#: each healthy replica brings cp × ep of them.
REPLAY_PEERS = 8
#: … and at least this many healthy replicas, so that one slow replica is not the whole reference.
MIN_HEALTHY_REPLICAS = 2


def replay_ranks(layout: Layout, suspects: list[int], full: int | None = None) -> np.ndarray | None:
    """The ranks to replay: None (every rank) up to ``full`` (default ``FULL_REPLAY_RANKS``) ranks,
    else the replicas holding a suspect and a few healthy ones evenly spread over the dp axis."""
    if layout.world_size <= (FULL_REPLAY_RANKS if full is None else full):
        return None
    dp = layout.coords()["dp"]
    bad = sorted_unique(dp[np.asarray(suspects, np.int64)]) if suspects else np.empty(0, np.int64)
    healthy = np.setdiff1d(np.arange(layout.dp), bad)
    n = min(max(MIN_HEALTHY_REPLICAS, math.ceil(REPLAY_PEERS / (layout.cp * layout.ep))), healthy.size)
    pick = healthy[sorted_unique(np.linspace(0, healthy.size - 1, n).round().astype(np.int64))] if n else healthy
    return np.flatnonzero(np.isin(dp, np.union1d(bad, pick)))
