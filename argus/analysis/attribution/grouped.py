"""Grouped reductions over a flat axis: factorize the keys once, sort once, reduce over the
group bounds (the flox pattern), so a replay's thousands of collective joins are each one
``reduceat`` instead of a mask per group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Grouping"]


@dataclass(frozen=True)
class Grouping:
    """Rows (axis 0) → groups: ``order`` sorts the rows by group, ``bounds`` are the groups'
    first sorted rows, ``inverse`` maps each row to its group."""

    order: np.ndarray
    bounds: np.ndarray
    inverse: np.ndarray
    n_groups: int

    @classmethod
    def of(cls, keys: np.ndarray) -> Grouping:
        uniq, inverse = np.unique(np.asarray(keys), return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        counts = np.bincount(inverse, minlength=len(uniq))
        bounds = np.r_[0, np.cumsum(counts)[:-1]]
        return cls(order, bounds, inverse, len(uniq))

    def max(self, values: np.ndarray) -> np.ndarray:
        """Per group, the maximum of ``values`` (rows on axis 0, any trailing shape)."""
        return np.maximum.reduceat(values[self.order], self.bounds, axis=0)

    def min(self, values: np.ndarray) -> np.ndarray:
        return np.minimum.reduceat(values[self.order], self.bounds, axis=0)

    def sizes(self) -> np.ndarray:
        return np.diff(np.r_[self.bounds, len(self.order)])
