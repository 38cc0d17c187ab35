"""A mergeable log-bucket duration sketch on Prometheus native-histogram buckets.

Bucket ``i`` holds values in ``(γ^(i-1), γ^i]`` with ``γ = 2^(2^-schema)``: exactly the
buckets of a Prometheus native histogram of that schema, so a sketch is sent as one native
histogram without conversion. Any quantile is within relative error ``(γ-1)/(γ+1)`` of the
truth (schema 5: γ ≈ 1.0219, error ≤ 1.09%). Sketches merge by adding bucket counts, so
the sketch of a union is exactly the merge of the sketches — across windows and ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.errors import ConfigError

__all__ = ["LogSketch", "DEFAULT_SCHEMA", "bucket_index", "relative_error"]

DEFAULT_SCHEMA = 5


def _gamma(schema: int) -> float:
    return 2.0 ** (2.0 ** -schema)


def relative_error(schema: int = DEFAULT_SCHEMA) -> float:
    g = _gamma(schema)
    return (g - 1.0) / (g + 1.0)


def bucket_index(values: np.ndarray, schema: int = DEFAULT_SCHEMA) -> np.ndarray:
    """Bucket of each positive value: ``ceil(log_γ v)`` (deterministic, so merges are exact)."""
    scaled = np.log2(values)
    scaled *= 2.0 ** schema
    return np.ceil(scaled, out=scaled).astype(np.int32)


@dataclass(frozen=True)
class LogSketch:
    """One kernel's duration distribution (ns). ``buckets`` ascending, ``counts`` aligned."""

    schema: int
    count: int
    zero_count: int
    sum: float
    min: float
    max: float
    buckets: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls, schema: int = DEFAULT_SCHEMA) -> "LogSketch":
        return cls(schema, 0, 0, 0.0, float("nan"), float("nan"), np.empty(0, np.int32), np.empty(0, np.int64))

    @classmethod
    def from_values(cls, values: np.ndarray, schema: int = DEFAULT_SCHEMA) -> "LogSketch":
        """Sketch of the finite, non-negative values; NaN, inf and negatives are not data."""
        v = np.asarray(values, dtype=np.float64)
        v = v[np.isfinite(v) & (v >= 0)]
        if v.size == 0:
            return cls.empty(schema)
        pos = v[v > 0]
        idx, counts = np.unique(bucket_index(pos, schema), return_counts=True)
        return cls(schema, int(v.size), int(v.size - pos.size), float(v.sum()), float(v.min()), float(v.max()),
                   idx.astype(np.int32), counts.astype(np.int64))

    def merge(self, other: "LogSketch") -> "LogSketch":
        """Exact merge; sketches of different schemas merge at the coarser one."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        a, b = self, other
        if a.schema != b.schema:
            schema = min(a.schema, b.schema)
            a, b = a.downscale(schema), b.downscale(schema)
        idx, inv = np.unique(np.concatenate([a.buckets, b.buckets]), return_inverse=True)
        counts = np.bincount(inv, weights=np.concatenate([a.counts, b.counts])).astype(np.int64)
        return LogSketch(a.schema, a.count + b.count, a.zero_count + b.zero_count, a.sum + b.sum,
                         min(a.min, b.min), max(a.max, b.max), idx.astype(np.int32), counts)

    def downscale(self, schema: int) -> "LogSketch":
        """Coarser buckets: each step down halves the resolution (bucket i → ceil(i / 2))."""
        if schema > self.schema:
            raise ConfigError(f"cannot refine a schema-{self.schema} sketch to schema {schema}")
        b = self.buckets.astype(np.int64)
        for _ in range(self.schema - schema):
            b = -np.floor_divide(-b, 2)
        idx, inv = np.unique(b, return_inverse=True)
        counts = np.bincount(inv, weights=self.counts).astype(np.int64)
        return LogSketch(schema, self.count, self.zero_count, self.sum, self.min, self.max,
                         idx.astype(np.int32), counts)

    # -- reading -------------------------------------------------------------------------
    @property
    def gamma(self) -> float:
        return _gamma(self.schema)

    def upper_bounds(self) -> np.ndarray:
        return self.gamma ** self.buckets.astype(np.float64)

    def quantile(self, q: float | np.ndarray) -> np.ndarray | float:
        """Value at quantile ``q`` (relative error ≤ ``relative_error(schema)``)."""
        qs = np.atleast_1d(np.asarray(q, dtype=np.float64))
        if self.count == 0:
            out = np.full(qs.shape, np.nan)
            return out if np.ndim(q) else float(out[0])
        rank = np.clip(qs, 0, 1) * (self.count - 1)
        cum = self.zero_count + np.cumsum(self.counts)
        pos = np.searchsorted(cum, rank, side="right")
        g = self.gamma
        rep = 2.0 * g ** self.buckets.astype(np.float64) / (g + 1.0)
        out = np.where(rank < self.zero_count, 0.0, rep[np.minimum(pos, len(rep) - 1)] if len(rep) else 0.0)
        out = np.clip(out, self.min, self.max)
        return out if np.ndim(q) else float(out[0])

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """Fraction of events ≤ ``x``, log-linear inside a bucket (exact at bucket bounds)."""
        x = np.asarray(x, dtype=np.float64)
        if self.count == 0:
            return np.full(x.shape, np.nan)
        cum = self.zero_count + np.cumsum(self.counts)
        before = cum - self.counts
        lo = self.gamma ** (self.buckets.astype(np.float64) - 1.0)
        hi = self.gamma ** self.buckets.astype(np.float64)
        out = np.where(x >= 0, float(self.zero_count), 0.0)
        for b_lo, b_hi, c0, c in zip(lo, hi, before, self.counts):  # buckets ≪ grid points
            frac = np.clip(np.log(np.maximum(x, 1e-300) / b_lo) / np.log(b_hi / b_lo), 0.0, 1.0)
            out = np.where(x > b_lo, c0 + c * frac, out)
        return out / self.count

    def nbytes(self) -> int:
        """Wire size of a compact binary encoding: header + (int32 index, uint32 count) pairs."""
        return 40 + 8 * len(self.buckets)
