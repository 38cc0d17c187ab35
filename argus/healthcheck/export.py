"""A health check as Prometheus series (remote write), beside the jobs' own ``argus_*`` series:
alert on a node out of service, graph a link's bus bandwidth against its baseline.

* ``argus_health_value{host, level, metric, subject, size_bytes, unit}`` — the figure measured;
* ``argus_health_deficit{…}`` — its shortfall against the baseline or the peers (a fraction);
* ``argus_health_pass{…}`` — 1 passed, 0 failed (figures with nothing to compare with: absent);
* ``argus_node_in_service{host}`` — 1 in service, 0 out (a failed check, none passed since),
  for each node the check judged, from the store's history when it has one.

All samples carry the check's start time, so a re-sent check overwrites nothing newer.
"""

from __future__ import annotations

import numpy as np

from argus.tsdb.remote_write import compress, encode_labels, encode_write_request

__all__ = ["health_write_request", "health_series"]


def health_series(doc: dict, standings: list | None = None) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every series a health document (``argus healthcheck --json``) gives."""
    from argus.healthcheck.standing import Standing, judged_nodes

    host = str(doc.get("host") or "unknown")
    out: list[tuple[dict[str, str], float]] = []
    for v in doc.get("verdicts", []):
        base = {"host": host, "level": str(v.get("level", "")), "metric": str(v.get("metric", "")),
                "subject": str(v.get("subject", "")), "size_bytes": str(int(v.get("size_bytes") or 0))}
        out.append(({"__name__": "argus_health_value", **base, "unit": str(v.get("unit", ""))},
                    float(v.get("value", np.nan))))
        out.append(({"__name__": "argus_health_deficit", **base}, float(v.get("deficit") or 0.0)))
        if str(v.get("status")) in ("pass", "fail"):
            out.append(({"__name__": "argus_health_pass", **base}, 1.0 if v.get("status") == "pass" else 0.0))
    if standings:
        nodes = {n.host: n.standing == Standing.IN for n in standings}
    else:
        nodes = {h: not failing for h, failing in judged_nodes(doc).items()}
    out += [({"__name__": "argus_node_in_service", "host": h}, 1.0 if ok else 0.0) for h, ok in sorted(nodes.items())]
    return out


def health_write_request(doc: dict, standings: list | None = None) -> bytes:
    """One compressed remote-write body holding :func:`health_series` at the check's start time."""
    series = health_series(doc, standings)
    labels = [encode_labels(sorted(lab.items())) for lab, _ in series]
    ts = np.full(len(series), int(float(doc.get("started_s", 0.0)) * 1000), np.int64)
    body = encode_write_request(labels, np.arange(len(series)), ts, np.array([v for _, v in series], np.float64))
    return compress(body)
