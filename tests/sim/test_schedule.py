"""Megatron's pipeline schedules: 1F1B and 1F1B interleaved over virtual stages."""

import numpy as np
import pytest

from argus.errors import ConfigError
from argus.sim import Engine, SimConfig
from argus.sim.schedule import dependency_order, interleaved, one_f_one_b


def test_interleaved_order_follows_megatron():
    """pp=4, 8 microbatches, 2 chunks, stage 0: (4-0-1)·2 + (2-1)·4 = 10 warm-up forwards,
    microbatches through the chunks in groups of pp, backwards visiting the chunks in reverse."""
    order = interleaved(4, 8, 0, 2)
    assert order[:10] == [("F", m, 0) for m in range(4)] + [("F", m, 1) for m in range(4)] + \
        [("F", 4, 0), ("F", 5, 0)]
    assert order[10:14] == [("F", 6, 0), ("B", 0, 1), ("F", 7, 0), ("B", 1, 1)]
    assert sorted(order) == sorted((b, m, c) for b in "BF" for m in range(8) for c in range(2))
    assert [x[:2] for x in interleaved(4, 8, 2, 1)] == one_f_one_b(4, 8, 2)
    assert len(interleaved(4, 4, 3, 2)) == 16 and interleaved(4, 4, 3, 2)[:8] == [  # pp microbatches: all warm-up
        ("F", m, c) for c in range(2) for m in range(4)]


@pytest.mark.parametrize("pp,mb,chunks", [(2, 4, 2), (4, 8, 2), (4, 4, 4), (8, 8, 2), (3, 6, 1)])
def test_every_block_runs_once_after_what_it_waits_for(pp, mb, chunks):
    order = dependency_order(pp, mb, chunks)
    assert len(order) == len(set(order)) == 2 * pp * mb * chunks
    at = {blk: i for i, blk in enumerate(order)}
    last = pp * chunks - 1
    for (s, block, m, c), i in at.items():
        vs = c * pp + s
        if block == "F" and vs > 0:
            prev = vs - 1
            assert at[(prev % pp, "F", m, prev // pp)] < i
        if block == "B":
            assert at[(s, "F", m, c)] < i
            if vs < last:
                nxt = vs + 1
                assert at[(nxt % pp, "B", m, nxt // pp)] < i


def test_interleaving_shrinks_the_pipeline_bubble_and_wraps_last_stage_to_first():
    """Same work, two chunks a stage: the warm-up and cool-down bubbles shrink (steps shorter),
    and stage 0 also receives from the last stage (chunk 0 → chunk 1)."""
    base = dict(ranks=16, steps=4, layout="pp=4,dp=4", warmup_steps=0, checkpoint_every=0, jitter=0.0,
                seqlen_sigma=0.0, dataloader_spike_prob=0.0)
    plain = list(Engine(SimConfig(**base)).run())
    inter = list(Engine(SimConfig(**base, virtual_stages=2)).run())
    step = lambda recs: float(np.median([np.median(r.step_end - r.step_start) for r in recs]))  # noqa: E731
    assert step(inter) < 0.97 * step(plain)
    # per step and stage-0 rank: receives of activations (chunk 1, from stage 3) and gradients
    # (chunk 0 from stage 1, chunk 1 from stage 1): 3 × 8 microbatches; without chunks 8
    assert _stage0_receives(inter[-1]) == 24 and _stage0_receives(plain[-1]) == 8


def _stage0_receives(rec) -> int:
    recv = rec.names.id("pp-recv")
    n = 0
    for ranks, _microbatch, name, *_ in rec.phase_chunks:  # one chunk: one phase of a stage's ranks
        n += int(name == recv and 0 in np.asarray(ranks))
    return n


def test_interleaving_needs_a_pipeline_whole_chunks_and_groups_of_pp_microbatches():
    for bad in (dict(layout="dp=8", virtual_stages=2), dict(layout="pp=2,dp=4", virtual_stages=3),
                dict(layout="pp=4,dp=2", virtual_stages=2, microbatches=6)):
        with pytest.raises(ConfigError):
            SimConfig(ranks=8, **bad)
