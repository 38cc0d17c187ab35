"""Shared fixtures: small simulated stores, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from argus.sim import SimConfig, simulate_to_store

#: Test folders whose tests run real training processes and measure them (step times, CPU
#: time, who is slower): they run one at a time, alone on the machine (``-m serial`` in
#: scripts/test.sh), while the rest run in parallel workers. A slow rank that is only a busy
#: neighbour is exactly what these tests must never see. A module or test there that measures
#: nothing says so with ``parallel_ok`` (its own ``serial`` marker still wins).
SERIAL_DIRS = {"e2e", "processor", "producer", "cli"}


def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    for item in items:
        # a module's tests that share a module fixture (real jobs, servers, simulated stores)
        # go to one worker (``--dist loadgroup`` in scripts/test.sh): split over two, each built
        # its own — the Flight Recorder module's two real 4-rank jobs ran twice, 33 s of setup
        if _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
        try:
            top = Path(str(item.fspath)).relative_to(tests).parts[0]
        except ValueError:
            continue
        own = {m.name for m in item.iter_markers()}
        if top in SERIAL_DIRS and ("parallel_ok" not in own or "serial" in own):
            item.add_marker(pytest.mark.serial)


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
