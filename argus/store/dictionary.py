"""String columns handed over as dictionaries: integer codes and one table of strings.

The processor holds kernel names and kinds as ids into each rank's name table. Turning a
window's ~5·10⁵ ids into strings per row (a ``take``) and hashing them back into a dictionary
in each consumer (the kernel compression, the Perfetto writer) cost ~0.1 CPU-s per
production host-window; a dictionary column costs a gather of int32 codes.

A consumer that encodes strings in the order it meets them (the Perfetto writer's interning
ids, the compression's row order) must see the dictionary ``dictionary_encode`` of the same
strings would give: no duplicate or unused strings, strings numbered in order of first
appearance. :func:`first_seen_codes` puts codes and table in that form, and leaves them alone
(one pass over the codes) when they already are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["first_seen_codes", "first_seen_dictionary"]

_FEW = 16  # tables up to this size: the first row of each value by a pass per value


def first_seen_codes(codes: np.ndarray, values: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """``(codes, table)`` of the strings ``values[codes]`` as ``dictionary_encode`` numbers
    them: each distinct string once, in order of its first row. ``codes`` index ``values``
    (duplicates and unused entries allowed); the result's codes are int32."""
    values = list(values)
    c = np.asarray(codes)
    if _is_first_seen(c, values):
        return c.astype(np.int32, copy=False), values
    n = c.size
    if len(values) <= _FEW:  # a vocabulary (kinds): one pass per value present
        counts = np.bincount(c, minlength=len(values))
        first = np.full(len(values), n, np.int64)
        for v in np.flatnonzero(counts).tolist():
            first[v] = int(np.argmax(c == v)) if counts[v] < n else 0
    else:
        first = np.full(len(values), n, np.int64)
        np.minimum.at(first, c, np.arange(n))  # ~2 ms for 5·10⁵ rows (a unique() sorts: ~50 ms)
    index: dict[str, int] = {}  # equal strings of different entries are one: the earliest row
    unique_of = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int64, len(values))
    first_unique = np.full(len(index), n, np.int64)
    np.minimum.at(first_unique, unique_of, first)
    used = np.flatnonzero(first_unique < n)
    ranked = used[np.argsort(first_unique[used], kind="stable")]
    renumber = np.zeros(len(index), np.int32)
    renumber[ranked] = np.arange(ranked.size, dtype=np.int32)
    strings = list(index)
    table = [strings[i] for i in ranked.tolist()]
    if len(table) == 1:  # one value (every row a kernel): no gather
        return np.zeros(n, np.int32), table
    return renumber[unique_of][c], table


def first_seen_dictionary(codes: np.ndarray, values: Sequence[str]) -> pa.DictionaryArray:
    """The ``dictionary<int32, string>`` array that ``pa.array(values[codes]).dictionary_encode()``
    gives, without a string per row."""
    c, table = first_seen_codes(codes, values)
    return pa.DictionaryArray.from_arrays(pa.array(c, pa.int32()), pa.array(table, pa.string()))


def _is_first_seen(c: np.ndarray, values: list[str]) -> bool:
    """Every entry used, each new code one past the highest before it, no string twice."""
    if not c.size:
        return not values
    if int(c[0]) != 0 or int(c.max()) != len(values) - 1 or len(set(values)) != len(values):
        return False
    high = np.maximum.accumulate(c)
    return bool((c[1:] <= high[:-1] + 1).all())
