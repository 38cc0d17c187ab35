"""The 1F1B pipeline schedule and an execution order that respects its dependencies."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["one_f_one_b", "dependency_order"]


def one_f_one_b(pp: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Megatron's non-interleaved 1F1B order of one stage: ``pp - stage - 1`` warm-up
    forwards, then alternating forward/backward, then the remaining backwards."""
    warmup = min(pp - stage - 1, microbatches)
    order = [("F", m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", m) for m in range(microbatches - warmup, microbatches)]
    return order


@lru_cache(maxsize=64)
def dependency_order(pp: int, microbatches: int) -> tuple[tuple[int, str, int], ...]:
    """All ``(stage, block, microbatch)`` of one step, each after the blocks it waits for:
    a forward needs the previous stage's forward, a backward the next stage's backward."""
    plans = [one_f_one_b(pp, microbatches, s) for s in range(pp)]
    ptr = [0] * pp
    done: set[tuple[int, str, int]] = set()
    out: list[tuple[int, str, int]] = []
    total = sum(len(p) for p in plans)
    while len(out) < total:
        progressed = False
        for s in range(pp):
            while ptr[s] < len(plans[s]):
                block, m = plans[s][ptr[s]]
                need = (s - 1, "F", m) if block == "F" and s > 0 else (s + 1, "B", m) if block == "B" and s < pp - 1 else None
                if need is not None and need not in done:
                    break
                done.add((s, block, m))
                out.append((s, block, m))
                ptr[s] += 1
                progressed = True
        if not progressed:  # cannot happen for 1F1B; guards against a broken schedule
            raise RuntimeError("pipeline schedule deadlocks")
    return tuple(out)
