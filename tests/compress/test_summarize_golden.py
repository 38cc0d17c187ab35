"""Golden digests of the kernel summary and sketch tables for fixed simulated windows.

The speed work on ``summarize_kernel_arrays`` (dense group keys, one sort, fewer per-group
loops) must not change one byte of what is stored: these digests were computed by the code
before that work, and any change to them is a change of the stored data, not a refactor.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from argus.compress import CompressConfig, RefineConfig, summarize_kernel_arrays, summarize_kernels
from argus.sim import Engine, SimConfig
from argus.sim.run import prepare

CONFIGS = {
    "default": CompressConfig(),
    "kde_only": CompressConfig(refine=RefineConfig(max_w1_rel_mean=None)),
    "tight": CompressConfig(refine=RefineConfig(max_w1_rel_mean=0.002, max_clusters=6, keep_unreached=False)),
}


def table_digest(table: pa.Table) -> str:
    """sha256 of the schema and every value (floats by ``repr``: exact to the bit)."""
    h = hashlib.sha256(str(table.schema).encode())
    for name, values in table.to_pydict().items():
        h.update(name.encode())
        h.update(repr(values).encode())
    return h.hexdigest()[:16]


def _window(scenario: str, ranks: int, seed: int, steps: range) -> tuple:
    config = SimConfig(ranks=ranks, steps=steps.stop, seed=seed, kernels=True)
    _, ctx, plan, _ = prepare(config, scenario)
    engine = Engine(config, plan, emit=True, topology=ctx.topology)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("rank", "stream", "name_id", "kind_id", "dur")}
    for rec in engine.run():
        if rec.step not in steps:
            continue
        a = rec.kernel_arrays()
        keep = np.isfinite(a["start"])
        dur = np.where(np.isfinite(a["dur"]), a["dur"], -1.0)
        for k in ("rank", "stream", "name_id", "kind_id"):
            cols[k].append(a[k][keep])
        cols["dur"].append(np.rint(dur[keep]).astype(np.int64))
    names = engine.names.names
    return (*(np.concatenate(cols[k]) for k in ("rank", "stream", "name_id", "kind_id", "dur")), names, names)


def simulated_windows() -> dict[str, tuple]:
    healthy = _window("healthy", 32, 0, range(2, 6))
    link = _window("link_degradation", 24, 3, range(0, 5))
    # Durations that are not data (never finished, NaN), zeros and huge ones, as floats.
    rank, stream, name_id, kind_id, dur, names, kinds = link
    odd = dur.astype(np.float64)
    rng = np.random.default_rng(7)
    at = rng.choice(odd.size, size=(4, 200), replace=False)
    odd[at[0]], odd[at[1]], odd[at[2]], odd[at[3]] = -1.0, np.nan, 0.0, 3e12
    return {"healthy": healthy, "link": link, "odd": (rank, stream, name_id, kind_id, odd, names, kinds)}


@pytest.fixture(scope="module")
def windows() -> dict[str, tuple]:
    return simulated_windows()


GOLDEN = {
    "healthy/default": ("816a2d657d680a5d", "a731e7ce76ccfd21"),  # 4578 rows
    "healthy/kde_only": ("61fb081c3451c9d0", "a731e7ce76ccfd21"),  # 814 rows
    "healthy/tight": ("6417ec6c44ecee5e", "a731e7ce76ccfd21"),  # 1176 rows
    "link/default": ("bafe55719b8fb8bc", "2e8dd202f074b1bb"),  # 5060 rows
    "link/kde_only": ("ad4c6ef59822aec2", "2e8dd202f074b1bb"),  # 569 rows
    "link/tight": ("2b37dd0ac5dc8c02", "2e8dd202f074b1bb"),  # 834 rows
    "odd/default": ("e83cb8ade4e39745", "50db4d22c90976b1"),  # 3517 rows
    "odd/kde_only": ("619c0b473416a731", "50db4d22c90976b1"),  # 528 rows
    "odd/tight": ("128d85246a596234", "50db4d22c90976b1"),  # 913 rows
}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_summary_and_sketch_tables_are_unchanged(windows, case):
    window, config = case.split("/")
    summaries, sketches = summarize_kernel_arrays(*windows[window], 3, 10, 14, config=CONFIGS[config])
    assert (table_digest(summaries), table_digest(sketches)) == GOLDEN[case]


def test_the_table_path_is_unchanged():
    recs = list(Engine(SimConfig(ranks=16, steps=4)).run())
    window = pa.concat_tables([r.kernels_table() for r in recs[2:]])
    summaries, sketches = summarize_kernels(window, 7, 2, 3)
    assert (table_digest(summaries), table_digest(sketches)) == TABLE_GOLDEN


TABLE_GOLDEN = ("f68fd579d46751da", "774d955e29f35e84")  # 2071 rows


def print_golden() -> None:  # pragma: no cover - regenerates the constants above
    wins = simulated_windows()
    for w in wins:
        for c in CONFIGS:
            s, k = summarize_kernel_arrays(*wins[w], 3, 10, 14, config=CONFIGS[c])
            print(f'    "{w}/{c}": ("{table_digest(s)}", "{table_digest(k)}"),  # {s.num_rows} rows')
    recs = list(Engine(SimConfig(ranks=16, steps=4)).run())
    s, k = summarize_kernels(pa.concat_tables([r.kernels_table() for r in recs[2:]]), 7, 2, 3)
    print(f'TABLE_GOLDEN = ("{table_digest(s)}", "{table_digest(k)}")  # {s.num_rows} rows')
