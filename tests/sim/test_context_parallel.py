"""Context parallelism (Megatron's ring attention): every attention passes its key/value chunk,
and in the backward their gradients, around the cp ring — cp - 1 exchanges a layer, each one
waiting for the ring's slowest member (the export's names: ``tests/kineto/test_megatron_groups.py``)."""

from __future__ import annotations

import numpy as np

from argus.analysis import DiagnoseConfig, diagnose
from argus.sim import Engine, SimConfig, simulate_to_store
from argus.store import Store


def _ring_exchanges(rec, rank: int) -> int:
    ring = rec.names.id("cp-ring-sendrecv")
    return sum(int(name == ring) * int(rank in np.asarray(ranks)) for ranks, _m, name, *_ in rec.phase_chunks)


def test_each_layer_exchanges_cp_minus_one_chunks_around_the_ring_forward_and_backward():
    base = dict(steps=2, warmup_steps=0, checkpoint_every=0, layers=2, microbatches=4)
    for cp, want in ((4, 2 * 3 * 2 * 4), (2, 2 * 1 * 2 * 4), (1, 0)):  # fwd + bwd × (cp - 1) × layers × microbatches
        layout = f"tp=2,cp={cp},dp=2" if cp > 1 else "tp=2,dp=2"
        rec = list(Engine(SimConfig(ranks=4 * cp, layout=layout, **base)).run())[-1]
        assert _ring_exchanges(rec, 0) == want, cp


def test_a_slow_ring_is_named_on_its_members_and_a_healthy_cp_job_raises_nothing(tmp_path):
    """tp=2, cp=4 on hosts of 4 (every ring crosses two): one last-stage ring's exchanges 4×."""
    config = dict(ranks=32, steps=16, layout="tp=2,cp=4,pp=2,dp=2", seed=7, gpus_per_host=4)
    simulate_to_store(SimConfig(**config), "healthy", tmp_path / "h", baseline=False)
    healthy = diagnose(Store.open(tmp_path / "h").attempt(), DiagnoseConfig(store_incidents=False))
    assert [i.klass for i in healthy.incidents if i.severity != "info"] == []

    res = simulate_to_store(SimConfig(**config), "group_link_degradation", tmp_path / "s",
                            params={"group": "cp", "factor": 4.0, "ranks": "17"}, baseline=True)
    ring = res.truth["faults"][0]["culprit_ranks"]
    assert len(ring) == 4 and res.truth["faults"][0]["impact"]["slowdown_pct"] > 5
    d = diagnose(Store.open(tmp_path / "s").attempt(), DiagnoseConfig(store_incidents=False))
    costly = [i for i in d.incidents if i.severity != "info"]
    assert [i.klass for i in costly] == ["link_degradation"]
    assert sorted(costly[0].culprit_ranks) == sorted(ring)
