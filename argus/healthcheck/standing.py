"""Which nodes are in service: a node that failed a health check stays out until a later check
of it passes — its re-admission, recorded with the check that granted it.

Read from the health documents a store keeps (``records.stored_health``), oldest first. A
document judges the nodes its verdicts name: ``host:X`` subjects (a net check across hosts
judges each host's links), and its own host for the node-local subjects (``device``,
``gpu:N``) and for ranks it ran on that host (``rank_hosts``, where the net check recorded
them). A subject no node can be named for (``ranks:0-7``, a ``link:a~b`` — its hosts are
judged through their ``host:`` figures) judges none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from argus.healthcheck.records import stored_health

__all__ = ["Standing", "NodeStanding", "node_standings", "judged_nodes"]


class Standing(StrEnum):
    IN = "in"  # its last check passed (or it never failed one)
    OUT = "out"  # it failed a check, and none has passed since


@dataclass
class NodeStanding:
    host: str
    standing: Standing
    last_check_s: float  # the newest check that judged this node
    checks: int  # how many checks judged it
    #: the failures that took it out (``metric subject``), from the check that did; empty while in
    failing: list[str] = field(default_factory=list)
    out_since_s: float | None = None  # the first failed check of the current (or last) spell out
    #: every re-admission: (failed at, re-admitted at) — the failed check that took it out and the
    #: passing check that brought it back
    readmissions: list[tuple[float, float]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"host": self.host, "standing": str(self.standing), "last_check_s": self.last_check_s,
                "checks": self.checks, "failing": self.failing, "out_since_s": self.out_since_s,
                "readmissions": [{"failed_s": a, "readmitted_s": b} for a, b in self.readmissions]}


_LOCAL = ("device", "gpu:")


def judged_nodes(doc: dict) -> dict[str, list[str]]:
    """Node → the failing figures (``metric subject``) a health document judged it by; a node
    with an empty list passed every figure that named it. ``new`` figures (nothing to compare
    with) judge nothing."""
    own = str(doc.get("host") or "")
    listed = doc.get("rank_hosts")
    rank_hosts: list = listed if isinstance(listed, list) else []
    out: dict[str, list[str]] = {}
    for v in doc.get("verdicts", []):
        if not isinstance(v, dict) or str(v.get("status")) not in ("pass", "fail"):
            continue
        subject = str(v.get("subject", ""))
        host = ""
        if subject.startswith("host:"):
            host = subject[5:]
        elif subject == "device" or subject.startswith("gpu:"):
            host = own
        elif subject.startswith("rank:") and subject[5:].isdigit() and int(subject[5:]) < len(rank_hosts):
            host = str(rank_hosts[int(subject[5:])])
        if not host:
            continue
        failing = out.setdefault(host, [])
        if str(v.get("status")) == "fail":
            failing.append(f"{v.get('metric')} {subject}")
    return out


def node_standings(store_root: Path) -> list[NodeStanding]:
    """Every node the store's health checks judged, by host name."""
    docs = sorted(stored_health(store_root), key=lambda fd: float(fd[1].get("started_s", 0.0)))
    nodes: dict[str, NodeStanding] = {}
    for _path, doc in docs:
        at = float(doc.get("started_s", 0.0))
        for host, failing in judged_nodes(doc).items():
            n = nodes.get(host)
            if n is None:
                n = nodes[host] = NodeStanding(host, Standing.IN, at, 0)
            n.checks += 1
            n.last_check_s = at
            if failing:
                if n.standing == Standing.IN:
                    n.out_since_s = at
                n.standing, n.failing = Standing.OUT, sorted(set(failing))
            elif n.standing == Standing.OUT:
                assert n.out_since_s is not None
                n.readmissions.append((n.out_since_s, at))
                n.standing, n.failing = Standing.IN, []
    return sorted(nodes.values(), key=lambda n: (n.standing != Standing.OUT, n.host))
