"""Attribution by what-if over the job's dependency graph: every culprit and every impact from one
causal model (docs/diagnosis.md, "Attribution").

``chains`` turns a window's recorded phases into each rank's events and the own time between
them; ``graph`` lays the step out as per-stage templates joined by collectives and pipeline
transfers; ``durations`` holds the recorded and the typical values; ``replay`` runs every
what-if at once; ``attribute`` measures each group's share; ``verdict`` names the shape."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.attribution.attribute import GroupKind, Part, Share, WindowAttribution, attribute_graph
from argus.analysis.attribution.chains import Chains, StepBounds, build_chains
from argus.analysis.attribution.graph import StepGraph, build_graphs
from argus.analysis.attribution.verdict import MIN_STAGE_SLOWDOWN, Finding, Shape, findings
from argus.analysis.frames import PhaseFrame
from argus.topology import Layout

__all__ = ["AttributionConfig", "Chains", "Finding", "StepGraph", "GroupKind", "Part", "Shape", "Share", "StepBounds", "WindowAttribution",
           "WindowOutcome", "attribute_window", "findings", "MAX_REPLAY_ERROR_PCT", "MIN_FINDING_STEPS",
           "MIN_STAGE_SLOWDOWN", "SCALE_STEPS", "sample_steps"]

#: A replay that misses the recorded steps by more than this does not model the job: nothing is
#: attributed from it (the window says so).
MAX_REPLAY_ERROR_PCT = 10.0
#: A window makes findings of its own from at least this many replayed steps.
MIN_FINDING_STEPS = 3
#: Above ``FULL_REPLAY_RANKS`` a window replays at most this many of its steady steps (the
#: candidates' own steps first): at 10,240 ranks a step is 3 M events to chain, lay out and
#: replay under every scenario, and each step already compares thousands of ranks.
SCALE_STEPS = MIN_FINDING_STEPS


@dataclass(frozen=True, slots=True)
class AttributionConfig:
    enabled: bool = True
    max_error_pct: float = MAX_REPLAY_ERROR_PCT
    scale_steps: int = SCALE_STEPS  # steps a window replays when only some replicas are replayed


@dataclass
class WindowOutcome:
    """A window's attribution, or why there is none."""

    lo: int
    hi: int
    attribution: WindowAttribution | None
    note: str = ""  # why nothing was attributed (no events, irregular steps, a replay off the recording)
    findings: list[Finding] | None = None

    @property
    def modeled(self) -> bool:
        return self.attribution is not None and not self.note


def sample_steps(steps: list[int], prefer: set[int], n: int) -> list[int]:
    """At most ``n`` of ``steps``: those in ``prefer`` first (a candidate's own steps: an
    intermittent fault is measured where it struck), then evenly spread over the rest."""
    steps = sorted(steps)
    if len(steps) <= n:
        return steps
    mine = [s for s in steps if s in prefer]
    if len(mine) >= n:
        return [mine[i] for i in np.linspace(0, len(mine) - 1, n).round().astype(int)]
    rest = [s for s in steps if s not in prefer]
    k = n - len(mine)
    picked = [rest[i] for i in sorted(set(np.linspace(0, len(rest) - 1, k).round().astype(int).tolist()))]
    return sorted(mine + picked)


def attribute_window(frame: PhaseFrame, layout: Layout, hosts: np.ndarray, bounds: StepBounds | None, lo: int,
                     hi: int, extra: list[tuple[str, list[int]]] | None = None,
                     config: AttributionConfig = AttributionConfig(),
                     steps: list[int] | None = None) -> WindowOutcome:
    """The what-ifs of one window (``steps``: only these, e.g. its steady ones)."""
    if steps is not None:
        keep = np.isin(frame.step, steps)
        if not keep.all():  # a large job's frame was read for these steps alone
            frame = frame.take(np.flatnonzero(keep))
    ch = build_chains(frame, layout, hosts, bounds)
    if ch is None:
        return WindowOutcome(lo, hi, None, "no finished communication event: nothing joins the ranks' steps")
    graphs = build_graphs(ch, layout)
    if not graphs:
        return WindowOutcome(lo, hi, None, "no step whose ranks' events agree with their stage's template "
                                           "(records lost, or a recording whose order cannot be replayed)")
    g = graphs[0]
    if not g.joins_ranks:
        return WindowOutcome(lo, hi, None, "no event joins two ranks in the graph: a replay of independent "
                                           "timelines reproduces any recording and measures no dependency")
    wa = attribute_graph(ch, g, layout, hosts, lo, hi, extra)
    note = ""
    err = wa.error_pct
    if not err <= config.max_error_pct:
        note = (f"the replay misses the recorded steps by {err:.0f}% (more than {config.max_error_pct:.0f}%): "
                "the graph does not hold this job's dependencies, nothing is attributed from it")
    out = WindowOutcome(lo, hi, wa, note)
    # a window of one or two steps measures its candidates' cost, but is too short to tell a
    # persistent difference from a shared host's noise on its own
    out.findings = [] if note or len(wa.steps) < MIN_FINDING_STEPS else findings(wa, layout.pp)
    wa._model = None  # the graph and its durations are not kept past the window
    return out
