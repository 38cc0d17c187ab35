"""Correctness sensors: a digest of the state every data-parallel replica holds bit for bit.

After their all-reduce, the gradients are the same bits on every replica, and every replica
applies them to the same parameters with the same optimizer, so the parameters stay the same
bits too (DDP relies on it: it never re-broadcasts them). A device that computes a wrong value
without raising anything — silent data corruption — makes its replica's digest differ from the
others'; a parameter once wrong stays wrong, so the difference persists from that step on.

Each rank only digests its own state and records the digest; replicas are compared by Argus
(``argus/analysis/sdc.py``), never through the job's own collectives. The digest is an
integer sum of the tensors' bits (exact and independent of the reduction order, so the same
bits give the same digest on any device), mixed with the tensor's position; a flipped bit moves
the sum by ±2ᵏ. Tensors sharded across ranks (DTensor shards, FSDP's flat parameters) hold
different bits by design and are left out.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

__all__ = ["ReplicaSensor", "digest", "SENSOR_GRADS", "SENSOR_PARAMS"]

SENSOR_GRADS, SENSOR_PARAMS = 0, 1  # codes of ``argus.wire.SENSORS``
log = logging.getLogger("argus.producer")
_MASK = (1 << 64) - 1
_MIX = 0x100000001B3  # FNV-1a's 64-bit prime: the order of the tensors counts

def _replicated(t: Any) -> Any:
    """The tensor every replica holds in full, or None for a shard (which differs by design)."""
    placements = getattr(t, "placements", None)
    if placements is not None:  # a DTensor: only an all-Replicate one is the same on every rank
        if not all(p.is_replicate() for p in placements):
            return None
        return t.to_local()
    if type(t).__name__ == "FlatParameter":  # FSDP1's per-rank shard
        return None
    return t


#: bytes of tensors concatenated at once: a bounded copy, whatever the model's size
_CHUNK_BYTES = 64 << 20


def digest(tensors: Iterable[Any]) -> tuple[int, int, int, int]:
    """``(tensors, elements, digest, nonfinite)`` of the replicated ``tensors``.

    Tensors of one dtype are laid end to end (in chunks of ``_CHUNK_BYTES``) and their bytes
    summed as 64-bit integers: one copy and two reductions per chunk instead of a handful of
    small operations per tensor (the per-tensor form cost ~12% of a small model's step). The
    float sum of a chunk says whether anything in it is NaN/Inf; only then are they counted."""
    import torch

    groups: dict[Any, list[Any]] = {}
    count = elements = 0
    for t in tensors:
        local = _replicated(t)
        if local is None or local.numel() == 0 or local.is_complex():
            continue
        groups.setdefault(local.dtype, []).append(local.detach().reshape(-1))
        count += 1
        elements += local.numel()
    h = nonfinite = 0
    for dtype in sorted(groups, key=str):
        for chunk in _chunks(groups[dtype]):
            flat = chunk[0] if len(chunk) == 1 else torch.cat(chunk)
            if flat.is_floating_point() and not bool(torch.isfinite(flat.sum())):
                nonfinite += int(flat.numel() - torch.isfinite(flat).sum().item())
            raw = flat.view(torch.uint8)
            pad = -raw.numel() % 8
            if pad:
                raw = torch.cat([raw, raw.new_zeros(pad)])
            bits = int(raw.view(torch.int64).sum().item()) & _MASK
            h = ((h ^ bits) * _MIX + raw.numel()) & _MASK
    return count, elements, h, nonfinite


def _chunks(flats: list[Any]) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    size = 0
    for f in flats:
        n = f.numel() * f.element_size()
        if chunk and size + n > _CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(f)
        size += n
    if chunk:
        yield chunk


class ReplicaSensor:
    """Digests the optimizer's gradients before it steps and its parameters after, every
    ``every`` steps (0: never). Runs on the training thread inside the optimizer's hooks."""

    def __init__(self, record: Any, every: int):
        self.record = record  # (step, sensor, tensors, elements, digest, nonfinite) → None
        self.every = every

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def grads(self, step: int, optimizer: Any) -> None:
        if self.due(step):
            grads = (p.grad for p in _params(optimizer) if p.grad is not None)
            self._emit(step, SENSOR_GRADS, grads)

    def params(self, step: int, optimizer: Any) -> None:
        if self.due(step):
            self._emit(step, SENSOR_PARAMS, _params(optimizer))

    def _emit(self, step: int, sensor: int, tensors: Iterable[Any]) -> None:
        import torch

        try:
            with torch.no_grad():
                n, elements, h, bad = digest(tensors)
        except Exception as exc:  # noqa: BLE001 - a tensor we cannot read stops this sensor, not tracing
            log.warning("argus: correctness sensor off (%s: %s)", type(exc).__name__, exc)
            self.every = 0
            return
        if n:
            self.record(step, sensor, n, elements, h, bad)


def _params(optimizer: Any) -> list[Any]:
    return [p for group in getattr(optimizer, "param_groups", ()) for p in group.get("params", ())]
