"""Property: any store of 1–8 ranks × 1–6 steps — healthy or faulty, with ranks, steps, whole
tables or the hosts of some ranks missing — diagnoses without an exception, says what it
lacked, and never claims the ranks match on one step or one rank."""

from __future__ import annotations

import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argus.analysis import DiagnoseConfig, diagnose
from argus.errors import ScenarioError
from argus.sim import SimConfig, simulate_to_store
from argus.store import TABLES, Store
from argus.topology import RunIdentity, parse_layout

LAYOUTS = {1: [""], 2: ["", "pp=2"], 3: [""], 4: ["", "pp=2", "tp=2", "ep=2"], 5: [""], 6: ["", "pp=2", "tp=3"],
           7: [""], 8: ["", "tp=2,pp=2", "ep=2,pp=2", "pp=4", "tp=2,ep=2"]}
SCENARIOS = ["healthy", "compute_straggler", "link_degradation", "hang", "gc_pause", "pipeline_bubble"]
#: tables a store can lack (steps is what makes a store a job's; without it `diagnose` says so)
OPTIONAL = ["phases", "kernel_summaries", "kernel_sketches", "stacks", "hw", "topology"]


@st.composite
def damaged_jobs(draw):
    ranks = draw(st.integers(1, 8))
    layout = draw(st.sampled_from(LAYOUTS[ranks]))
    steps = draw(st.integers(1, 6))
    scenario = draw(st.sampled_from(SCENARIOS))
    keep_ranks = draw(st.sets(st.integers(0, ranks - 1), min_size=1, max_size=ranks))
    keep_steps = draw(st.sets(st.integers(0, steps - 1), min_size=1, max_size=steps))
    drop_tables = draw(st.sets(st.sampled_from(OPTIONAL), max_size=3))
    hostless = draw(st.sets(st.integers(0, ranks - 1), max_size=ranks))
    return ranks, layout, steps, scenario, sorted(keep_ranks), sorted(keep_steps), sorted(drop_tables), sorted(hostless)


def _damaged_copy(src, dst, keep_ranks: list[int], keep_steps: list[int], drop: list[str], hostless: list[int]):
    """``src``'s attempt with only ``keep_ranks`` × ``keep_steps``, without the ``drop`` tables and
    without the topology rows of ``hostless`` ranks."""
    attempt = Store.open(src).attempt()
    out = Store.create(dst).create_attempt(RunIdentity("partial"), attempt.layout, source="test")
    w = out.writer("copy")
    for table, spec in TABLES.items():
        if table in drop or table == "incidents" or not attempt.files(table):
            continue
        t = attempt.read(table)
        if "rank" in t.column_names:
            ranks = hostless if table == "topology" else []
            t = t.filter(pc.is_in(t.column("rank"), value_set=pc.cast(keep_ranks, t.schema.field("rank").type)))
            if ranks:
                t = t.filter(pc.invert(pc.is_in(t.column("rank"), value_set=pc.cast(ranks, t.schema.field("rank").type))))
        step_col = spec.step_column if spec.step_column in t.column_names else None
        if step_col is not None:
            t = t.filter(pc.is_in(t.column(step_col), value_set=pc.cast(keep_steps, t.schema.field(step_col).type)))
        w.write(table, t, window=0)
    return out


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=damaged_jobs())
def test_any_partial_store_diagnoses_without_an_exception(tmp_path_factory, job):
    ranks, layout, steps, scenario, keep_ranks, keep_steps, drop, hostless = job
    base = tmp_path_factory.mktemp("job")
    cfg = SimConfig(ranks=ranks, steps=steps, seed=1, layout=parse_layout(layout or "", world_size=ranks))
    try:
        simulate_to_store(cfg, scenario, base / "full")
    except ScenarioError:  # a fault this layout cannot hold (a pipeline bubble without stages): healthy
        simulate_to_store(cfg, "healthy", base / "full")
    attempt = _damaged_copy(base / "full", base / "partial", keep_ranks, keep_steps, drop, hostless)
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    doc = d.document()
    assert doc["ranks"] == ranks
    for inc in d.incidents:
        assert set(inc.culprit_ranks) <= set(range(ranks))
    thin = d.depth.thin if d.depth is not None else True
    if len(keep_steps) == 1 or len(keep_ranks) == 1:
        assert thin, "one step or one rank is never enough to say the ranks match"
