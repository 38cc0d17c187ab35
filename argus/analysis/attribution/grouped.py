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
    #: every group has this many rows (0: sizes differ) — then a reshape replaces ``reduceat``
    uniform: int = 0
    #: ``order`` is the identity (rows already sorted by group)
    sorted: bool = False

    @classmethod
    def of(cls, keys: np.ndarray) -> Grouping:
        uniq, inverse = np.unique(np.asarray(keys), return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        counts = np.bincount(inverse, minlength=len(uniq))
        bounds = np.r_[0, np.cumsum(counts)[:-1]]
        uniform = int(counts[0]) if counts.size and (counts == counts[0]).all() else 0
        return cls(order, bounds, inverse, len(uniq), uniform, bool((order == np.arange(order.size)).all()))

    def _sorted(self, values: np.ndarray) -> np.ndarray:
        return values if self.sorted else values[self.order]

    def _reduce(self, v: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
        """Per group, ``ufunc`` over rows already in group order."""
        if self.uniform == 1:
            return v.copy()
        if self.uniform:
            return ufunc.reduce(v.reshape(self.n_groups, self.uniform, *v.shape[1:]), axis=1)
        return ufunc.reduceat(v, self.bounds, axis=0)

    def max(self, values: np.ndarray) -> np.ndarray:
        """Per group, the maximum of ``values`` (rows on axis 0, any trailing shape)."""
        return self._reduce(self._sorted(values), np.maximum)

    def min(self, values: np.ndarray) -> np.ndarray:
        return self._reduce(self._sorted(values), np.minimum)

    def argmax(self, values: np.ndarray) -> np.ndarray:
        """Per group and trailing position, the row (of ``values``) holding the group's maximum
        (the first such row in group order)."""
        v = self._sorted(values)
        top = self._reduce(v, np.maximum)
        pos = np.arange(v.shape[0]).reshape((-1,) + (1,) * (v.ndim - 1))
        first = np.where(v == top[self.inverse[self.order]], pos, v.shape[0])
        return self.order[self._reduce(first, np.minimum)]

    def sizes(self) -> np.ndarray:
        return np.diff(np.r_[self.bounds, len(self.order)])
