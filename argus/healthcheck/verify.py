"""``argus verify``: an incident's hardware suspect measured beside a healthy peer.

Which probe answers which incident, and how its verdicts settle the claim:

* ``link_degradation`` — the suspect hosts' links (``host_links_busbw_gbs`` of ``--level net``
  started across the hosts): each host is the median of its links to every other host;
* ``compute_straggler`` (a slow GPU, a hot one off its clocks) — the suspect ranks' GPUs, by
  UUID (``gpu:GPU-…``: the store knows which GPU each rank ran on, from its HELLO), measured by
  ``--level gpu`` on the suspect's node beside the node's other GPUs: matrix products, memory
  bandwidth and the burn's clocks, throttling, temperature headroom and power (``gemm_*``,
  ``copy_gbs``, ``burn_*``); or the suspect ranks' matrix products (``rank:N`` of ``--level
  net`` started with the job's ranks). On a CPU-only node ``--level gpu`` measures one
  ``device``, the node's: it is the suspect host's, with no peer beside it.

``confirmed`` when a measured suspect fails (below its peers or its baseline) while the peers
mostly pass; ``refuted`` when every measured suspect passes and so do the peers; otherwise
``inconclusive``, with the reason. Other classes (host stalls, pipeline imbalance, hangs, input
imbalance) have no hardware suspect to measure: verifying them is refused, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from argus.analysis.incident import IncidentClass
from argus.analysis.verification import Outcome, Verification
from argus.healthcheck.model import gpu_subject

__all__ = ["HARDWARE_CLASSES", "COMPUTE_METRICS", "judge", "measures", "plan", "suspects", "with_gpus",
           "NotVerifiable"]

HARDWARE_CLASSES = (IncidentClass.LINK_DEGRADATION, IncidentClass.COMPUTE_STRAGGLER)
#: the figures of a device that a compute straggler's hardware would show (metric prefixes)
COMPUTE_METRICS = ("gemm_", "copy_gbs", "burn_")


class NotVerifiable(ValueError):
    """The incident has no hardware suspect a probe could measure."""


@dataclass(frozen=True)
class _Probe:
    """What measures an incident's suspects: their subjects, the metrics that count, in words."""

    subjects: list[str]
    metrics: tuple[str, ...]  # metric prefixes
    what: str


def _gpus(incident: dict) -> list[str]:
    """The culprits' GPU UUIDs the incident carries (``with_gpus`` completes them from the store);
    a CPU job's ``cpu-…`` placeholders name no GPU."""
    return [str(g) for g in incident.get("gpus") or [] if g and not str(g).startswith("cpu-")]


def _probe(incident: dict) -> _Probe:
    klass = incident["class"]
    if klass == IncidentClass.LINK_DEGRADATION:
        return _Probe([f"host:{h}" for h in incident.get("hosts", [])], ("host_links_busbw",), "links")
    if klass == IncidentClass.COMPUTE_STRAGGLER:
        subjects = [gpu_subject(g) for g in dict.fromkeys(_gpus(incident))]  # --level gpu on the suspect's node
        subjects += [f"rank:{r}" for r in incident.get("culprit_ranks", [])]  # --level net with the job's ranks
        subjects += [f"host:{h}" for h in incident.get("hosts", [])]  # a CPU node's one device
        return _Probe(subjects, COMPUTE_METRICS, "devices")
    raise NotVerifiable(f"{incident.get('id', '?')} is a {klass} incident: no hardware suspect to measure "
                        f"(verifiable: {', '.join(map(str, HARDWARE_CLASSES))})")


def with_gpus(incident: dict, rank_gpus: Mapping[int, str]) -> dict:
    """``incident`` with its culprits' GPUs completed from where the ranks ran (``rank → GPU
    UUID``: the store's topology, from each rank's HELLO, or its ``hw`` rows) — the key of the
    per-GPU figures of ``--level gpu``."""
    ranks = [int(r) for r in incident.get("culprit_ranks", [])]
    gpus = list(dict.fromkeys([*(str(g) for g in incident.get("gpus") or [] if g),
                               *(rank_gpus[r] for r in ranks if rank_gpus.get(r))]))
    return {**incident, "gpus": gpus}


def suspects(incident: dict) -> list[str]:
    """The health-report subjects that measure ``incident``'s suspects."""
    return _probe(incident).subjects


