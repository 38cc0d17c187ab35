"""L4/L5 on the incidents: the automated last mile of trace and stack analysis.

The impact is the arbiter's (``arbiter.py``: the what-if attribution over the job's dependency
graph); here each compute, pipeline or host-stall incident gets the pipeline's busy/bubble
picture when the job is pipelined, the device's idle gaps inside a stalled phase, and the
stalled rank's stacks. Agreement from another channel (stacks, the device's idle gaps)
confirms the incident; the pipeline's origin, a replay of the same phases, is shown, never
confirming.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from argus.analysis.frames import WindowFrames
from argus.analysis.incident import Incident, State
from argus.analysis.l4_gaps import gpu_idle
from argus.analysis.l4_pipeline import pipeline_bubbles
from argus.analysis.l5_stacks import stack_cause
from argus.store import Attempt
from argus.topology import Topology
from argus.vocab import EvidenceKind, Level

__all__ = ["DeepenConfig", "deepen"]

#: L4/L5 findings measured apart from the phase comparison that raised an incident: only these confirm it.
INDEPENDENT_AGREEMENT = {"stacks", "gpu_idle"}


@dataclass(frozen=True, slots=True)
class DeepenConfig:
    enabled: bool = True


def deepen(attempt: Attempt, topology: Topology, incidents: list[Incident], step_time: dict[int, float],
           normal_step, config: DeepenConfig = DeepenConfig(), frames: WindowFrames | None = None,
           timings: dict[str, float] | None = None) -> None:
    """Add L4/L5 evidence to ``incidents`` in place; ``normal_step(s)`` says whether a step is
    neither warm-up nor checkpoint. ``frames``: the windows' phases the diagnosis already read
    (default: read here); ``timings`` gains the seconds spent in L4 and in L5."""
    clock = {"l4": 0.0, "l5": 0.0}
    if timings is not None:
        timings.update(clock)
    if not config.enabled:
        return
    frames = frames if frames is not None else WindowFrames(attempt, [])
    t_all = time.perf_counter()
    for inc in incidents:
        if inc.klass not in ("compute_straggler", "pipeline_imbalance", "host_stall") or inc.severity == "info":
            continue
        steps = inc.steps or list(range(inc.start_step, inc.end_step + 1))
        normal = steps if inc.klass == "host_stall" else ([s for s in steps if normal_step(s)] or steps)
        agree: list[str] = []
        rep = normal[len(normal) // 2] if normal else None
        if inc.klass in ("compute_straggler", "pipeline_imbalance") and attempt.layout.pp > 1 and rep is not None:
            pipe = pipeline_bubbles(attempt, inc.culprit_ranks, rep, frames)
            if pipe is not None:
                inc.evidence.append(pipe)
                if pipe["origin_rank"] in inc.culprit_ranks:
                    agree.append("pipeline_origin")
        if inc.klass == "host_stall" and inc.culprit_ranks:
            rank = inc.culprit_ranks[0]
            mb = next((int(e["microbatch"]) for e in inc.evidence
                       if e.get("kind") == EvidenceKind.BUSY_OUTLIER and e.get("microbatch", -1) is not None
                       and int(e.get("microbatch", -1)) >= 0), -1)
            gaps = gpu_idle(attempt, rank, steps, inc.phase, mb, frames)
            if gaps is not None:
                inc.evidence.append(gaps)
                if gaps.get("host_stall"):
                    agree.append("gpu_idle")
            if not any(e.get("level") == Level.L5 for e in inc.evidence):
                t5 = time.perf_counter()
                stack = stack_cause(attempt, rank, steps)
                clock["l5"] += time.perf_counter() - t5
                if stack is not None:
                    inc.evidence.append({"level": Level.L5, "kind": EvidenceKind.STACKS, "rank": rank, **stack.to_json()})
            cause = next((e["cause"] for e in inc.evidence if e.get("level") == Level.L5), "unknown")
            if cause != "unknown":
                agree.append("stacks")
                inc.summary = inc.summary.replace("(unknown)", f"({cause.replace('_', ' ')})")
        if agree:
            inc.evidence.append({"level": Level.L4, "kind": EvidenceKind.AGREEMENT, "with": agree,
                                 "note": "automated trace and stack analysis agree with L1–L3"})
            # the pipeline's origin is a replay of the phases that raised the incident: it agrees
            # by construction; stacks (another channel) and the device's idle gaps (kernels
            # against phases) are evidence of their own
            if inc.state == State.SUSPECTED and set(agree) & INDEPENDENT_AGREEMENT:
                inc.state = State.CONFIRMED
    if timings is not None:
        timings.update(l4=time.perf_counter() - t_all - clock["l5"], l5=clock["l5"])
