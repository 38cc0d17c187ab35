"""``argus verify``: an incident's hardware suspect measured beside a healthy peer.

Which probe answers which incident, and how its verdicts settle the claim:

* ``link_degradation`` — the suspect hosts' links (``host_links_busbw_gbs`` of ``--level net``
  started across the hosts): each host is the median of its links to every other host;
* ``compute_straggler`` (a slow GPU, a hot one off its clocks) — the suspect ranks' matrix
  products (``gemm_*`` of ``--level net``, started with the job's ranks, or of ``--level gpu`` on
  the suspect's node, where its subject is the host).

``confirmed`` when a measured suspect fails (below its peers or its baseline) while the peers
mostly pass; ``refuted`` when every measured suspect passes and so do the peers; otherwise
``inconclusive``, with the reason. Other classes (host stalls, pipeline imbalance, hangs, input
imbalance) have no hardware suspect to measure: verifying them is refused, not guessed.
"""

from __future__ import annotations

from argus.analysis.incident import IncidentClass
from argus.analysis.verification import Outcome, Verification

__all__ = ["HARDWARE_CLASSES", "judge", "plan", "suspects", "NotVerifiable"]

HARDWARE_CLASSES = (IncidentClass.LINK_DEGRADATION, IncidentClass.COMPUTE_STRAGGLER)


class NotVerifiable(ValueError):
    """The incident has no hardware suspect a probe could measure."""


def _suspects(incident: dict) -> tuple[list[str], str, str]:
    """(subjects, metric prefix, what) for the incident's class."""
    klass = incident["class"]
    if klass == IncidentClass.LINK_DEGRADATION:
        return [f"host:{h}" for h in incident.get("hosts", [])], "host_links_busbw", "links"
    if klass == IncidentClass.COMPUTE_STRAGGLER:
        subjects = [f"rank:{r}" for r in incident.get("culprit_ranks", [])]
        subjects += [f"host:{h}" for h in incident.get("hosts", [])]  # --level gpu on the suspect's node
        return subjects, "gemm_", "matrix products"
    raise NotVerifiable(f"{incident.get('id', '?')} is a {klass} incident: no hardware suspect to measure "
                        f"(verifiable: {', '.join(map(str, HARDWARE_CLASSES))})")


def suspects(incident: dict) -> list[str]:
    """The health-report subjects that measure ``incident``'s suspects."""
    return _suspects(incident)[0]


def plan(incident: dict, hosts: list[str]) -> str:
    """What to run, and where, to verify ``incident`` (``hosts``: the job's hosts)."""
    subjects, _, what = _suspects(incident)
    suspects = incident.get("hosts", [])
    peers = [h for h in hosts if h not in suspects][:1]
    where = ", ".join(suspects) + (f" and a peer ({peers[0]})" if peers else "")
    if incident["class"] == IncidentClass.LINK_DEGRADATION:
        cmd = ("torchrun --nnodes N --nproc-per-node 1 … -m argus healthcheck --level net --json > health.json   "
               f"# one rank on each of {where}")
    else:
        cmd = ("torchrun … -m argus healthcheck --level net --json > health.json   # with the job's ranks, or\n"
               f"argus healthcheck --level gpu --json > health.json   # on {where}")
    return (f"{incident['id']} ({incident['class']}): measure the {what} of {', '.join(subjects) or 'the suspects'}:\n"
            f"  {cmd}\nthen: argus verify STORE {incident['id']} --health health.json   (or run the healthcheck "
            "with --store STORE: argus verify then finds it)")


def judge(incident: dict, health: dict) -> Verification:
    """The verification of ``incident`` (its JSON) by ``health`` (``argus healthcheck --json``)."""
    subjects, prefix, what = _suspects(incident)
    status: dict[str, str] = {}
    used: dict[str, list[dict]] = {}
    for v in health.get("verdicts", []):
        if not str(v.get("metric", "")).startswith(prefix):
            continue
        s = str(v.get("subject", ""))
        used.setdefault(s, []).append({k: v.get(k) for k in ("subject", "metric", "size_bytes", "value", "unit",
                                                             "status", "deficit", "why")})
        # a subject fails when any of its figures fails; "new" (nothing to compare with) is not a pass
        now = str(v.get("status"))
        prev = status.get(s)
        status[s] = "fail" if "fail" in (now, prev) else ("new" if "new" in (now, prev) else "pass")
    measured = [s for s in subjects if s in status]
    peers = [s for s in status if s not in subjects]
    checks = [c for s in measured + peers for c in used[s]]
    base = dict(incident=str(incident["id"]), klass=str(incident["class"]), suspects=measured or subjects,
                peers=peers, checks=checks[:64], health_host=str(health.get("host", "")))
    if not measured:
        return Verification(outcome=Outcome.INCONCLUSIVE, reason=(
            f"the health report measured no {what} of {', '.join(subjects) or 'the suspects'}: run it where they are "
            f"(it measured {', '.join(sorted(status)[:6]) or 'nothing comparable'})"), **base)
    failed = [s for s in measured if status[s] == "fail"]
    new = [s for s in measured if status[s] == "new"]
    peers_ok = [p for p in peers if status[p] == "pass"]
    peers_bad = [p for p in peers if status[p] == "fail"]
    if failed and len(peers_ok) > len(peers_bad):
        worst = max((c for c in checks if c["subject"] in failed and c["status"] == "fail"),
                    key=lambda c: c.get("deficit") or 0.0)
        return Verification(outcome=Outcome.CONFIRMED, reason=(
            f"{', '.join(failed)}: {worst['metric']} {100 * (worst.get('deficit') or 0):.0f}% down "
            f"({worst.get('why') or 'below its peers'}) while {len(peers_ok)} peer(s) pass"), **base)
    if not failed and not new and peers_ok and not peers_bad:
        return Verification(outcome=Outcome.REFUTED, reason=(
            f"the {what} of {', '.join(measured)} measure like their {len(peers_ok)} peer(s)'"), **base)
    if not peers_ok:
        why = "no healthy peer was measured beside the suspects"
    elif new:
        why = f"{', '.join(new)} had nothing to compare with (no baseline, no peers)"
    else:
        why = (f"{len(peers_bad)} of {len(peers)} peer(s) failed too ({', '.join(peers_bad[:4])}): the probe "
               "cannot single the suspect out")
    return Verification(outcome=Outcome.INCONCLUSIVE, reason=why, **base)
