"""The byte-major column encoder against the row-major one it replaced: byte-identical traces.

``RowMajorWire`` is the previous ``_Wire`` (row-major padded matrix, segments merged as they
were appended), kept in ``argus.bench.processor`` as the bench's "before" and the reference here; swapping it in must not change one byte of a
real window's trace — pipeline-parallel phases with ``pp-send`` slices that straddle compute
(the side tracks), collectives linked across ranks, unfinished slices of a hang."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import argus.evidence.perfetto as perfetto
from argus.bench.processor import RowMajorWire
from argus.evidence import build_perfetto_trace
from argus.sim import Engine, SimConfig, prepare

from .test_perfetto import check_round_trip, kernel, phase, table

def _both(monkeypatch: pytest.MonkeyPatch, phases: pa.Table | None, kernels: pa.Table | None, **kw) -> tuple[bytes, bytes]:
    new = build_perfetto_trace(phases=phases, kernels=kernels, **kw)
    with monkeypatch.context() as m:
        m.setattr(perfetto, "_Wire", RowMajorWire)
        old = build_perfetto_trace(phases=phases, kernels=kernels, **kw)
    return new, old


def _window(scenario: str | None = None) -> tuple[pa.Table, pa.Table]:
    cfg = SimConfig(ranks=8, steps=3, layout="tp=2,pp=2,ep=2")
    if scenario:
        _, ctx, plan, _ = prepare(cfg, scenario)
        records = list(Engine(cfg, plan, topology=ctx.topology).run())
    else:
        records = list(Engine(cfg).run())
    return (pa.concat_tables([r.phases_table() for r in records]),
            pa.concat_tables([r.kernels_table() for r in records]))


@pytest.mark.parametrize("scenario", [None, "hang"])
def test_pipeline_window_with_straddling_pp_sends_is_byte_identical(monkeypatch, scenario):
    phases, kernels = _window(scenario)
    new, old = _both(monkeypatch, phases, kernels, hosts={r: f"node-{r // 4}" for r in range(8)}, title="w 3")
    assert new == old
    dec = check_round_trip(phases, kernels, title="w 3")
    # the window does exercise the side tracks (pp-send straddling compute) and flows
    assert any(dec.track_name(s).startswith("phases (comm") for s in dec.slices)
    assert any(s.flow_ids for s in dec.slices)


rows = st.lists(st.tuples(st.integers(0, 3), st.integers(-(2 ** 62), 2 ** 62), st.integers(-1, 2 ** 40),
                          st.sampled_from(["compute", "comm"]), st.integers(-1, 300)), min_size=0, max_size=30)


@settings(max_examples=60, deadline=None)
@given(rows, rows)
def test_arbitrary_windows_are_byte_identical(phase_rows, kernel_rows):
    """Every varint width (negative steps and microbatches encode as 10 bytes), optional
    annotations present on some rows only, unfinished slices: the same bytes."""
    phases = table("phases", [phase(r, f"p{i % 4}", s, d, cat=c, mb=m, step=m)
                              for i, (r, s, d, c, m) in enumerate(phase_rows)])
    kernels = table("kernels", [kernel(r, f"k{i % 3}", s, d, stream=abs(m), step=m)
                                for i, (r, s, d, _, m) in enumerate(kernel_rows)])
    with pytest.MonkeyPatch.context() as mp:
        new, old = _both(mp, phases, kernels)
    assert new == old


def _loop_only(monkeypatch: pytest.MonkeyPatch, phases: pa.Table | None, kernels: pa.Table | None) -> bytes:
    with monkeypatch.context() as m:
        m.setattr(perfetto, "_two_lane_groups", lambda *a: set())  # every failing group through _lanes
        return build_perfetto_trace(phases=phases, kernels=kernels)


def test_vectorised_two_lane_split_is_taken_for_pipeline_phases_and_matches_the_loop(monkeypatch):
    phases, kernels = _window()
    ev = perfetto._Events.from_tables(phases, kernels)
    order = perfetto._event_order(ev)
    taken: list[set[int]] = []
    real = perfetto._two_lane_groups
    with monkeypatch.context() as m:
        m.setattr(perfetto, "_two_lane_groups", lambda *a: taken.append(real(*a)) or taken[-1])
        perfetto._assign_tracks(ev, order, {})
    assert taken and len(taken[0]) >= 4  # the pipeline ranks' phase groups skip the loop
    assert build_perfetto_trace(phases=phases, kernels=kernels) == _loop_only(monkeypatch, phases, kernels)


overlaps = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60), st.integers(-1, 40),
                              st.sampled_from(["compute", "comm", "comm"]), st.integers(0, 2)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(overlaps)
def test_two_lane_split_matches_the_per_slice_loop_on_arbitrary_overlaps(rows):
    """Straddling, nested, touching, zero-length, identical and unfinished collectives and
    compute: the vectorised split gives the loop's tracks, byte for byte."""
    phases = table("phases", [phase(r, f"p{i % 5}", s, d, cat=c, mb=m) for i, (r, s, d, c, m) in enumerate(rows)])
    with pytest.MonkeyPatch.context() as mp:
        assert build_perfetto_trace(phases=phases, kernels=None) == _loop_only(mp, phases, None)


