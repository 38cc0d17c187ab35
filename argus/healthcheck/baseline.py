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
           "judge", "changed_versions", "paired_bound"]

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
        out.append(_verdict(m, b.value if b else None, rest, threshold, mine, b.noise if b else 0.0,
                            b.samples if b else ()))
    return out


#: A latency (µs, messages below ``LATENCY_BYTES``) fails from this much slower than its reference
#: (1.5×): a loopback or NVLink latency is a few µs of software and scheduling, whose spread is
#: larger than a bandwidth's
LATENCY_TOLERANCE = 0.5
#: With rounds on both sides, a figure fails only where its deficit is beyond the line with this
#: confidence: the lower bound of a bootstrap interval of the ratio of the two runs' medians
CONFIDENCE = 0.95
BOOTSTRAP = 2000
MIN_SAMPLES = 3


def deficit_bound(now: np.ndarray, ref: np.ndarray, confidence: float = CONFIDENCE) -> float:
    """The deficit ``1 − median(now)/median(ref)`` (values: higher is better) that the rounds show
    with ``confidence``: one minus the upper quantile of the ratio of medians over bootstrap
    resamples of both. Deterministic (a fixed seed): the same rounds, the same verdict."""
    rng = np.random.default_rng(0)
    a = np.median(rng.choice(now, (BOOTSTRAP, now.size)), axis=1)
    b = np.median(rng.choice(ref, (BOOTSTRAP, ref.size)), axis=1)
    return 1.0 - float(np.quantile(a / b, confidence))


def paired_bound(ratios: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(deficit, its bound with ``confidence``) from round-by-round ratios to a reference measured
    beside it (higher is better): one minus their geometric mean, and one minus the upper quantile
    of that mean over bootstrap resamples of the rounds. Deterministic (a fixed seed)."""
    logs = np.log(np.maximum(np.asarray(ratios, dtype=np.float64), 1e-12))
    rng = np.random.default_rng(0)
    means = rng.choice(logs, (BOOTSTRAP, logs.size)).mean(axis=1)
    return 1.0 - float(np.exp(logs.mean())), 1.0 - float(np.exp(np.quantile(means, confidence)))


def _oriented(m: Measurement, xs) -> np.ndarray:  # type: ignore[no-untyped-def]
    x = np.asarray(xs, dtype=np.float64)
    return x if m.higher_is_better else 1.0 / np.maximum(x, 1e-12)


def _shortfall(m: Measurement, d: float, what: str, ref: float) -> str:
    if m.higher_is_better:
        return f"{d:.0%} below {what} ({ref:.4g} {m.unit})"
    return f"{1.0 / max(1.0 - d, 1e-12):.2f}× {what} latency ({ref:.4g} {m.unit})"


def _verdict(m: Measurement, b: float | None, rest: list[Measurement], threshold: float,
             changed: list[str], b_noise: float = 0.0, b_samples: tuple[float, ...] = ()) -> Verdict:
    """Where both sides were measured in rounds, the deficit must pass the line with confidence
    (``deficit_bound``); a figure of one value each (an older baseline, a probe measured once)
    keeps the noise rule: a deficit beyond twice the measured noise and the line."""
    if not m.higher_is_better:
        line = 1.0 - 1.0 / (1.0 + LATENCY_TOLERANCE)
    else:
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
    value = float(_oriented(m, [m.value])[0])

    def point(ref: float | None) -> float:
        return 1.0 - value / float(_oriented(m, [ref])[0]) if ref else 0.0

    d_base, d_peer = point(b), point(peers)
    d_expected = 1.0 - m.value / m.expected if m.expected else 0.0
    deficit = max(d_base, d_peer, d_expected, 0.0)
    if b is None and peers is None and m.expected is None:
        return Verdict(m, Status.NEW, None, None, 0.0, "no baseline and no peers to compare with")
    mine = _oriented(m, m.samples) if len(m.samples) >= MIN_SAMPLES else None
    fails_base = b is not None and d_base >= limit_base
    if b is not None and mine is not None and len(b_samples) >= MIN_SAMPLES:
        # the baseline's own runs differed this much (``HealthReport.with_runs``): no verdict inside it
        limit_base = max(line, min(NOISE_K * b_noise, NOISE_CAP))
        fails_base = deficit_bound(mine, _oriented(m, b_samples)) >= limit_base
    fails_peer = peers is not None and d_peer >= limit_peer
    pooled = [x for r in rest for x in r.samples] if rest and all(len(r.samples) >= MIN_SAMPLES for r in rest) else []
    if peers is not None and mine is not None and pooled:
        if len(rest) >= 2:
            # peers measured now, side by side: no verdict inside twice what they differ among
            # themselves (their medians' spread), rather than what one round differs from the next
            # (a median of many rounds moves far less than a round: a host whose every link was
            # throttled by a fifth hid inside its peers' round-to-round spread)
            values = [float(_oriented(x, [x.value])[0]) for x in rest]
            limit_peer = max(line, min(NOISE_K * (1.0 - min(values) / max(values)), NOISE_CAP))
        # else one peer: no spread among peers to read, the rounds' spread stands
        fails_peer = deficit_bound(mine, _oriented(m, pooled)) >= limit_peer
    paired_with = ""
    if len(m.paired) >= MIN_SAMPLES and m.higher_is_better:
        # measured round by round beside its peers: the paired ratios decide (a round the whole
        # machine ran slow in cancels out; no spread among subjects to allow for). Judged against
        # its peers only: against the baseline, a healthy host that shares one link with a
        # throttled one reads low too (its victim), and a whole cluster's slowdown is its links'
        # and the job's figures to tell, each against the baseline
        d_peer, bound = paired_bound(np.asarray(m.paired))
        peers = m.value / max(1.0 - d_peer, 1e-12)
        fails_peer = bound >= line
        fails_base = False
        d_base = 0.0
        paired_with = f" (round by round, {len(m.paired)} rounds, against the links between its peers)"
        deficit = max(d_base, d_peer, d_expected, 0.0)
    reasons = []
    if m.expected is not None and m.value < m.expected:  # a reported maximum: any shortfall, no noise
        reasons.append(f"below the hardware's maximum ({m.value:.4g} of {m.expected:.4g} {m.unit})")
    if fails_base and b is not None:
        reasons.append(_shortfall(m, d_base, "this node's baseline", b))
    if fails_peer and peers is not None:
        reasons.append(_shortfall(m, d_peer, "its peers' median", peers) + paired_with)
    if reasons and changed:
        reasons.append("the baseline was taken with other " + ", ".join(changed))
    status = Status.FAIL if reasons else Status.PASS
    return Verdict(m, status, b, peers, deficit, "; ".join(reasons) or f"within {min(limit_base, limit_peer):.0%}")
