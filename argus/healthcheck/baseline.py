"""Baselines: what this node measured before, and the verdicts against it and against peers.

A node is compared with its own earlier numbers (saved with ``--save-baseline`` after delivery
and after every driver, firmware or network change) and, where one run measures several
subjects of the same metric (ranks, GPUs), with the median of the others: a deficit of
``threshold`` (default 10%) or more against either fails. Latency-bound messages (below 1 MiB)
vary more from run to run and fail only at three times the threshold; a figure whose own
run-to-run spread was measured (a link's rounds) fails only beyond twice that spread; a figure
the hardware states a maximum for (a GPU's PCIe link generation and width) fails below it.

Where there are GPUs, each GPU's figures are keyed by its UUID (``gpu:GPU-…``), so a baseline is
per GPU within the node's file: a GPU moved to another slot keeps its own reference, a replaced
one starts anew (``new`` against the baseline, still judged against the other GPUs).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from argus import env as argus_env
from argus.healthcheck.model import HealthReport, Measurement, Status, Verdict

__all__ = ["DEFAULT_THRESHOLD", "LATENCY_BYTES", "default_dir", "baseline_path", "save_baseline", "load_baseline",
           "judge", "changed_versions"]

DEFAULT_THRESHOLD = 0.10
LATENCY_BYTES = 1 << 20  # messages below this are latency-bound: judged at 3 × the threshold
NOISE_K, NOISE_CAP = 2.0, 0.75  # a deficit must exceed twice the measured noise, at most this


def default_dir() -> Path:
    return Path(os.environ.get(argus_env.HEALTHCHECK_DIR, Path.home() / ".argus" / "healthcheck"))


def baseline_path(directory: Path, host: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"
    return Path(directory) / f"{safe}.json"


def save_baseline(report: HealthReport, directory: Path) -> Path:
    path = baseline_path(directory, report.host)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=1))
    tmp.replace(path)  # a reader never sees half a baseline
    return path


def load_baseline(directory: Path, host: str) -> HealthReport | None:
    path = baseline_path(directory, host)
    if not path.exists():
        return None
    try:
        return HealthReport.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a baseline this version reads ({exc})") from None


def changed_versions(report: HealthReport, baseline: HealthReport | None) -> list[str]:
    """The versions that differ from the baseline's. A key may name the subject it belongs to
    after a space (``vbios gpu:GPU-…``): a GPU's firmware is that GPU's, not the node's."""
    if baseline is None:
        return []
    return sorted(k for k, v in baseline.versions.items() if report.versions.get(k) != v)


def _concerns(key: str, subject: str) -> bool:
    scope = key.partition(" ")[2]
    return not scope or scope in subject


def judge(report: HealthReport, baseline: HealthReport | None, threshold: float = DEFAULT_THRESHOLD) -> list[Verdict]:
    """One verdict per measurement: against the baseline's same measurement, the peers', and
    the figure the hardware says it should reach (``Measurement.expected``)."""
    base = {m.key: m for m in baseline.measurements} if baseline is not None else {}
    by_metric: dict[tuple, list[Measurement]] = defaultdict(list)
    for m in report.measurements:
        by_metric[(m.level, m.metric, m.size_bytes)].append(m)
    changed = changed_versions(report, baseline)
    out = []
    for m in report.measurements:
        rest = [x for x in by_metric[(m.level, m.metric, m.size_bytes)] if x.subject != m.subject]
        mine = [k.partition(" ")[0] for k in changed if _concerns(k, m.subject)]
        b = base.get(m.key)
        out.append(_verdict(m, b.value if b else None, rest, threshold, mine, b.noise if b else 0.0))
    return out


def _verdict(m: Measurement, b: float | None, rest: list[Measurement], threshold: float,
             changed: list[str], b_noise: float = 0.0) -> Verdict:
    line = threshold * (3 if 0 < m.size_bytes < LATENCY_BYTES else 1)
    peers = float(np.median([x.value for x in rest])) if rest else None
    # never a deficit inside twice the measured noise of what it is compared with — the
    # peers' (their rounds' spread: a slowed subject's own erratic rounds must not excuse
    # it) or, against its baseline, the larger of its own and the baseline's: two runs of a few
    # rounds each are compared, and the baseline's rounds are noise too (a healthy loopback
    # link failed once in CI against a baseline taken a minute before) — up to NOISE_CAP
    peer_noise = float(np.median([x.noise for x in rest])) if rest else 0.0
    limit_peer = max(line, min(NOISE_K * peer_noise, NOISE_CAP))
    limit_base = max(line, min(NOISE_K * max(m.noise, b_noise), NOISE_CAP))
    d_base = 1.0 - m.value / b if b else 0.0
    d_peer = 1.0 - m.value / peers if peers else 0.0
    d_expected = 1.0 - m.value / m.expected if m.expected else 0.0
    deficit = max(d_base, d_peer, d_expected, 0.0)
    if b is None and peers is None and m.expected is None:
        return Verdict(m, Status.NEW, None, None, 0.0, "no baseline and no peers to compare with")
    reasons = []
    if m.expected is not None and m.value < m.expected:  # a reported maximum: any shortfall, no noise
        reasons.append(f"below the hardware's maximum ({m.value:.4g} of {m.expected:.4g} {m.unit})")
    if b is not None and d_base >= limit_base:
        reasons.append(f"{d_base:.0%} below this node's baseline ({b:.4g} {m.unit})")
    if peers is not None and d_peer >= limit_peer:
        reasons.append(f"{d_peer:.0%} below its peers' median ({peers:.4g} {m.unit})")
    if reasons and changed:
        reasons.append("the baseline was taken with other " + ", ".join(changed))
    status = Status.FAIL if reasons else Status.PASS
    return Verdict(m, status, b, peers, deficit, "; ".join(reasons) or f"within {min(limit_base, limit_peer):.0%}")
