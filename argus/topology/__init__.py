"""Execution identity and parallel topology: layouts, groups, peer sets, rank placement."""

from argus.topology.layout import AXES, DEFAULT_ORDER, GROUP_KINDS, GroupKind, Layout, parse_layout, parse_order
from argus.topology.snapshot import RunIdentity, Topology, new_run_id

__all__ = [
    "AXES",
    "DEFAULT_ORDER",
    "GROUP_KINDS",
    "GroupKind",
    "Layout",
    "RunIdentity",
    "Topology",
    "new_run_id",
    "parse_layout",
    "parse_order",
]
