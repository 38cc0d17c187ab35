"""Outcomes of active checks on an incident's suspect (``argus verify``), kept with the attempt.

A passive comparison can only say "suspected": a rank is slower than its peers, a host's
transfers are slower than other hosts'. Whether the hardware is at fault is a separate claim,
settled by measuring the suspect and a healthy peer with the same probe (``argus healthcheck``):

* ``confirmed`` — the suspect is below its peers (or its own baseline) and the peer is not;
* ``refuted`` — both measure healthy: the slowdown is real, but its cause is in the job (its
  structure, its software), so replacing the node would fix nothing;
* ``inconclusive`` — the suspect was not measured, no healthy peer was, or both are down.

Each outcome is one small JSON file, ``verifications/<incident id>.json`` in the attempt's
directory (incident ids are stable across re-runs of the diagnosis). :func:`apply` puts them on
the incidents: a confirmed one may name a host to cordon, a refuted one never does.

A cordon is a claim about someone's hardware, so it needs evidence from the hardware itself:
an active check that confirmed it, or a hardware signal among the incident's evidence (a
thermal throttle, a link trained down, port errors). Passive timing levels that agree (busy
time and kernel time, or transfers and communicator kernels) make an incident ``confirmed``
as a slowdown, and its action ``verify``: the cheap active check comes before the restart.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from argus.analysis.incident import Action, Incident, State
from argus.vocab import EvidenceKind, Level

__all__ = ["Outcome", "Verification", "save", "load", "apply", "DIRECTORY"]

DIRECTORY = "verifications"


class Outcome(StrEnum):
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    INCONCLUSIVE = "inconclusive"


@dataclass
class Verification:
    incident: str  # the incident's id
    klass: str
    outcome: Outcome
    reason: str  # one sentence: what was measured and what it shows
    suspects: list[str]  # the subjects checked for the incident ("host:node-3", "rank:5")
    peers: list[str]  # healthy subjects measured beside them
    checks: list[dict[str, Any]] = field(default_factory=list)  # the verdicts used (subject, metric, status, …)
    health_host: str = ""  # where the health report was made
    checked_s: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["class"] = d.pop("klass")
        d["outcome"] = str(self.outcome)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Verification":
        return cls(str(d["incident"]), str(d["class"]), Outcome(d["outcome"]), str(d["reason"]),
                   [str(s) for s in d["suspects"]], [str(p) for p in d["peers"]], list(d.get("checks", [])),
                   str(d.get("health_host", "")), float(d.get("checked_s", 0.0)))


def save(attempt_dir: Path, v: Verification) -> Path:
    from argus.store.files import write_bytes_atomic

    path = Path(attempt_dir) / DIRECTORY / f"{v.incident}.json"
    write_bytes_atomic(path, json.dumps(v.to_json(), indent=1).encode())
    return path


def load(attempt_dir: Path | None) -> dict[str, Verification]:
    """The attempt's verifications by incident id; a damaged file is skipped (said in the log)."""
    out: dict[str, Verification] = {}
    if attempt_dir is None:
        return out
    from argus.store.files import read_regular_bytes

    d = Path(attempt_dir) / DIRECTORY
    if not d.is_dir():
        return out
    for f in sorted(d.glob("inc-*.json")):
        try:
            v = Verification.from_json(json.loads(read_regular_bytes(f)))
        except Exception as exc:  # noqa: BLE001 - one bad file costs only itself
            import logging

            logging.getLogger("argus.analysis").warning("skipping %s: %s", f, exc)
            continue
        out[v.incident] = v
    return out


def apply(incidents: list[Incident], verifications: dict[str, Verification]) -> None:
    """Put each incident's verification on it: evidence, state, action and a sentence."""
    for inc in incidents:
        v = verifications.get(inc.id)
        if v is None:
            continue
        inc.evidence.append({"level": Level.ACTIVE, "kind": EvidenceKind.VERIFICATION, **v.to_json()})
        if v.outcome == Outcome.CONFIRMED:
            inc.state = State.CONFIRMED
            inc.action = Action.CORDON_NODE  # bounded by the incident: a host must be known, the impact real
            inc.summary += f" — verified: {v.reason}"
        elif v.outcome == Outcome.REFUTED:
            if inc.action == Action.CORDON_NODE or inc.action == Action.VERIFY:
                inc.action = Action.OBSERVE
            inc.summary += f" — the hardware checked healthy ({v.reason}): look at the job, not the node"
        else:
            inc.summary += f" — verification inconclusive: {v.reason}"
    for inc in incidents:
        checked = any(e.get("kind") == EvidenceKind.VERIFICATION and e.get("outcome") == Outcome.CONFIRMED for e in inc.evidence)
        if inc.action == Action.CORDON_NODE and not checked and not any(e.get("level") == Level.HW for e in inc.evidence):
            inc.action = Action.VERIFY
            inc.summary += (" — verify before cordoning (argus verify): the timings agree, but neither an active "
                            "check nor a hardware signal has shown the hardware at fault yet")
