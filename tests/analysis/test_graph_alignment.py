"""Ranks of one stage that post a pipeline send or receive early or late between their
collectives (batched, asynchronous p2p: the order the recording shows is the step's timing, not
the program) still share their stage's template: the step is replayed, not set aside as
irregular. Seen on Megatron-shaped Kineto traces, where no step of a 32-rank job agreed."""

from __future__ import annotations

import numpy as np

from argus.analysis.attribution.chains import build_chains
from argus.analysis.attribution.graph import build_graphs
from argus.analysis.frames import PhaseFrame
from argus.topology import parse_layout

NAMES = ["tp-allreduce", "forward-send", "backward-recv", "forward-compute", "forward-recv"]
CATS = ["comm", "compute"]
GROUPS = ["tp", "pp", ""]
MS = 1_000_000


def _stage0(early: bool) -> list[tuple[str, int]]:
    """(name, microbatch) in recorded order: a forward and its send per microbatch, each forward
    closed by a tp all-reduce; the backward receive posted after the second all-reduce, or
    (``early``) before it."""
    seq = [("forward-compute", 0), ("tp-allreduce", 0), ("forward-send", 0),
           ("forward-compute", 1), ("tp-allreduce", 1), ("forward-send", 1), ("backward-recv", 0)]
    if early:
        seq = seq[:4] + [("backward-recv", 0), ("tp-allreduce", 1), ("forward-send", 1)]
    return seq


def _stage1() -> list[tuple[str, int]]:
    return [("forward-recv", 0), ("forward-compute", 0), ("tp-allreduce", 0),
            ("forward-recv", 1), ("forward-compute", 1), ("tp-allreduce", 1)]


def _frame(steps: int, early_rank: int | None) -> PhaseFrame:
    rows = []  # (rank, step, mb, name, start, dur)
    for rank in range(4):
        for step in range(steps):
            seq = _stage1() if rank >= 2 else _stage0(rank == early_rank and step % 2 == 1)
            t = step * 20 * MS
            for name, mb in seq:
                rows.append((rank, step, mb, NAMES.index(name), t, MS // 2))
                t += MS
    a = np.array(rows, np.int64)
    name = a[:, 3].astype(np.int32)
    comm = np.isin(name, [0, 1, 2, 4])
    cat = np.where(comm, 0, 1).astype(np.int32)
    group = np.where(name == 0, 0, np.where(comm, 1, 2)).astype(np.int32)
    busy = np.where(comm, np.nan, a[:, 5].astype(np.float64))
    return PhaseFrame(0, steps - 1, a[:, 0], a[:, 1], a[:, 2], name, cat, group, a[:, 4], a[:, 5], busy,
                      NAMES, CATS, GROUPS, np.full(len(rows), -1, np.int64))


def _sequence(ch, rank: int, step: int) -> list[str]:
    run = int(np.flatnonzero((ch.run_rank == rank) & (ch.run_step == step))[0])
    first = int(ch.run_first[run])
    return [ch.names[int(ch.name[e])] for e in range(first, first + int(ch.run_count[run]))]


def test_a_receive_posted_early_on_one_rank_keeps_the_step_in_the_graph():
    layout = parse_layout("tp=2,pp=2")
    hosts = np.array(["h0"] * 4)
    steps = 4
    ch = build_chains(_frame(steps, early_rank=1), layout, hosts)
    assert _sequence(ch, 1, 1) != _sequence(ch, 0, 1)  # the premise: rank 1's odd steps read differently
    graphs = build_graphs(ch, layout)
    assert len(graphs) == 1
    g = graphs[0]
    assert g.steps.tolist() == list(range(steps)) and g.irregular_steps == []
    assert _sequence(ch, 1, 1) == _sequence(ch, 0, 1)  # put in its stage's order
    # every rank's events are all there, in each stage's one order
    for rank in range(4):
        assert sorted(_sequence(ch, rank, 1)) == sorted(_sequence(ch, rank, 0))


def test_a_different_collective_still_makes_the_step_irregular():
    """Only sends and receives may sit elsewhere: a rank that ran another collective (a
    different program) is not forced into the template."""
    layout = parse_layout("tp=2,pp=2")
    f = _frame(4, early_rank=None)
    # rank 0, step 2: its second tp all-reduce recorded as a forward-send (another event entirely)
    sel = np.flatnonzero((f.rank == 0) & (f.step == 2) & (f.name == 0))[1]
    f.name[sel] = 1
    f.group[sel] = 1
    ch = build_chains(f, layout, np.array(["h0"] * 4))
    g = build_graphs(ch, layout)[0]
    assert 2 in g.irregular_steps and 2 not in g.steps.tolist()