def _without_chains(monkeypatch: pytest.MonkeyPatch, phases: pa.Table | None, kernels: pa.Table | None) -> bytes:
    with monkeypatch.context() as m:
        m.setattr(perfetto, "_chain_lanes", lambda *a, **k: None)  # every overlapping stream through _lanes
        return build_perfetto_trace(phases=phases, kernels=kernels)


def test_jittered_stream_takes_the_chain_lanes_and_matches_the_loop(monkeypatch):
    """Serial kernels, each beginning a little before the previous one ends (clock jitter),
    none inside another: the vectorised chains give the loop's lanes for all 2,000."""
    rng = np.random.default_rng(3)
    dur = rng.integers(500, 5_000, 2_000)
    start = 1_000 + np.cumsum(dur) - np.where(rng.random(2_000) < 0.3, 20, 0) - dur
    kernels = table("kernels", [kernel(0, f"k{i % 7}", int(s), int(d)) for i, (s, d) in enumerate(zip(start, dur))])
    taken: list[np.ndarray | None] = []
    real = perfetto._chain_lanes
    with monkeypatch.context() as m:
        m.setattr(perfetto, "_chain_lanes", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
        fast = build_perfetto_trace(phases=None, kernels=kernels)
    assert taken and taken[0] is not None and int(taken[0].max()) == 1  # two lanes, no loop
    assert fast == _without_chains(monkeypatch, None, kernels)
    dec = check_round_trip(None, kernels)
    assert {dec.track_name(s) for s in dec.slices} == {"stream 7", "stream 7 #2"}


kernel_overlaps = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 80), st.integers(-1, 30), st.integers(0, 1)),
                           max_size=50)


@settings(max_examples=200, deadline=None)
@given(kernel_overlaps)
def test_chain_lanes_match_the_per_slice_loop_on_arbitrary_kernel_overlaps(rows):
    """Chains of overlapping kernels, nested, touching, zero-length, identical and unfinished
    ones: where the chains apply they give the loop's tracks, byte for byte (else the loop runs)."""
    kernels = table("kernels", [kernel(r, f"k{i % 4}", s, d, stream=st_) for i, (r, s, d, st_) in enumerate(rows)])
    with pytest.MonkeyPatch.context() as mp:
        assert build_perfetto_trace(phases=None, kernels=kernels) == _without_chains(mp, None, kernels)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 31), st.integers(2, 400), st.integers(0, 40), st.integers(1, 20), st.booleans())
def test_chain_lanes_match_the_loop_on_long_jittered_streams(seed, n, overlap, gap, outlast):
    """Long serial streams with random overlaps of the previous kernels (up to many lanes);
    ``outlast``: every kernel outlasts its overlap, so none lies inside another (the chains)."""
    rng = np.random.default_rng(seed)
    dur = rng.integers(overlap + 1 if outlast else 1, overlap + 60, n)
    start = np.maximum(0, np.cumsum(dur + rng.integers(0, gap, n)) - dur - rng.integers(0, overlap + 1, n))
    kernels = table("kernels", [kernel(0, "k", int(s), int(d)) for s, d in zip(start, dur)])
    with pytest.MonkeyPatch.context() as mp:
        assert build_perfetto_trace(phases=None, kernels=kernels) == _without_chains(mp, None, kernels)
