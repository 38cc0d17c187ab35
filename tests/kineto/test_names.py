import pytest

from argus.kineto import group_kind_of, phase_name, rank_from_filename
from argus.topology import parse_layout


@pytest.mark.parametrize("raw, name, category, group, microbatch", [
    ("## forward ##", "forward", "compute", "", -1),
    ("##backward##", "backward", "compute", "", -1),
    ("nccl:all_reduce", "nccl:all_reduce", "comm", "", -1),
    ("gloo:broadcast", "gloo:broadcast", "comm", "", -1),
    ("tp-allreduce", "tp-allreduce", "comm", "tp", -1),
    ("dp-reduce-scatter", "dp-reduce-scatter", "comm", "dp", -1),
    ("pp-send", "pp-send", "comm", "pp", -1),
    ("grad-norm-allreduce", "grad-norm-allreduce", "comm", "", -1),
    ("barrier", "barrier", "comm", "", -1),
    ("## alltoall_fwd_single ##", "alltoall_fwd_single", "comm", "", -1),
    ("forward-compute-mb7", "forward-compute-mb7", "compute", "", 7),
    ("backward-compute-mb12", "backward-compute-mb12", "compute", "", 12),
    ("microbatch_3", "microbatch_3", "compute", "", 3),
    ("self_attention", "self_attention", "compute", "", -1),
    ("KJTAllToAllSplitsAwaitable wait()", "KJTAllToAllSplitsAwaitable wait()", "compute", "", -1),
    ("sendmail", "sendmail", "compute", "", -1),
    ("embedding_mb", "embedding_mb", "compute", "", -1),
])
def test_annotation_names_map_to_phase_fields(raw, name, category, group, microbatch):
    info = phase_name(raw)
    assert (info.name, info.category, info.group_kind, info.microbatch) == (name, category, group, microbatch)


@pytest.mark.parametrize("filename, rank", [
    ("rank3.json", 3), ("trace_rank-12.json.gz", 12), ("RANK_5.pt.trace.json", 5),
    ("sampled_rank-1.json.gz", 1), ("worker0.json", None),
])
def test_rank_comes_from_rank_n_in_the_file_name(filename, rank):
    assert rank_from_filename(filename) == rank


def test_a_process_group_maps_to_the_most_specific_group_kind_of_the_layout():
    layout = parse_layout("tp=2,pp=2,dp=2")
    assert group_kind_of(layout, 0, [0, 1]) == "tp"
    assert group_kind_of(layout, 0, [0, 2]) == "dp"
    assert group_kind_of(layout, 0, [0, 4]) == "pp"
    assert group_kind_of(layout, 0, range(8)) == "world"
    assert group_kind_of(layout, 0, [0, 3]) == ""  # not a group of this layout
    assert group_kind_of(layout, 0, [1, 3]) == ""  # a group rank 0 is not in
    assert group_kind_of(parse_layout("dp=2"), 1, [0, 1]) == "dp"  # DDP's one group is the dp group
