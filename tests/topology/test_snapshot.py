import numpy as np
import pytest

from argus.errors import LayoutError
from argus.topology import RunIdentity, Topology, parse_layout


def test_uniform_placement_packs_consecutive_ranks_per_host():
    topo = Topology.uniform(parse_layout("tp=2,pp=2", world_size=16), gpus_per_host=8)
    assert topo.host_names == ["node-0000", "node-0001"]
    assert topo.ranks_on("node-0001").tolist() == list(range(8, 16))
    assert topo.local_ranks.tolist() == list(range(8)) * 2
    assert len(set(topo.gpu_uuids.tolist())) == 16
    assert all(u.startswith("GPU-") for u in topo.gpu_uuids)


def test_topology_table_round_trips():
    lay = parse_layout("tp=2,ep=2,pp=2", world_size=16)
    topo = Topology.uniform(lay, gpus_per_host=4)
    table = topo.to_table()
    assert table.column_names[:4] == ["rank", "host", "local_rank", "gpu_uuid"]
    assert table.column("ep").to_pylist()[:4] == [0, 0, 1, 1]
    back = Topology.from_table(table, lay)
    assert back.hosts.tolist() == topo.hosts.tolist()
    assert np.array_equal(back.local_ranks, topo.local_ranks)


def test_hosts_merge_their_own_rows_and_unknown_ranks_stay_unknown():
    lay = parse_layout("dp=6")
    full = Topology.uniform(lay, 2)
    host_a, host_c = full.rows([0, 1]), full.rows([4, 5])
    import pyarrow as pa

    restarted = full.rows([4]).set_column(9, "topology_version", pa.array([2], pa.int32()))
    restarted = restarted.set_column(1, "host", pa.array(["node-moved"]))
    merged = Topology.from_table(pa.concat_tables([host_a, host_c, restarted]), lay)
    assert merged.hosts.tolist() == ["node-0000", "node-0000", "unknown", "unknown", "node-moved", "node-0002"]
    assert merged.local_ranks.tolist()[2] == -1 and merged.version == 2
    with pytest.raises(LayoutError, match="outside a world of 6"):
        Topology.from_table(Topology.uniform(parse_layout("dp=8"), 2).to_table(), lay)


@pytest.mark.parametrize("bad", ["", "a/b", ".hidden"])
def test_run_identity_rejects_path_like_ids(bad):
    with pytest.raises(LayoutError):
        RunIdentity(bad)
