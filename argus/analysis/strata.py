"""Like with like: groups are compared only with groups that do the same work.

Groups of one kind (tp, cp, ep, dp, edp) live inside one pipeline stage, and stages do
different work: the first and last stages run the embedding and loss all-reduces, an MoE
stage's all-to-alls move other sizes than a dense stage's, the last stage's data-parallel
all-reduce carries the output layer's gradients. A collective's transfer floor is therefore
compared with the floors of the same collective in groups of the **same stage**, never with
another stage's. Pipeline groups span the stages and form one stratum.
"""

from __future__ import annotations

import numpy as np

from argus.topology import Layout
from argus.vocab import GroupKind
from argus.uniques import sorted_unique

__all__ = ["group_strata", "center_within"]


def group_strata(layout: Layout, kind: str) -> np.ndarray:
    """For every group of ``kind`` (rows of ``layout.groups(kind)``), the stratum it is compared in."""
    table = layout.groups(kind)
    if kind == GroupKind.PP or layout.pp == 1:
        return np.zeros(len(table), np.int64)
    return layout.stage_of(table[:, 0]).astype(np.int64)


def center_within(v: np.ndarray, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``v`` (log transfer floors, one per group) minus its stratum's median, and how many groups
    each value's stratum holds. A stratum of one group has nothing to compare with: its value
    becomes 0 (no evidence either way)."""
    out = np.zeros(len(v))
    size = np.zeros(len(v), np.int64)
    for s in sorted_unique(strata):
        m = strata == s
        out[m] = v[m] - np.median(v[m])
        size[m] = int(m.sum())
    return out, size
