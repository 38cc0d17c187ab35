"""A host stall's cause from the rank's own timeline: its host phases against its peers'.

The producer records what stops a rank's host without being its model's work as host
phases: ``gc`` (CPython's collector, from ``gc.callbacks``), ``compile`` (dynamo and
inductor compiling a frame), ``dataloader`` (waiting for the next batch), and the user's
own (``argus.phase(..., category="host")``, e.g. checkpoint saving). When a stalled rank
spent, in its stalled steps, at least half of its excess in one such phase beyond what its
peers spent there, that phase names the cause — measured, where stack samples at 1–10 Hz
can miss a 0.3 s collection entirely (py-spy shows no frame for the collector).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.analysis.frames import step_phases_sql
from argus.store import Attempt
from argus.vocab import EvidenceKind, Level

__all__ = ["PhaseCause", "host_phase_cause", "HOST_PHASE_CAUSES"]

#: host phase name (lower case, or a word in it) → stall cause (``l5_stacks.CAUSES``)
HOST_PHASE_CAUSES = (("gc", "garbage_collection"), ("compile", "jit_compile"), ("dataloader", "data_loading"),
                     ("checkpoint", "checkpoint_io"), ("save", "checkpoint_io"))
MIN_SHARE = 0.5  # of the stall's excess that the phase must explain


@dataclass
class PhaseCause:
    cause: str
    phase: str
    rank_s: float  # per stalled step, in the phase, on the rank
    peers_s: float  # … median of its peers
    share: float  # (rank_s - peers_s) / the stall's excess per step

    def to_json(self) -> dict:
        return {"level": Level.L5, "kind": EvidenceKind.HOST_PHASES, "cause": self.cause, "phase": self.phase,
                "rank_s": round(self.rank_s, 4), "peers_s": round(self.peers_s, 4), "share": round(self.share, 3)}


def _cause_of(name: str) -> str | None:
    low = name.lower()
    return next((cause for word, cause in HOST_PHASE_CAUSES if low == word or word in low.split("-")
                 or word in low), None)


def host_phase_cause(attempt: Attempt, rank: int, steps: list[int], excess_per_step_s: float) -> PhaseCause | None:
    if not steps or excess_per_step_s <= 0:
        return None
    peers = [int(p) for p in attempt.layout.peer_set(rank)]
    ranks = ",".join(map(str, sorted(set(peers) | {rank})))
    in_steps = ",".join(str(int(s)) for s in steps)
    rows = step_phases_sql(
        attempt,
        f"SELECT rank, name, sum(dur_ns)::DOUBLE AS ns FROM phases WHERE category = 'host' AND dur_ns > 0 AND "
        f"step IN ({in_steps}) AND rank IN ({ranks}) GROUP BY rank, name").to_pylist()
    by_name: dict[str, dict[int, float]] = {}
    for r in rows:
        if _cause_of(r["name"]) is not None:
            by_name.setdefault(r["name"], {})[int(r["rank"])] = r["ns"] / 1e9 / len(steps)
    best: PhaseCause | None = None
    for name, per_rank in by_name.items():
        mine = per_rank.get(rank, 0.0)
        others = [per_rank.get(p, 0.0) for p in peers if p != rank]
        base = float(np.median(others)) if others else 0.0
        share = (mine - base) / excess_per_step_s
        if share >= MIN_SHARE and (best is None or share > best.share):
            best = PhaseCause(_cause_of(name) or "unknown", name, mine, base, share)
    return best
