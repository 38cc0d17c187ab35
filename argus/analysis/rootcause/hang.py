"""Hangs from steps that never finished: the culprits are the ranks that never joined the
collective the others are blocked in."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from argus.analysis.frames import load_phases
from argus.analysis.incident import Action, Incident, IncidentClass, Severity, State
from argus.analysis.signals import stack_cause
from argus.analysis.evidence import blocked_in_collectives, never_joined, stacks, steps_never_finished
from argus.analysis.rootcause.context import _Ctx
from argus.uniques import sorted_unique


def _hang(ctx: _Ctx) -> Incident | None:
    step = int(ctx.l1.hung_steps[0])
    f = load_phases(ctx.attempt, step, step)
    if f.n == 0:
        return None
    unfinished = f.dur < 0
    comm = f.is_comm
    blocked = sorted_unique(f.rank[unfinished & comm])
    present = sorted_unique(f.rank)
    culprits = [int(r) for r in present if r not in set(blocked.tolist())]
    missing = sorted(set(range(ctx.world)) - set(present.tolist()))
    culprits = culprits or missing
    if not culprits:
        return None
    waits = Counter(f.names[n] for n in f.name[unfinished & comm])
    last = {}
    for r in culprits[:8]:
        rows = np.flatnonzero(f.rank == r)
        if rows.size:
            i = rows[-1]
            last[r] = {"phase": f.names[f.name[i]], "never_finished": bool(f.dur[i] < 0)}
    evidence: list[dict[str, Any]] = [
        steps_never_finished(ctx.l1.hung_steps[:10]),
        blocked_in_collectives(int(blocked.size), dict(waits.most_common(5))),
        never_joined(culprits[:32], last)]
    stack = stack_cause(ctx.attempt, culprits[0], [step])
    if stack is not None:
        evidence.append(stacks(culprits[0], stack))
    last_ts = ctx.attempt.sql("SELECT max(end_ns) AS e FROM stacks").column("e")[0].as_py() if stack else None
    start = ctx.attempt.sql(f"SELECT min(start_ns) AS s FROM steps WHERE step = {step}").column("s")[0].as_py()
    stalled_s = (last_ts - start) / 1e9 if last_ts and start else 0.0
    phase = last.get(culprits[0], {}).get("phase", "")
    return Incident(IncidentClass.HANG, culprits, ctx.hosts_of(culprits), ctx.gpus_of(culprits), step, step, phase,
                    [], State.CONFIRMED, Severity.CRITICAL, 100.0, ctx.world * stalled_s / 3600.0,
                    Action.CHECKPOINT_AND_RESTART,
                    evidence, [step], f"job stopped at step {step}: {len(blocked)} ranks blocked in collectives, "
                    f"rank{'s' * (len(culprits) > 1)} {', '.join(map(str, culprits[:8]))} never joined")
