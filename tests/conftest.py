"""Shared fixtures: small simulated stores, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from argus.sim import SimConfig, simulate_to_store


@pytest.fixture(scope="session")
def simulated(tmp_path_factory):
    """``simulated(scenario, **config)`` → (attempt, truth), cached per arguments."""
    from argus.store import Store

    cache: dict[tuple, tuple] = {}

    def make(scenario: str, params: dict | None = None, **cfg):
        key = (scenario, tuple(sorted((params or {}).items())), tuple(sorted(cfg.items())))
        if key not in cache:
            out: Path = tmp_path_factory.mktemp(scenario)
            out.rmdir()
            config = SimConfig(**{"ranks": 64, "steps": 12, "kernels": True, **cfg})
            res = simulate_to_store(config, scenario, out, params=params)
            cache[key] = (Store.open(out).attempt(), res.truth)
        return cache[key]

    return make
