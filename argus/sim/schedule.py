"""Megatron's pipeline schedules (1F1B, and 1F1B interleaved over virtual stages) and an
execution order of one step that respects their dependencies."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["one_f_one_b", "interleaved", "dependency_order"]


def one_f_one_b(pp: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """Megatron's non-interleaved 1F1B order of one stage: ``pp - stage - 1`` warm-up
    forwards, then alternating forward/backward, then the remaining backwards."""
    warmup = min(pp - stage - 1, microbatches)
    order = [("F", m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", m) for m in range(microbatches - warmup, microbatches)]
    return order


def interleaved(pp: int, microbatches: int, stage: int, chunks: int) -> list[tuple[str, int, int]]:
    """Megatron's interleaved 1F1B order of one stage holding ``chunks`` model chunks (virtual
    stage ``chunk × pp + stage``), as ``(block, microbatch, chunk)``: microbatches go through
    the chunks in groups of ``pp``; ``(pp - stage - 1) × 2 + (chunks - 1) × pp`` warm-up
    forwards (all of them when there are only ``pp`` microbatches), then one forward and one
    backward in turn, backwards visiting the chunks in reverse."""
    if chunks == 1:
        return [(b, m, 0) for b, m in one_f_one_b(pp, microbatches, stage)]
    total = microbatches * chunks
    warmup = total if microbatches == pp else min((pp - stage - 1) * 2 + (chunks - 1) * pp, total)

    def at(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k % (pp * chunks)) // pp
        return (k // (pp * chunks)) * pp + k % pp, chunk if forward else chunks - 1 - chunk

    order = [("F", *at(k, True)) for k in range(warmup)]
    for i in range(total - warmup):
        order += [("F", *at(warmup + i, True)), ("B", *at(i, False))]
    order += [("B", *at(k, False)) for k in range(total - warmup, total)]
    return order


@lru_cache(maxsize=64)
def dependency_order(pp: int, microbatches: int, chunks: int = 1) -> tuple[tuple[int, str, int, int], ...]:
    """All ``(stage, block, microbatch, chunk)`` of one step, each after the blocks it waits
    for: a forward needs the previous virtual stage's forward (the last stage's previous
    chunk for stage 0), a backward the next virtual stage's backward."""
    plans = [interleaved(pp, microbatches, s, chunks) for s in range(pp)]
    ptr = [0] * pp
    done: set[tuple[int, str, int, int]] = set()
    out: list[tuple[int, str, int, int]] = []
    total = sum(len(p) for p in plans)
    while len(out) < total:
        progressed = False
        for s in range(pp):
            while ptr[s] < len(plans[s]):
                block, m, c = plans[s][ptr[s]]
                vs = c * pp + s
                if block == "F":
                    need = None if vs == 0 else ((vs - 1) % pp, "F", m, (vs - 1) // pp)
                else:
                    need = None if vs == pp * chunks - 1 else ((vs + 1) % pp, "B", m, (vs + 1) // pp)
                if need is not None and need not in done:
                    break
                done.add((s, block, m, c))
                out.append((s, block, m, c))
                ptr[s] += 1
                progressed = True
        if not progressed:  # cannot happen for Megatron's schedules; guards against a broken one
            raise RuntimeError("pipeline schedule deadlocks")
    return tuple(out)
