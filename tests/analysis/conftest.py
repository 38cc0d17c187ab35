from __future__ import annotations

import pytest

from argus.analysis import DiagnoseConfig, diagnose
from argus.sim import SimConfig, simulate_to_store
from argus.store import Store


@pytest.fixture(scope="session")
def diagnosed(tmp_path_factory):
    """``diagnosed(scenario, seed=0, ranks=64, steps=20)`` → (attempt, truth, diagnosis), cached."""
    cache: dict[tuple, tuple] = {}

    def make(scenario: str, seed: int = 0, ranks: int = 64, steps: int = 20, params: dict | None = None, **cfg):
        key = (scenario, seed, ranks, steps, tuple(sorted(cfg.items())), tuple(sorted((params or {}).items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{scenario}-{seed}") / "s"
            res = simulate_to_store(SimConfig(ranks=ranks, steps=steps, seed=seed, **cfg), scenario, out, params=params)
            attempt = Store.open(out).attempt()
            cache[key] = (attempt, res.truth, diagnose(attempt, DiagnoseConfig()))
        return cache[key]

    return make
