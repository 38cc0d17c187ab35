"""A push copies what makes data visible after the data: window commit records after their
files, attempt metadata last, so a reader of the bucket mid-push never sees a window whose
files are still on their way."""

import numpy as np

from argus.objstore import LocalObjectStore, push
from argus.store import Store
from argus.topology import RunIdentity, Topology, parse_layout


class _Recording(LocalObjectStore):
    def __init__(self, root):
        super().__init__(root)
        self.order: list[str] = []

    def put(self, key, data):
        self.order.append(key)
        super().put(key, data)


def test_push_copies_commit_records_after_their_data_and_metadata_last(tmp_path):
    store = Store.create(tmp_path / "s")
    attempt = store.create_attempt(RunIdentity("run-a"), Topology.uniform(parse_layout("dp=4"), gpus_per_host=4),
                                   source="test")
    r = np.arange(4)
    for window in range(3):
        unit = attempt.writer("host-a").unit(window=window)
        unit.write("steps", {"rank": r, "step": np.full(4, window), "start_ns": r, "end_ns": r + 5})
        unit.commit()
    dst = _Recording(tmp_path / "bucket")
    push(tmp_path / "s", dst)
    kinds = ["meta" if k.endswith(("attempt.json", "argus-store.json")) else
             "commit" if "/commits/" in k else "data" for k in dst.order]
    assert kinds.count("commit") == 3 and kinds.count("data") >= 3
    assert kinds == sorted(kinds, key=["data", "commit", "meta"].index)
