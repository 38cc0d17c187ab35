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

from argus.kineto.limits import MAX_STEP, MAX_WORLD_SIZE

__all__ = ["PhaseName", "phase_name", "profiler_step", "rank_from_filename", "COMM_PREFIXES", "FRAMEWORK_PHASES",
           "framework_phase", "is_annotation_name"]

#: Annotation prefixes PyTorch gives collectives (``nccl:all_reduce``, ``gloo:broadcast``…).
COMM_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "xccl:")

_PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
#: More digits than any step or rank can have: longer runs are refused before ``int()`` parses them.
_MAX_DIGITS = 19
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
    category: str  # ``comm``, ``compute`` or ``host`` (framework phases that are not the model's work)
    group_kind: str  # from an Argus-style prefix (``tp-allreduce`` → ``tp``), else empty
    microbatch: int  # from ``…-mb7`` / ``microbatch_7``, else -1


#: Names up to this many characters are cached (names repeat every step); longer ones, rare and
#: possibly hostile, are parsed each time so the cache stays under 64 MB.
_CACHED_NAME_CHARS = 1024


def phase_name(raw: str) -> PhaseName:
    """Phase fields of an annotation name (cached: names repeat every step)."""
    return _cached_phase_name(raw) if len(raw) <= _CACHED_NAME_CHARS else _phase_name(raw)


#: ``record_function`` names PyTorch itself gives framework work that is not the model's:
#: the DataLoader's ``__next__`` is the rank waiting for its batch — host time, as the
#: producer records it (``host_phases.py`` names its cause from the word ``dataloader``).
#: Names stay as written (a trace may wrap the optimizer's own range in ``## optimizer ##``
#: too: one name for both would count it twice).
FRAMEWORK_PHASES = (("enumerate(dataloader)", "host"),)


def framework_phase(raw: str) -> str | None:
    """The category of a PyTorch framework ``record_function`` name, else None."""
    low = raw[:64].lower()
    return next((cat for prefix, cat in FRAMEWORK_PHASES if low.startswith(prefix)), None)


def is_annotation_name(raw: str) -> bool:
    """Whether a CPU *op* of this name is really a ``record_function`` annotation: older Kineto
    schemas put annotations in ``Operator`` with the ops (``## forward ##``, collectives,
    framework phases); newer ones give them ``user_annotation`` of their own."""
    text = raw.strip()
    return (framework_phase(text) is not None or text.lower().startswith(COMM_PREFIXES)
            or (len(text) >= 4 and text.startswith("##") and text.endswith("##")))


def _phase_name(raw: str) -> PhaseName:
    text = str(raw).strip()
    framework = framework_phase(text)
    if framework is not None:
        return PhaseName(text, framework, "", -1)
    # ``## forward ##`` → ``forward``. Not a regex: ``^##\s*(.*?)\s*##$`` backtracks in the cube
    # of the length on ``##`` + spaces (18 s for 4,000 characters).
    if len(text) >= 4 and text.startswith("##") and text.endswith("##") and text[2:-2].strip():
        text = text[2:-2].strip()
    low = text.lower()
    comm = low.startswith(COMM_PREFIXES) or _COMM_WORD.search(low) is not None
    group = ""
    if comm:
        g = _GROUP_PREFIX.match(low)
        group = g.group(1) if g else ""
    mb = _MICROBATCH.search(text)
    digits = mb.group(1).lstrip("0") or "0" if mb else ""
    microbatch = int(digits) if digits and len(digits) <= 9 else -1  # int32, and int() refuses 4,300+ digits
    return PhaseName(text, "comm" if comm else "compute", group, microbatch)


_cached_phase_name = lru_cache(maxsize=65536)(_phase_name)


def profiler_step(name: str) -> int | None:
    """``ProfilerStep#12`` → 12; not a step name → None; a step number above
    :data:`~argus.kineto.limits.MAX_STEP` → -1 (the caller counts it and leaves the step out)."""
    m = _PROFILER_STEP.match(name)
    if not m:
        return None
    digits = m.group(1).lstrip("0") or "0"
    if len(digits) > _MAX_DIGITS or int(digits) > MAX_STEP:
        return -1
    return int(digits)


def rank_from_filename(filename: str) -> int | None:
    """``rank3.json``, ``trace_rank-3.json.gz``, ``rank_3.pt.trace.json`` → 3 (the last match wins,
    so a directory-like prefix such as ``rank0_runs/…`` in a flattened name does not); a number
    that cannot be a rank (≥ :data:`~argus.kineto.limits.MAX_WORLD_SIZE`) → None."""
    found = _RANK_IN_NAME.findall(filename)
    if not found:
        return None
    digits = found[-1].lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS and int(digits) < MAX_WORLD_SIZE else None
