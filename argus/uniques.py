"""Sorted distinct values by sorting, not by NumPy's hash table.

NumPy 2.3+ answers ``np.unique(a)`` (no ``return_*``) for integers and strings with a hash
table; on millions of distinct values it is 10–13× slower than a sort here (3 M int64:
3.5 s against 0.28 s; 1 M strings: 1.1 s against 0.18 s), and the diagnosis called it on
every window's collective rows. Same result: the sorted distinct values, flattened.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sorted_unique"]


def sorted_unique(values) -> np.ndarray:
    """``np.unique(values)``, by a sort for integers, booleans and strings (floats, objects and
    empty input go to ``np.unique``, whose NaN handling they may need)."""
    a = np.asarray(values)
    if a.size == 0 or a.dtype.kind not in "iubUS":
        return np.unique(a)
    s = np.sort(a, axis=None)
    keep = np.empty(s.size, bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
