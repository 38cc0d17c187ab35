"""``--workload production`` in the processor and remote-write benches: the production
workload's kernel mix, in the benches themselves (no harness patching their functions)."""

from __future__ import annotations

import numpy as np
import pytest

from argus.bench import processor, remote_write
from argus.cli.main import build_parser
from argus.errors import ConfigError
from argus.sim.production import ProductionWorkload
from argus.wire.protocol import Msg

LAUNCHES = ProductionWorkload().launches_per_step  # 12,370


def test_processor_window_carries_the_production_kernels_per_rank_step():
    standard_names, standard = processor._window()
    names, batches = processor._window(workload="production")
    assert LAUNCHES == 12_370 and len(batches) == 5
    production_names = set(ProductionWorkload().names)
    for step, (std, prod) in enumerate(zip(standard, batches)):
        assert sorted(prod) == list(range(8))
        for rank, by_msg in prod.items():
            kernels = by_msg[Msg.KERNELS]
            assert len(kernels) == LAUNCHES  # every rank-step: the production workload's launches
            assert len(by_msg[Msg.PHASES]) == len(std[rank][Msg.PHASES])  # phases stay the simulator's
            assert {names[i] for i in np.unique(kernels["name"])} <= production_names
            assert (kernels["step"] == by_msg[Msg.STEPS]["step"][0]).all()
            step_start = by_msg[Msg.STEPS]["start_ns"][0]
            assert kernels["start_ns"].min() == step_start
            assert (kernels["start_ns"] + kernels["dur_ns"]).max() <= by_msg[Msg.STEPS]["end_ns"][0]
            if step:  # a stream's kernels never overlap the previous step's, as on a GPU
                prev = batches[step - 1][rank][Msg.KERNELS]
                assert step_start >= (prev["start_ns"] + prev["dur_ns"]).max()
    assert names[:len(standard_names)] == standard_names


def test_processor_window_tables_are_a_production_host_window():
    phases, kernels = processor.window_tables("production")
    assert kernels.num_rows == 8 * 5 * LAUNCHES
    assert phases.num_rows == sum(len(b[Msg.PHASES]) for s in processor._window()[1] for b in s.values())
    assert kernels.column("name").to_pylist()[:3] == [ProductionWorkload().names[i] for i in
                                                       ProductionWorkload().name_id[:3]]


def test_processor_bench_streams_the_production_mix_through_a_real_processor():
    row = processor.run_socket("throughput", events=1, workload="production", evidence=True)
    names, batches = processor._window(workload="production")
    per_step = sum(len(b) for by_msg in batches[0].values() for b in by_msg.values())
    assert row["workload"] == "production" and row["steps"] == 1
    phases = sum(len(by_msg[Msg.PHASES]) for by_msg in batches[0].values())
    assert row["events"] == per_step == 8 * (LAUNCHES + 1) + phases  # kernels, one step record, phases
    assert row["evidence_files"] == 1


def test_remote_write_bench_summarises_the_production_kernels():
    standard = remote_write.run(windows=2)
    production = remote_write.run(windows=2, workload="production")
    assert production["workload"] == "production" and production["dropped"] == {}
    # With the refinement on by default (argus/compress/refine.py): 359.6 summary rows per rank,
    # 1,877.1 series per rank (standard: 707.1); docs/scale.md M3 has the figures from before
    # (198.2 rows, 1,070.2 series; standard 207.8), refinement off.
    assert production["series_per_rank"] == pytest.approx(1877.1, abs=1)
    assert standard["series_per_rank"] == pytest.approx(707.1, abs=1)
    _, _, summaries = remote_write._window(8, 5, "production")
    assert summaries.num_rows / 8 == pytest.approx(359.6, abs=0.1)


def test_cli_takes_the_workload_and_rejects_unknown_ones():
    parser = build_parser()
    assert parser.parse_args(["bench", "processor", "--workload", "production"]).workload == "production"
    assert parser.parse_args(["bench", "processor"]).workload == "standard"
    assert parser.parse_args(["bench", "remote-write", "--workload", "production"]).workload == "production"
    assert parser.parse_args(["bench", "perfetto"]).workload == "production"
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "processor", "--workload", "huge"])
    with pytest.raises(ConfigError):
        processor._window(workload="huge")
    with pytest.raises(ConfigError):
        remote_write._window(8, 5, "huge")
