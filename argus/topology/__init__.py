"""Execution identity and parallel topology: layouts, groups, peer sets, rank placement."""

from argus.topology.layout import (AXES, DEFAULT_ORDER, GROUP_KINDS, MEGATRON_DESC, GroupKind, Layout, megatron_desc,
                                   megatron_group, parse_layout, parse_order)
from argus.topology.snapshot import RunIdentity, Topology, new_run_id

__all__ = [
    "AXES",
    "DEFAULT_ORDER",
    "GROUP_KINDS",
    "GroupKind",
    "Layout",
    "MEGATRON_DESC",
    "megatron_desc",
    "RunIdentity",
    "Topology",
    "megatron_group",
    "new_run_id",
    "parse_layout",
    "parse_order",
]
