"""Perfetto evidence traces: decoded with the protobuf classes (the trace processor needs a
download, so it cannot run here) and compared with the input rows they were written from."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from argus.evidence import UNFINISHED, build_perfetto_trace, write_perfetto_trace
from argus.errors import StoreError
from argus.evidence.perfetto import SEQUENCE_ID, _Wire
from argus.sim import Engine, SimConfig, prepare
from argus.store.schema import TABLES

BEGIN, END = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END


# ----------------------------------------------------------------------------- decoding

@dataclass
class Slice:
    track: int
    name: str
    category: str
    start: int
    end: int
    args: dict[str, object]
    flow_ids: list[int]
    terminating_flow_ids: list[int]


@dataclass
class Decoded:
    trace: pb.Trace
    tracks: dict[int, pb.TrackDescriptor] = field(default_factory=dict)
    slices: list[Slice] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)

    def track_name(self, s: Slice) -> str:
        return self.tracks[s.track].name

    def rank_of(self, s: Slice) -> int:
        return self.tracks[self.tracks[s.track].parent_uuid].process.pid

    def children(self, rank: int) -> list[str]:
        parent = next(u for u, t in self.tracks.items() if t.HasField("process") and t.process.pid == rank)
        kids = [t for t in self.tracks.values() if t.parent_uuid == parent]
        return [t.name for t in sorted(kids, key=lambda t: t.sibling_order_rank)]


def decode(data: bytes) -> Decoded:
    """Parse a trace and rebuild its slices, asserting that every track nests.

    Packets are replayed in file order (the trace processor sorts by timestamp, stably, and
    the writer emits them sorted); an END must close the most recent open slice of its track,
    and a flow must be started before it is terminated, and never continue after that."""
    trace = pb.Trace()
    trace.ParseFromString(data)
    out = Decoded(trace)
    cats: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    strings: dict[int, str] = {}
    open_slices: dict[int, list[Slice]] = defaultdict(list)
    flows_started: set[int] = set()
    flows_ended: set[int] = set()
    last_ts = -1
    for i, packet in enumerate(trace.packet):
        assert packet.trusted_packet_sequence_id == SEQUENCE_ID
        if i == 0:
            assert packet.sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        if packet.HasField("interned_data"):
            interned = packet.interned_data
            out.names.update({e.iid: e.name for e in interned.event_names})
            cats.update({e.iid: e.name for e in interned.event_categories})
            arg_names.update({e.iid: e.name for e in interned.debug_annotation_names})
            strings.update({e.iid: e.str.decode() for e in interned.debug_annotation_string_values})
        if packet.HasField("track_descriptor"):
            desc = packet.track_descriptor
            assert desc.uuid not in out.tracks, "duplicate track uuid"
            out.tracks[desc.uuid] = desc
        if not packet.HasField("track_event"):
            continue
        te = packet.track_event
        assert te.track_uuid in out.tracks, "event on an undeclared track"
        if te.track_uuid != 1:  # the title track is written first, out of time order
            assert packet.timestamp >= last_ts, "event packets are not in time order"
            assert packet.sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            last_ts = packet.timestamp
        if te.type == BEGIN:
            args = {}
            for a in te.debug_annotations:
                name = arg_names[a.name_iid]
                args[name] = strings[a.string_value_iid] if a.HasField("string_value_iid") else a.int_value
            assert not set(te.flow_ids) & flows_ended, "flow continues after it terminated"
            assert set(te.terminating_flow_ids) <= flows_started, "flow terminates before it started"
            flows_started.update(te.flow_ids)
            flows_ended.update(te.terminating_flow_ids)
            name = te.name if te.HasField("name") else out.names[te.name_iid]
            cat = cats[te.category_iids[0]] if te.category_iids else ""
            open_slices[te.track_uuid].append(Slice(te.track_uuid, name, cat, packet.timestamp, -1, args,
                                                    list(te.flow_ids), list(te.terminating_flow_ids)))
        else:
            assert te.type == END
            stack = open_slices[te.track_uuid]
            assert stack, f"END without an open slice on track {out.tracks[te.track_uuid].name}"
            s = stack.pop()
            assert packet.timestamp >= s.start
            s.end = packet.timestamp
            out.slices.append(s)
    assert not any(open_slices.values()), "slices left open at the end of the trace"
    return out


# ----------------------------------------------------------------------------- inputs

PHASE_COLS = ("rank", "step", "microbatch", "name", "category", "group_kind", "start_ns", "dur_ns")
KERNEL_COLS = ("rank", "step", "kind", "device", "stream", "name", "start_ns", "dur_ns")


def table(kind: str, rows: list[tuple]) -> pa.Table:
    cols = PHASE_COLS if kind == "phases" else KERNEL_COLS
    schema = TABLES[kind].schema
    return pa.table({c: pa.array([r[i] for r in rows], schema.field(c).type) for i, c in enumerate(cols)})


def phase(rank, name, start, dur, *, cat="compute", group="", step=0, mb=0):
    return (rank, step, mb, name, cat, group, start, dur)


def kernel(rank, name, start, dur, *, stream=7, kind="kernel", device=0, step=0):
    return (rank, step, kind, device, stream, name, start, dur)


def expected_slices(phases: pa.Table | None, kernels: pa.Table | None) -> list[tuple]:
    """(rank, name, start, end) of every input row; unfinished rows end at the trace end."""
    rows = [r for t in (phases, kernels) if t is not None for r in t.select(["rank", "name", "start_ns", "dur_ns"])
            .to_pylist()]
    if not rows:
        return []
    trace_end = max(r["start_ns"] + max(r["dur_ns"], 0) for r in rows)
    return sorted((r["rank"], r["name"], r["start_ns"], r["start_ns"] + r["dur_ns"] if r["dur_ns"] >= 0 else trace_end)
                  for r in rows)


def expected_collectives(phases: pa.Table) -> list[set[tuple[int, int]]]:
    """Member sets {(rank, start)} of every collective with ≥ 2 ranks, computed row by row."""
    occ: dict[tuple, int] = defaultdict(int)
    groups: dict[tuple, set] = defaultdict(set)
    rows = sorted((r for r in phases.to_pylist() if r["category"] == "comm"), key=lambda r: r["start_ns"])
    for r in rows:
        key = (r["rank"], r["step"], r["microbatch"], r["name"])
        groups[(r["step"], r["microbatch"], r["name"], occ[key])].add((r["rank"], r["start_ns"]))
        occ[key] += 1
    return [g for g in groups.values() if len(g) >= 2]


def sim_window(ranks: int, steps: int = 1, scenario: str | None = None) -> tuple[pa.Table, pa.Table]:
    cfg = SimConfig(ranks=ranks, steps=steps)
    if scenario:
        _, ctx, plan, _ = prepare(cfg, scenario)
        records = list(Engine(cfg, plan, topology=ctx.topology).run())
    else:
        records = list(Engine(cfg).run())
    return (pa.concat_tables([r.phases_table() for r in records]),
            pa.concat_tables([r.kernels_table() for r in records]))


def check_round_trip(phases: pa.Table | None, kernels: pa.Table | None, **kw) -> Decoded:
    dec = decode(build_perfetto_trace(phases=phases, kernels=kernels, **kw))
    got = sorted((dec.rank_of(s), s.name, s.start, s.end) for s in dec.slices if s.track != 1)
    assert got == expected_slices(phases, kernels)
    return dec


# ----------------------------------------------------------------------------- tests

def test_each_rank_is_a_process_track_named_with_its_host():
    phases = table("phases", [phase(0, "forward-compute", 100, 50), phase(12, "forward-compute", 100, 60)])
    kernels = table("kernels", [kernel(0, "gemm", 110, 5), kernel(12, "gemm", 110, 5, stream=9)])
    dec = check_round_trip(phases, kernels, hosts={0: "node-0000", 12: "node-0003"})
    procs = {t.process.pid: t for t in dec.tracks.values() if t.HasField("process")}
    assert sorted(procs) == [0, 12]
    assert procs[12].name == "rank 12 (node-0003)" and procs[12].process.process_name == "rank 12 (node-0003)"
    assert dec.children(0) == ["phases", "stream 7"]
    assert dec.children(12) == ["phases", "stream 9"]


def test_rank_without_a_host_is_named_by_rank_alone():
    dec = check_round_trip(table("phases", [phase(3, "optimizer", 0, 10, mb=-1)]), None)
    assert [t.name for t in dec.tracks.values() if t.HasField("process")] == ["rank 3"]


def test_one_track_per_stream_with_non_kernel_kinds_and_devices_in_the_name():
    kernels = table("kernels", [
        kernel(0, "gemm", 0, 10, stream=7), kernel(0, "gemm", 20, 10, stream=7),
        kernel(0, "Memcpy HtoD (Pageable -> Device)", 0, 5, stream=13, kind="memcpy"),
        kernel(0, "Memset (Device)", 10, 5, stream=13, kind="memset"),
        kernel(0, "aten::mm", 0, 30, stream=0, kind="cpu_op"),
        kernel(1, "gemm", 0, 10, stream=7, device=0), kernel(1, "gemm", 0, 10, stream=7, device=1)])
    dec = check_round_trip(None, kernels)
    assert dec.children(0) == ["stream 0 (cpu_op)", "stream 7", "stream 13 (memcpy, memset)"]
    assert dec.children(1) == ["gpu 0 stream 7", "gpu 1 stream 7"]
    by_name = {s.name: s for s in dec.slices}
    assert by_name["Memset (Device)"].category == "memset"
    assert by_name["aten::mm"].category == "cpu_op"


def test_every_row_becomes_one_begin_end_pair_with_exact_ns_timestamps():
    rows = [phase(0, "forward-compute", 1_764_000_000_000_000_123, 999_999_937),
            phase(0, "self_attention", 1_764_000_000_000_000_124, 5),
            phase(0, "tp-allreduce", 1_764_000_000_000_000_125, 1, cat="comm", group="tp")]
    dec = check_round_trip(table("phases", rows), None)
    events = [p for p in dec.trace.packet if p.HasField("track_event")]
    assert sum(p.track_event.type == BEGIN for p in events) == 3
    assert sum(p.track_event.type == END for p in events) == 3
    assert {dec.track_name(s) for s in dec.slices} == {"phases"}


def test_names_with_template_punctuation_and_quotes_resolve_through_interning():
    names = ['void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 4, false>, true>(flash::Flash_fwd_params)',
             'at::native::(anonymous namespace)::"quoted" \'kernel\'', "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)",
             "naïve ∑ kernel", ""]
    kernels = table("kernels", [kernel(0, n, 10 * i, 5) for i, n in enumerate(names)]
                    + [kernel(1, n, 10 * i, 5) for i, n in enumerate(names)])
    data = build_perfetto_trace(phases=None, kernels=kernels)
    dec = check_round_trip(None, kernels)
    assert sorted(dec.names.values()) == sorted(names)  # each name interned once
    assert sum(data.count(n.encode()) for n in names if n) == len(names) - 1  # and travels once


def test_phases_nest_and_carry_step_microbatch_and_group_annotations():
    rows = [phase(0, "forward-compute", 0, 100, step=5, mb=2),
            phase(0, "self_attention", 10, 40, step=5, mb=2),
            phase(0, "tp-allreduce", 30, 10, cat="comm", group="tp", step=5, mb=2),
            phase(0, "optimizer", 200, 10, cat="compute", step=5, mb=-1)]
    dec = check_round_trip(table("phases", rows), None)
    by_name = {s.name: s for s in dec.slices}
    assert {dec.track_name(s) for s in dec.slices} == {"phases"}
    assert by_name["tp-allreduce"].args == {"step": 5, "microbatch": 2, "group": "tp"}
    assert by_name["tp-allreduce"].category == "comm"
    assert by_name["optimizer"].args == {"step": 5}  # step-level: no microbatch annotation


def test_straddling_pp_send_goes_to_a_comm_track_and_compute_stays_nested():
    # pp-send of microbatch 3 starts inside forward-compute 3 and ends after backward-compute 2 began.
    rows = [phase(0, "forward-compute", 0, 100, mb=3), phase(0, "mlp", 10, 50, mb=3),
            phase(0, "pp-send", 90, 30, cat="comm", group="pp", mb=3),
            phase(0, "backward-compute", 100, 100, mb=2), phase(0, "mlp-bwd", 110, 50, mb=2),
            phase(0, "tp-allreduce", 120, 10, cat="comm", group="tp", mb=2)]
    dec = check_round_trip(table("phases", rows), None)
    tracks = {s.name: dec.track_name(s) for s in dec.slices}
    assert tracks == {"forward-compute": "phases", "mlp": "phases", "pp-send": "phases (comm)",
                      "backward-compute": "phases", "mlp-bwd": "phases", "tp-allreduce": "phases"}
    assert dec.children(0) == ["phases", "phases (comm)"]


def test_comm_phase_straddled_by_a_later_compute_phase_leaves_the_main_track():
    # pp-recv starts before forward-compute and ends inside it: compute keeps the main track.
    rows = [phase(0, "pp-recv", 0, 20, cat="comm", group="pp"), phase(0, "forward-compute", 10, 100),
            phase(0, "mlp", 30, 20)]
    dec = check_round_trip(table("phases", rows), None)
    tracks = {s.name: dec.track_name(s) for s in dec.slices}
    assert tracks == {"pp-recv": "phases (comm)", "forward-compute": "phases", "mlp": "phases"}


def test_overlapping_compute_phases_get_extra_tracks():
    # c lies inside both a and b: it goes under the innermost (b); e lies inside a only.
    rows = [phase(0, "a", 0, 100), phase(0, "b", 50, 100), phase(0, "c", 60, 10), phase(0, "d", 120, 10),
            phase(0, "e", 20, 10)]
    dec = check_round_trip(table("phases", rows), None)
    tracks = {s.name: dec.track_name(s) for s in dec.slices}
    assert tracks == {"a": "phases", "b": "phases (2)", "c": "phases (2)", "d": "phases (2)", "e": "phases"}


def test_zero_length_identical_and_touching_slices_nest():
    rows = [phase(0, "outer", 0, 100), phase(0, "twin", 0, 100), phase(0, "zero", 0, 0),
            phase(0, "zero2", 0, 0), phase(0, "left", 10, 40), phase(0, "right", 50, 50),
            phase(0, "edge", 50, 0), phase(0, "end", 100, 0)]
    dec = check_round_trip(table("phases", rows), None)
    assert {dec.track_name(s) for s in dec.slices} == {"phases"}


def test_overlapping_kernels_on_one_stream_are_split_into_lanes():
    kernels = table("kernels", [kernel(0, "k1", 0, 100), kernel(0, "k2", 50, 100), kernel(0, "k3", 200, 10)])
    dec = check_round_trip(None, kernels)
    tracks = {s.name: dec.track_name(s) for s in dec.slices}
    assert tracks == {"k1": "stream 7", "k2": "stream 7 #2", "k3": "stream 7"}


def test_unfinished_slices_end_at_trace_end_and_say_they_never_finished():
    phases = table("phases", [phase(0, "forward-compute", 0, -1), phase(0, "tp-allreduce", 10, -1, cat="comm"),
                              phase(1, "forward-compute", 0, 30), phase(1, "tp-allreduce", 10, 15, cat="comm")])
    kernels = table("kernels", [kernel(1, "gemm", 100, 400), kernel(0, "nccl", 10, -1)])
    dec = check_round_trip(phases, kernels)
    trace_end = 500  # the last finished end (gemm)
    for s in dec.slices:
        unfinished = dec.rank_of(s) == 0
        assert (s.args.get("status") == UNFINISHED) == unfinished
        assert (s.end == trace_end) if unfinished else (s.end < trace_end or s.name == "gemm")


def test_collectives_are_linked_across_ranks_in_arrival_order():
    rows = []
    for rank, delay in ((0, 5), (1, 0), (2, 9)):  # rank 2 arrives last
        rows += [phase(rank, "tp-allreduce", 100 + delay, 20 - delay, cat="comm", group="tp"),
                 phase(rank, "mlp", 200, 10)]
        if rank != 2:  # rank 2 never joined the second allreduce of this microbatch
            rows.append(phase(rank, "tp-allreduce", 300 + rank, 10, cat="comm", group="tp"))
    rows.append(phase(0, "tp-allreduce", 500, 10, cat="comm", group="tp", mb=1))  # alone: no flow
    phases = table("phases", rows)
    dec = check_round_trip(phases, None)
    flows: dict[int, list[Slice]] = defaultdict(list)
    terminating: dict[int, list[Slice]] = defaultdict(list)
    for s in dec.slices:
        for f in s.flow_ids:
            flows[f].append(s)
        for f in s.terminating_flow_ids:
            terminating[f].append(s)
    assert sorted(flows) == sorted(terminating) and len(flows) == 2
    members = []
    for f in flows:
        assert len(terminating[f]) == 1
        chain = sorted(flows[f], key=lambda s: s.start) + terminating[f]
        assert [s.start for s in chain] == sorted(s.start for s in chain)  # the last arrival terminates
        members.append({(dec.rank_of(s), s.start) for s in chain})
    assert sorted(members, key=len) == sorted(expected_collectives(phases), key=len)
    last_arrival = {len(flows[f]) + 1: (dec.rank_of(t[0]), t[0].start) for f, t in terminating.items()}
    assert last_arrival == {3: (2, 109), 2: (1, 301)}  # {collective size: (rank, start) of the last arrival}


def test_members_arriving_at_the_same_instant_are_still_chained_in_file_order():
    rows = [phase(r, "dp-allgather", 100, 10 + r, cat="comm", group="dp", mb=-1) for r in (3, 1, 2, 0)]
    dec = check_round_trip(table("phases", rows), None)  # decode checks start-before-terminate
    assert sum(len(s.terminating_flow_ids) for s in dec.slices) == 1
    assert sum(len(s.flow_ids) for s in dec.slices) == 3


def test_missing_columns_are_named():
    with pytest.raises(StoreError, match="stream"):
        build_perfetto_trace(phases=None, kernels=table("kernels", [kernel(0, "k", 0, 1)]).drop(["stream"]))


intervals = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(-1, 30),
                               st.sampled_from(["compute", "comm", "host"]), st.integers(0, 2)),
                     min_size=0, max_size=40)


@settings(max_examples=150, deadline=None)
@given(intervals, intervals)
def test_arbitrary_overlaps_always_give_nesting_tracks(phase_rows, kernel_rows):
    """Whatever the overlaps, zero lengths, duplicates and unfinished slices: every input row is
    one slice with its exact times, every track nests, and flows start before they end."""
    phases = table("phases", [phase(r, f"p{i % 5}", s, d, cat=c, mb=m) for i, (r, s, d, c, m) in enumerate(phase_rows)])
    kernels = table("kernels", [kernel(r, f"k{i % 3}", s, d, stream=m) for i, (r, s, d, _, m) in enumerate(kernel_rows)])
    dec = check_round_trip(phases, kernels)
    for s in dec.slices:
        name = dec.track_name(s)
        assert name.startswith("stream") if s.name.startswith("k") else name.startswith("phases")
        if name.startswith("phases (comm"):
            assert s.category == "comm"


def test_empty_inputs_give_a_valid_near_empty_trace(tmp_path: Path):
    for phases, kernels in ((None, None), (TABLES["phases"].schema.empty_table(), TABLES["kernels"].schema.empty_table())):
        size = write_perfetto_trace(tmp_path / "empty.pftrace", phases=phases, kernels=kernels)
        data = (tmp_path / "empty.pftrace").read_bytes()
        assert size == len(data) > 0
        dec = decode(data)
        assert dec.slices == [] and dec.tracks == {}


def test_title_adds_one_window_slice_spanning_the_trace():
    phases = table("phases", [phase(0, "a", 100, 50), phase(1, "b", 120, -1)])
    dec = decode(build_perfetto_trace(phases=phases, kernels=None, title="window 7 (steps 70-79)"))
    (window,) = [s for s in dec.slices if s.track == 1]
    assert (window.name, window.start, window.end) == ("window 7 (steps 70-79)", 100, 150)
    assert len(dec.slices) == 3


def test_write_is_atomic_and_returns_the_size(tmp_path: Path):
    phases, kernels = table("phases", [phase(0, "a", 0, 5)]), table("kernels", [kernel(0, "k", 0, 5)])
    path = tmp_path / "sub" / "w000001.pftrace"
    size = write_perfetto_trace(path, phases=phases, kernels=kernels)
    assert path.stat().st_size == size
    size2 = write_perfetto_trace(path, phases=phases, kernels=None)  # replaced whole, not appended
    assert path.stat().st_size == size2 < size
    assert sorted(p.name for p in path.parent.iterdir()) == ["w000001.pftrace"]  # no temp leftovers


def test_simulated_window_round_trips_with_nesting_and_flows():
    phases, kernels = sim_window(ranks=16)
    hosts = {r: f"node-{r // 8:04d}" for r in range(16)}
    dec = check_round_trip(phases, kernels, hosts=hosts)
    assert len(dec.slices) == phases.num_rows + kernels.num_rows
    procs = {t.process.pid: t.name for t in dec.tracks.values() if t.HasField("process")}
    assert procs == {r: f"rank {r} ({hosts[r]})" for r in range(16)}
    streams = set(kernels.filter(pa.compute.equal(kernels["rank"], 0))["stream"].to_pylist())
    assert {n for n in dec.children(0) if n.startswith("stream")} == {f"stream {s}" for s in streams}
    by_flow: dict[int, set] = defaultdict(set)
    for s in dec.slices:
        for f in s.flow_ids + s.terminating_flow_ids:
            by_flow[f].add((dec.rank_of(s), s.start))
    assert sorted(map(sorted, by_flow.values())) == sorted(map(sorted, expected_collectives(phases)))


def test_simulated_hang_draws_unfinished_phases_to_the_end():
    phases, kernels = sim_window(ranks=16, steps=3, scenario="hang")
    unfinished = phases.filter(pa.compute.equal(phases["dur_ns"], -1)).num_rows
    assert unfinished > 0
    dec = check_round_trip(phases, kernels)
    assert sum(s.args.get("status") == UNFINISHED for s in dec.slices) == unfinished


def test_throughput_is_printed_not_asserted():
    phases, kernels = sim_window(ranks=8, steps=2)
    n = phases.num_rows + kernels.num_rows
    t0 = time.perf_counter()
    data = build_perfetto_trace(phases=phases, kernels=kernels)
    dt = time.perf_counter() - t0
    print(f"\nperfetto evidence: {n} events in {dt * 1e3:.0f} ms = {n / dt:,.0f} events/s, {len(data) / n:.0f} B/event")


# ----------------------------------------------------------------------------- the column encoder

int64s = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(int64s, st.integers(0, 2 ** 64 - 1), st.booleans(), st.integers(0, 2 ** 64 - 1)),
                min_size=1, max_size=40))
def test_column_encoder_matches_protobuf(rows):
    """_Wire's bytes parse back to the values, for every varint width, signs and optional fields."""
    n = len(rows)
    ints = np.array([r[0] for r in rows], np.int64)
    uuids = np.array([r[1] for r in rows], np.uint64)
    present = np.array([r[2] for r in rows])
    flows = np.array([r[3] for r in rows], np.uint64)
    arg = _Wire(n)
    arg.varint(1, np.full(n, 300))
    arg.varint(4, ints)
    te = _Wire(n)
    te.message(4, arg, where=present)
    te.varint(11, uuids)
    te.fixed64(47, flows, where=~present)
    packet = _Wire(n)
    packet.message(11, te)
    trace = _Wire(n)
    trace.message(1, packet)
    parsed = pb.Trace()
    parsed.ParseFromString(trace.tobytes())
    assert len(parsed.packet) == n
    for p, (value, uuid, has_arg, flow) in zip(parsed.packet, rows):
        e = p.track_event
        assert e.track_uuid == uuid
        if has_arg:
            assert [(a.name_iid, a.int_value) for a in e.debug_annotations] == [(300, value)]
            assert list(e.flow_ids) == []
        else:
            assert len(e.debug_annotations) == 0 and list(e.flow_ids) == [flow]
        expected = pb.TracePacket()
        expected.track_event.CopyFrom(e)
        assert expected.SerializeToString() == p.SerializeToString()  # canonical encoding


@pytest.mark.parametrize("n", [0, 1])
def test_column_encoder_handles_tiny_batches(n):
    w = _Wire(n)
    w.varint(8, np.arange(n))
    assert w.tobytes() == (b"" if n == 0 else b"\x40\x00")
