"""Annotation and file names in Kineto traces → Argus fields (phase name, category, group, microbatch, rank).

``record_function`` names are free text: PyTorch wraps some in ``## … ##``, collectives appear as
``nccl:all_reduce`` (or ``gloo:…`` on CPU jobs), Argus' own vocabulary uses ``tp-allreduce``,
``pp-send``, ``backward-compute-mb7``. One rule set, cached per distinct name (a trace has a few
hundred names, seen many thousands of times), keeps the importer's per-event work to a lookup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["PhaseName", "phase_name", "profiler_step", "rank_from_filename", "COMM_PREFIXES"]

#: Annotation prefixes PyTorch gives collectives (``nccl:all_reduce``, ``gloo:broadcast``…).
COMM_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "xccl:")

_PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_WRAPPED = re.compile(r"^##\s*(.*?)\s*##$", re.S)
_MICROBATCH = re.compile(r"(?:^|[-_.\s])(?:mb|microbatch)[-_]?(\d+)(?=$|[-_.\s])", re.I)
# Collective / point-to-point words as whole tokens: ``tp-allreduce``, ``dp-reduce-scatter``,
# ``pp-send``, ``barrier``, ``## alltoall_fwd_single ##`` — but not ``sendmail`` or ``KJTAllToAllSplits``.
_COMM_WORD = re.compile(
    r"(?<![a-z0-9])(?:all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|all2all|broadcast|"
    r"barrier|send|recv|sendrecv|isend|irecv|p2p)(?![a-z])")
_GROUP_PREFIX = re.compile(r"^(tp|cp|ep|dp|edp|pp)[-_]")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.I)


@dataclass(frozen=True, slots=True)
class PhaseName:
    """What a raw annotation name means as a phase."""

    name: str  # ``## forward ##`` → ``forward``; otherwise the name as written
    category: str  # ``comm`` or ``compute``
    group_kind: str  # from an Argus-style prefix (``tp-allreduce`` → ``tp``), else empty
    microbatch: int  # from ``…-mb7`` / ``microbatch_7``, else -1


@lru_cache(maxsize=65536)
def phase_name(raw: str) -> PhaseName:
    """Phase fields of an annotation name (cached: names repeat every step)."""
    text = str(raw).strip()
    m = _WRAPPED.match(text)
    if m and m.group(1):
        text = m.group(1)
    low = text.lower()
    comm = low.startswith(COMM_PREFIXES) or _COMM_WORD.search(low) is not None
    group = ""
    if comm:
        g = _GROUP_PREFIX.match(low)
        group = g.group(1) if g else ""
    mb = _MICROBATCH.search(text)
    return PhaseName(text, "comm" if comm else "compute", group, int(mb.group(1)) if mb else -1)


def profiler_step(name: str) -> int | None:
    """``ProfilerStep#12`` → 12; anything else → None."""
    m = _PROFILER_STEP.match(name)
    return int(m.group(1)) if m else None


def rank_from_filename(filename: str) -> int | None:
    """``rank3.json``, ``trace_rank-3.json.gz``, ``rank_3.pt.trace.json`` → 3 (the last match wins,
    so a directory-like prefix such as ``rank0_runs/…`` in a flattened name does not)."""
    found = _RANK_IN_NAME.findall(filename)
    return int(found[-1]) if found else None
