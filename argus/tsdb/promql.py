"""A small client of the Prometheus HTTP query API, and the ``prom://`` URL that names a job.

``prom://HOST:PORT[/PREFIX]?job=J[&run=R][&attempt=A][&start=T][&end=T][&lookback=D]``
(``prom+https://`` for TLS). ``PREFIX`` is for servers that mount the API under a path,
e.g. VictoriaMetrics cluster's ``/select/0/prometheus``. ``start``/``end`` are Unix
seconds and bound what is read; ``lookback`` (Prometheus duration, default ``7d``) is how
far back the job's attempts are looked for.

Raw samples come from *instant* queries of range selectors (``metric{…}[Nms]`` at time
``t``): they return every stored sample in ``(t − N, t]`` with its own timestamp and value,
where ``query_range`` would resample at a fixed step. Prometheus and VictoriaMetrics answer
them alike; long ranges are read in chunks so no single answer grows without bound.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np

from argus.errors import TsdbError

__all__ = ["PromUrl", "PromClient", "RawSeries", "parse_prom_url", "is_prom_url", "parse_duration_s"]

_SCHEMES = {"prom": "http", "prom+http": "http", "prom+https": "https"}
_PARAMS = {"job", "run", "attempt", "start", "end", "lookback"}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def is_prom_url(text: str) -> bool:
    return str(text).split("://", 1)[0] in _SCHEMES and "://" in str(text)


def parse_duration_s(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m:
        raise TsdbError(f"bad duration {text!r}: expected a number and a unit (ms, s, m, h, d, w, y), e.g. 7d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True, slots=True)
class PromUrl:
    base: str  # http(s)://host:port[/prefix], no trailing slash
    job: str
    run: str | None = None
    attempt: str | None = None
    start_s: float | None = None
    end_s: float | None = None
    lookback_s: float = 7 * 86400.0
    text: str = ""


def parse_prom_url(text: str) -> PromUrl:
    """Parse a ``prom://`` URL; :class:`TsdbError` names what is wrong and how to write it."""
    example = "prom://127.0.0.1:9090?job=argus&run=RUN_ID"
    scheme, _, rest = str(text).partition("://")
    if scheme not in _SCHEMES or not rest:
        raise TsdbError(f"{text!r} is not a prom:// URL (e.g. {example})")
    parts = urllib.parse.urlsplit(f"{_SCHEMES[scheme]}://{rest}")
    if not parts.hostname:
        raise TsdbError(f"{text!r}: no host (e.g. {example})")
    try:
        _ = parts.port
    except ValueError:
        raise TsdbError(f"{text!r}: bad port (e.g. {example})") from None
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - _PARAMS)
    if unknown:
        raise TsdbError(f"{text!r}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(_PARAMS))}")
    one = {k: v[-1] for k, v in query.items()}
    if not one.get("job"):
        raise TsdbError(f"{text!r}: the job label is required (…?job=NAME; the processor's --remote-write-job, "
                        "default 'argus')")

    def seconds(key: str) -> float | None:
        if key not in one:
            return None
        try:
            return float(one[key])
        except ValueError:
            raise TsdbError(f"{text!r}: {key}={one[key]!r} is not Unix seconds") from None

    base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
    return PromUrl(base=base, job=one["job"], run=one.get("run") or None, attempt=one.get("attempt") or None,
                   start_s=seconds("start"), end_s=seconds("end"),
                   lookback_s=parse_duration_s(one["lookback"]) if "lookback" in one else 7 * 86400.0, text=str(text))


@dataclass
class RawSeries:
    """One query answer flattened: a row per sample, label values repeated per row."""

    ts_ms: np.ndarray
    values: np.ndarray
    labels: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.ts_ms)


class PromClient:
    """GET requests against ``/api/v1/*``; every failure is a :class:`TsdbError` naming the server."""

    def __init__(self, base: str, timeout_s: float = 60.0, chunk_s: float = 3600.0):
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s
        self.chunk_s = chunk_s

    def get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read(2000).decode(errors="replace")
            try:
                body = json.loads(body).get("error", body)
            except ValueError:
                pass
            raise TsdbError(f"{self.base}: {path} answered HTTP {exc.code}: {str(body).strip()[:300]}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TsdbError(f"{self.base}: cannot reach the Prometheus API ({reason}); is the server up and the "
                            "address right?") from None
        except ValueError:
            raise TsdbError(f"{self.base}: {path} did not answer JSON; is this a Prometheus-compatible API?") from None
        if doc.get("status") != "success":
            raise TsdbError(f"{self.base}: {path} failed: {doc.get('error', doc)}")
        return doc.get("data")

    def query(self, expr: str, at_s: float) -> dict[str, Any]:
        return self.get("/api/v1/query", {"query": expr, "time": f"{at_s:.3f}"})

    def raw(self, selector: str, start_s: float, end_s: float, labels: tuple[str, ...]) -> RawSeries:
        """Every sample of ``selector`` in ``(start_s, end_s]``, with the named labels."""
        chunks: list[tuple[dict, list]] = []
        lo_ms, end_ms, step_ms = int(start_s * 1000), int(np.ceil(end_s * 1000)), max(int(self.chunk_s * 1000), 1)
        while lo_ms < end_ms:
            hi_ms = min(lo_ms + step_ms, end_ms)
            data = self.query(f"{selector}[{hi_ms - lo_ms}ms]", hi_ms / 1000.0)
            if data.get("resultType") != "matrix":
                raise TsdbError(f"{self.base}: expected a matrix for {selector}, got {data.get('resultType')}")
            # Prometheus 2 includes both ends of a range, VictoriaMetrics only the right one:
            # keep (lo, hi] so consecutive chunks never overlap
            for series in data["result"]:
                values = [p for p in series["values"] if round(float(p[0]) * 1000) > lo_ms]
                if values:
                    chunks.append((series["metric"], values))
            lo_ms = hi_ms
        if not chunks:
            return RawSeries(np.empty(0, np.int64), np.empty(0), {k: np.empty(0, object) for k in labels})
        sizes = np.array([len(v) for _, v in chunks])
        pairs = [p for _, v in chunks for p in v]
        ts = np.rint(np.array([p[0] for p in pairs], np.float64) * 1000).astype(np.int64)
        sample_values = np.array([p[1] for p in pairs]).astype(np.float64)
        cols = {k: np.repeat(np.array([m.get(k, "") for m, _ in chunks], object), sizes) for k in labels}
        return RawSeries(ts, sample_values, cols)
