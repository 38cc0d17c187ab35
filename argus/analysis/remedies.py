"""The specific remedy for an incident's cause — what an operator changes, not only who to act on.

Named from the incident's class and, for a host stall, the cause its stacks or host phases named
(``l5_stacks.CAUSES``). A structural or software cause never gets a hardware remedy: replacing a
node fixes neither a garbage-collection pause nor a stage partition.
"""

from __future__ import annotations

import re
from typing import Any

from argus.vocab import EvidenceKind

__all__ = ["remedy", "named_cause", "in_the_job", "STALL_REMEDIES"]

#: host-stall cause → what to change in the job
STALL_REMEDIES = {
    "garbage_collection": "Python GC pauses: call gc.freeze() after start-up, or gc.disable() and gc.collect() "
                          "at step boundaries so that collections land between steps on every rank at once",
    "jit_compile": "JIT compilation inside the loop: keep a persistent compile cache (TORCHINDUCTOR_CACHE_DIR, "
                   "torch.compiler cache artifacts), pre-warm the shapes the job meets, mark dynamic dimensions",
    "data_loading": "input pipeline: more DataLoader workers, a larger prefetch_factor, pin_memory=True, "
                    "persistent_workers=True; check the storage it reads from",
    "checkpoint_io": "checkpoint writes on the training path: save asynchronously (torch.distributed.checkpoint "
                     "async_save) or less often, to faster storage",
}

_BY_CLASS = {
    "host_stall": "a host-side stall of unnamed cause: raise trace fidelity on the culprits (stacks at 10 Hz) to "
                  "name it",
    "pipeline_imbalance": "pipeline stages unequal: move layers off the slow stage (or use an interleaved "
                          "schedule); no node is at fault",
    "input_imbalance": "uneven inputs across data-parallel ranks: pack or bucket sequences by length so every "
                       "rank gets the same work; no node is at fault",
    "job_slowdown": "every rank slowed alike: no device, link or stage stands out — compare the job's inputs, "
                    "code and software versions, and the cluster's load, before and after the regression",
    "compute_straggler": "a slow device or slow work on it: argus verify (a healthcheck of the suspect beside a "
                         "peer) tells which before a replacement; if it checks healthy, look at what the job runs on "
                         "that rank",
    "link_degradation": "a slow link: verify it (argus verify), then route around it or cordon the host at the "
                        "next checkpoint",
    "hang": "a rank stopped: checkpoint if the job still can, restart, and read the stuck rank's stack",
    "silent_data_corruption": "a replica computes wrong values without an error: stop trusting its state, resume "
                              "from the last checkpoint before the exposure without that GPU, and have the GPU "
                              "tested (a vendor diagnostic) before it returns",
    "fail_stop": "a rank failed: read its last error in the job log (the exception and its line, the signal that "
                 "killed it), fix what it says, and restart from the last checkpoint",
}


def named_cause(evidence: list[Any]) -> str | None:
    """The stall cause the host phases or stacks named (None: none named)."""
    for kind in ("host_phases", "stacks"):
        for e in evidence:
            if isinstance(e, dict) and e.get("kind") == kind and e.get("cause") not in (None, "", "unknown"):
                return str(e["cause"])
    return None


_VERIFIED = {
    "confirmed": "the hardware is confirmed below its peers by an active check: drain the node at the next "
                 "checkpoint and have it repaired; re-admit it only once argus healthcheck passes there",
    "refuted": "the hardware checked healthy: the slowdown is in what the job runs on these ranks (its data, its "
               "code path, its placement), not in the node",
}


#: A failed rank's own line that says its GPU failed (the hardware's word, not an inference)
_HARDWARE_WORDS = re.compile(r"\bECC\b|fallen off the bus|\bXid\b|NVRM", re.IGNORECASE)
HARDWARE_FAILURE = ("the GPU reported a hardware fault itself (an uncorrectable ECC error, an Xid): drain its host or "
                    "exclude the GPU, then restart from the last checkpoint without it")


def hardware_failure(evidence: list[Any]) -> bool:
    """Whether a fail-stop's log lines are its GPU's own report of a hardware fault."""
    return any(isinstance(e, dict) and e.get("kind") == EvidenceKind.LOG_LINES and any(
        isinstance(x, dict) and x.get("kind") in ("xid", "cuda_error") and _HARDWARE_WORDS.search(str(x.get("text", "")))
        for x in e.get("events", [])) for e in evidence)


def remedy(klass: str, evidence: list[Any]) -> str:
    """The remedy for an incident of ``klass`` with ``evidence``; "" for a healthy observation."""
    if klass == "fail_stop" and hardware_failure(evidence):
        return HARDWARE_FAILURE
    if klass == "host_stall":
        cause = named_cause(evidence)
        if cause in STALL_REMEDIES:
            return STALL_REMEDIES[cause]
    if klass in ("compute_straggler", "link_degradation"):
        outcome = next((e.get("outcome") for e in reversed(evidence)
                        if isinstance(e, dict) and e.get("kind") == EvidenceKind.VERIFICATION), None)
        if outcome in _VERIFIED:
            return _VERIFIED[outcome]
    return _BY_CLASS.get(klass, "")


def in_the_job(klass: str, evidence: list[Any]) -> bool:
    """Whether the cause is the job's own (its structure, its software), never a node's."""
    return klass in ("pipeline_imbalance", "input_imbalance", "job_slowdown") or (
        klass == "host_stall" and named_cause(evidence) in STALL_REMEDIES)