def plan(incident: dict, hosts: list[str]) -> str:
    """What to run, and where, to verify ``incident`` (``hosts``: the job's hosts)."""
    probe = _probe(incident)
    suspect_hosts = incident.get("hosts", [])
    peers = [h for h in hosts if h not in suspect_hosts][:1]
    where = ", ".join(suspect_hosts) + (f" and a peer ({peers[0]})" if peers else "")
    if incident["class"] == IncidentClass.LINK_DEGRADATION:
        cmd = ("torchrun --nnodes N --nproc-per-node 1 … -m argus healthcheck --level net --json > health.json   "
               f"# one rank on each of {where}")
        subjects = ", ".join(probe.subjects) or "the suspects"
    else:
        gpus = [gpu_subject(g) for g in dict.fromkeys(_gpus(incident))]
        on = ", ".join(suspect_hosts) or "the suspect's node"
        cmd = (f"argus healthcheck --level gpu --json > health.json   # on {on}: every local GPU, the suspect's "
               "beside the others\n"
               "  torchrun … -m argus healthcheck --level net --json > health.json   # or: with the job's ranks")
        subjects = ", ".join(gpus or [f"rank:{r}" for r in incident.get("culprit_ranks", [])]) or "the suspects"
    return (f"{incident['id']} ({incident['class']}): measure the {probe.what} of {subjects}:\n"
            f"  {cmd}\nthen: argus verify STORE {incident['id']} --health health.json   (or run the healthcheck "
            "with --store STORE: argus verify then finds it)")


def _subject(verdict: dict, health: dict) -> str:
    """A verdict's subject, ``device`` (one device, the node's: a CPU-only node's gpu level)
    named for the node that measured it."""
    s = str(verdict.get("subject", ""))
    return f"host:{health.get('host', '')}" if s == "device" else s


def _statuses(probe: _Probe, health: dict) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """Per subject of ``health`` that the probe's metrics measured: its status (``fail`` when
    any of its figures fails; ``new`` — nothing to compare with — is not a pass) and its verdicts."""
    status: dict[str, str] = {}
    used: dict[str, list[dict]] = {}
    for v in health.get("verdicts", []):
        if not str(v.get("metric", "")).startswith(probe.metrics):
            continue
        s = _subject(v, health)
        used.setdefault(s, []).append({**{k: v.get(k) for k in ("metric", "size_bytes", "value", "unit", "status",
                                                                 "deficit", "why")}, "subject": s})
        now, prev = str(v.get("status")), status.get(s)
        status[s] = "fail" if "fail" in (now, prev) else ("new" if "new" in (now, prev) else "pass")
    return status, used


def measures(incident: dict, health: dict) -> bool:
    """Did ``health`` measure one of ``incident``'s suspects with a figure that answers it?"""
    probe = _probe(incident)
    status, _ = _statuses(probe, health)
    return any(s in status for s in probe.subjects)


def judge(incident: dict, health: dict) -> Verification:
    """The verification of ``incident`` (its JSON) by ``health`` (``argus healthcheck --json``)."""
    probe = _probe(incident)
    subjects, what = probe.subjects, probe.what
    status, used = _statuses(probe, health)
    measured = [s for s in subjects if s in status]
    peers = [s for s in status if s not in subjects]
    checks = [c for s in measured + peers for c in used[s]]

    def verification(outcome: Outcome, reason: str) -> Verification:
        return Verification(str(incident["id"]), str(incident["class"]), outcome, reason, measured or subjects,
                            peers, checks[:64], str(health.get("host", "")))

    if not measured:
        return verification(Outcome.INCONCLUSIVE, (
            f"the health report measured no {what} of {', '.join(subjects) or 'the suspects'}: run it where they are "
            f"(it measured {', '.join(sorted(status)[:6]) or 'nothing comparable'})"))
    failed = [s for s in measured if status[s] == "fail"]
    new = [s for s in measured if status[s] == "new"]
    peers_ok = [p for p in peers if status[p] == "pass"]
    peers_bad = [p for p in peers if status[p] == "fail"]
    if failed and len(peers_ok) > len(peers_bad):
        worst = max((c for c in checks if c["subject"] in failed and c["status"] == "fail"),
                    key=lambda c: c.get("deficit") or 0.0)
        return verification(Outcome.CONFIRMED, (
            f"{', '.join(failed)}: {worst['metric']} {100 * (worst.get('deficit') or 0):.0f}% down "
            f"({worst.get('why') or 'below its peers'}) while {len(peers_ok)} peer(s) pass"))
    if not failed and not new and peers_ok and not peers_bad:
        return verification(Outcome.REFUTED,
                            f"the {what} of {', '.join(measured)} measure like their {len(peers_ok)} peer(s)'")
    if not peers_ok:
        why = "no healthy peer was measured beside the suspects"
    elif new:
        why = f"{', '.join(new)} had nothing to compare with (no baseline, no peers)"
    else:
        why = (f"{len(peers_bad)} of {len(peers)} peer(s) failed too ({', '.join(peers_bad[:4])}): the probe "
               "cannot single the suspect out")
    return verification(Outcome.INCONCLUSIVE, why)
