"""Holistic Trace Analysis, the consumer that matters, loads an export and runs its straggler analysis."""

import logging

import pytest

from argus.kineto import export_kineto
from argus.sim import SimConfig, simulate_to_store

hta_trace_analysis = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
hta_straggler = pytest.importorskip("hta.analyzers.straggler")
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA on pandas 3


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("hta") / "S"
    simulate_to_store(SimConfig(ranks=4, steps=4, kernels=True), "compute_straggler", out, baseline=False)
    return out


class _WidenedNames:
    """HTA's symbol table with ``ncclDevKernel_*`` spelled ``ncclKernel_*``: HTA ≤ 0.5 tests
    communication kernels with ``startswith("ncclKernel")`` (upstream issue #360)."""

    def __init__(self, table):
        self._names = ["ncclKernel_" + s[len("ncclDevKernel_"):] if s.startswith("ncclDevKernel_") else s
                       for s in table.get_sym_table()]

    def get_sym_table(self):
        return self._names

    def get_sym_id_map(self):
        return {s: i for i, s in enumerate(self._names)}


def _widened(df, symbol_table, n_stragglers, visualize):
    return hta_straggler.find_stragglers_with_late_start_comm_kernels(
        df, _WidenedNames(symbol_table), n_stragglers, visualize)


def test_hta_loads_the_export_and_runs_its_straggler_analysis(store, tmp_path):
    logging.getLogger("hta").setLevel(logging.ERROR)
    plain = tmp_path / "plain"
    export_kineto(store, plain)
    ta = hta_trace_analysis.TraceAnalysis(trace_dir=str(plain))
    assert sorted(ta.t.get_all_traces()) == [0, 1, 2, 3]
    assert [int(s) for s in ta.get_profiler_steps()] == [0, 1, 2]  # HTA leaves out the last step
    trace = ta.t.get_trace(0)
    assert (trace["stream"] > 0).sum() > 0 and (trace["iteration"] > 0).sum() > 0
    stragglers = ta.get_potential_stragglers(straggler_identification_impl=_widened)
    assert len(stragglers) == 2 and set(stragglers) <= {0, 1, 2, 3}

    compat = tmp_path / "compat"
    export_kineto(store, compat, hta_compat=True)
    shipped = hta_trace_analysis.TraceAnalysis(trace_dir=str(compat)).get_potential_stragglers()
    assert len(shipped) == 2 and set(shipped) <= {0, 1, 2, 3}
