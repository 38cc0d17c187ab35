"""What a diagnosis could compare: the ranks that recorded anything, and those of them that
have at least one peer (same stage, same shard) that recorded too. A store holding 2 of 128
ranks (profilers often sample) is diagnosed for what it holds; "no incident" must not be
read as "every rank is fine" when most ranks were never seen."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.store import Attempt
from argus.vocab import GroupKind
from argus.uniques import sorted_unique

__all__ = ["Coverage", "coverage_of"]


@dataclass(frozen=True, slots=True)
class Coverage:
    world: int
    present: int  # ranks that recorded at least one step
    comparable: int  # … of which have a peer that recorded too
    missing: tuple[int, ...]  # the first absent ranks

    @property
    def complete(self) -> bool:
        return self.present == self.world

    def sentence(self) -> str:
        """One line for a person, or "" when every rank was recorded."""
        if self.complete:
            return ""
        some = ", ".join(map(str, self.missing[:8])) + ("…" if self.world - self.present > 8 else "")
        seen = f"{self.present} of {self.world} ranks recorded (missing {some})"
        if self.comparable == 0:
            return f"{seen}: no recorded rank has a peer recorded too, so no rank could be compared with its peers"
        return f"{seen}: {self.comparable} could be compared with peers; the others were not judged"

    def to_json(self) -> dict:
        return {"world": self.world, "present": self.present, "comparable": self.comparable,
                "missing": list(self.missing[:64])}


def coverage_of(attempt: Attempt) -> Coverage:
    layout = attempt.layout
    world = layout.world_size
    ranks = attempt.read("steps", columns=["rank"]).column("rank").to_numpy()
    here = np.zeros(world, bool)
    ranks = ranks[(ranks >= 0) & (ranks < world)]
    here[sorted_unique(ranks)] = True
    group = layout.group_index(GroupKind.DP)
    per_group = np.bincount(group[here], minlength=int(group.max()) + 1)
    comparable = here & (per_group[group] >= 2)
    return Coverage(world, int(here.sum()), int(comparable.sum()), tuple(int(r) for r in np.flatnonzero(~here)[:64]))
