import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argus.errors import LayoutError
from argus.topology import AXES, GROUP_KINDS, Layout, parse_layout, parse_order


def test_known_assignment_16_ranks_tp2_pp4():
    lay = parse_layout("tp=2,pp=4", world_size=16)
    assert (lay.tp, lay.cp, lay.ep, lay.dp, lay.pp) == (2, 1, 1, 2, 4)
    assert lay.groups("tp").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert lay.groups("pp").tolist() == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert lay.groups("dp").tolist() == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert lay.peer_set(5).tolist() == [5, 7]
    assert lay.stage_of(np.array([0, 3, 4, 15])).tolist() == [0, 0, 1, 3]


def test_design_example_with_expert_parallelism():
    # DESIGN.md §3: tp=2,pp=2,dp=2,ep=4 is 32 ranks; dense DP varies ep and dp, expert DP only dp.
    lay = parse_layout("tp=2,pp=2,dp=2,ep=4")
    assert lay.world_size == 32
    assert lay.group_of("ep", 0).tolist() == [0, 2, 4, 6]
    assert lay.group_of("dp", 0).tolist() == [0, 2, 4, 6, 8, 10, 12, 14]
    assert lay.group_of("edp", 0).tolist() == [0, 8]
    assert lay.group_of("pp", 0).tolist() == [0, 16]
    assert lay.group_of("tp", 31).tolist() == [30, 31]
    assert lay.group_of("world", 3).tolist() == list(range(32))


def test_custom_order_changes_which_axis_is_fastest():
    lay = parse_layout("tp=2,dp=2,pp=2", order="dp-tp-pp")
    assert lay.group_of("dp", 0).tolist() == [0, 1]
    assert lay.group_of("tp", 0).tolist() == [0, 2]
    assert lay.order == ("dp", "tp", "pp", "cp", "ep")


def test_dp_is_derived_from_world_size_and_printing_round_trips():
    lay = parse_layout(" TP=8 , pp=8, ep=8 ", world_size=10240)
    assert lay.dp == 20
    assert parse_layout(str(lay)) == lay


@pytest.mark.parametrize("text, world, message", [
    ("tp=3,pp=4", 16, "does not divide the world size 16"),
    ("tp=2,pp=4,dp=4", 16, "has 32 ranks but the world size is 16"),
    ("tp=2,xp=4", None, "unknown layout key 'xp'"),
    ("tp=0", None, "must be at least 1"),
    ("tp=-2", None, "must be at least 1"),
    ("tp=two", None, "is not an integer"),
    ("tp=2,tp=2", None, "given twice"),
    ("tp2", None, "is not key=value"),
])
def test_bad_layouts_get_a_clear_error(text, world, message):
    with pytest.raises(LayoutError, match=message):
        parse_layout(text, world_size=world)


@pytest.mark.parametrize("order, message", [
    ("tp-cp-xx-dp-pp", "unknown axis 'xx'"),
    ("tp-tp-dp-pp", "appears twice"),
    ("tp-dp", "leaves out pp"),
    ("", "empty rank order"),
])
def test_bad_orders_get_a_clear_error(order, message):
    with pytest.raises(LayoutError, match=message):
        parse_layout("tp=2,dp=2,pp=2", order=order)


def test_order_may_leave_out_size_one_axes():
    assert parse_order("pp-tp", {"tp": 2, "pp": 2}) == ("pp", "tp", "cp", "ep", "dp")


def test_unknown_group_kind_is_an_error():
    with pytest.raises(LayoutError, match="unknown group kind"):
        Layout(tp=2).groups("xp")


layouts = st.builds(
    lambda sizes, perm: Layout(**dict(zip(AXES, sizes)), order=perm),
    st.tuples(*[st.integers(1, 4)] * 5),
    st.permutations(AXES),
)


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_groups_partition_the_world(lay):
    world = lay.world_size
    for kind in GROUP_KINDS:
        table = lay.groups(kind)
        assert table.shape == (world // lay.group_size(kind), lay.group_size(kind))
        assert sorted(table.ravel().tolist()) == list(range(world))  # every rank exactly once
        idx = lay.group_index(kind)
        for g, row in enumerate(table):
            assert (idx[row] == g).all()


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_group_members_differ_only_in_the_groups_axes(lay):
    coords = lay.coords()
    varying = {"tp": {"tp"}, "cp": {"cp"}, "ep": {"ep"}, "pp": {"pp"}, "dp": {"cp", "ep", "dp"},
               "edp": {"dp"}, "world": set(AXES)}
    for kind, axes in varying.items():
        for row in lay.groups(kind):
            for axis in AXES:
                distinct = len(set(coords[axis][row].tolist()))
                assert distinct == (getattr(lay, axis) if axis in axes else 1)


@settings(max_examples=100, deadline=None)
@given(layouts, st.data())
def test_peers_share_stage_and_tp_shard(lay, data):
    rank = data.draw(st.integers(0, lay.world_size - 1))
    peers = lay.peer_set(rank)
    c = lay.coords(peers)
    me = lay.coords(rank)
    assert rank in peers.tolist()
    assert (c["pp"] == me["pp"]).all() and (c["tp"] == me["tp"]).all()
    assert len(peers) == lay.cp * lay.ep * lay.dp


@settings(max_examples=100, deadline=None)
@given(layouts)
def test_coordinates_round_trip(lay):
    coords = lay.coords()
    assert lay.rank_of(**coords).tolist() == list(range(lay.world_size))
    # the fastest axis of the order has stride 1
    assert lay.strides[lay.order[0]] == 1


def test_every_small_layout_parses_from_its_string():
    for sizes in itertools.product([1, 2, 3], repeat=5):
        lay = Layout(**dict(zip(AXES, sizes)))
        assert parse_layout(str(lay), world_size=lay.world_size) == lay
