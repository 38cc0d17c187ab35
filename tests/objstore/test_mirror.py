"""The live mirror on real stores and a real directory bucket: per-host evidence budgets in a
shared bucket, no bucket listing after the first push, a lost ledger rebuilt, an interrupted
push finished in order."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from argus.objstore import (MIRROR_STATE_DIR, LocalObjectStore, Mirror, ObjectStoreError, enforce_remote_retention,
                            evidence_prefixes, pull, push)
from argus.store import Store
from argus.topology import RunIdentity, Topology, parse_layout

TRACE_BYTES = 1000
RUN = RunIdentity("run-a")


class Counting:
    """Delegates to a real backend; counts calls, keeps the order of successful PUTs, and can
    refuse the N-th PUT (as a bucket that goes away mid-push)."""

    def __init__(self, inner, fail_put_at: int | None = None):
        self.inner, self.uri, self.fail_put_at = inner, inner.uri, fail_put_at
        self.calls = {"put": 0, "get": 0, "list": 0, "delete": 0}
        self.list_args: list[tuple[str, bool]] = []
        self.put_order: list[str] = []

    def put(self, key, data):
        self.calls["put"] += 1
        if self.fail_put_at is not None and self.calls["put"] == self.fail_put_at:
            raise ObjectStoreError(f"{self.uri}: put {key}: connection reset (injected)")
        self.inner.put(key, data)
        self.put_order.append(key)

    def get(self, key):
        self.calls["get"] += 1
        return self.inner.get(key)

    def list(self, prefix="", recursive=True):
        self.calls["list"] += 1
        self.list_args.append((prefix, recursive))
        return self.inner.list(prefix, recursive=recursive)

    def delete(self, key):
        self.calls["delete"] += 1
        return self.inner.delete(key)


def _host_store(path: Path, host: str, windows: int = 3, traces: int = 0, t0: float | None = None) -> Path:
    """A real store as one host's processor leaves it: committed windows of its writer and
    Perfetto evidence under ``evidence/<host>/``, oldest first."""
    store = Store.create(path)
    attempt = store.open_or_create_attempt(RUN, Topology.uniform(parse_layout("dp=4"), gpus_per_host=4), source="test")
    _windows(attempt.path, host, range(windows))
    _traces(attempt.path, host, range(traces), t0)
    return path


def _windows(attempt_path: Path, host: str, windows) -> None:
    from argus.store.attempt import Attempt

    attempt = Attempt.open(attempt_path)
    r = np.arange(4)
    for w in windows:
        unit = attempt.writer(host).unit(window=w)
        unit.write("steps", {"rank": r, "step": np.full(4, w), "start_ns": r, "end_ns": r + 5})
        unit.write("hw", {"rank": r, "gpu_uuid": [f"GPU-{i}" for i in r], "ts_ns": r + w, "metric": ["util"] * 4,
                          "value": np.full(4, 0.5)})
        unit.commit()


def _traces(attempt_path: Path, host: str, indices, t0: float | None = None) -> list[Path]:
    t0 = time.time() - 3600 if t0 is None else t0
    out = []
    for i in indices:
        p = attempt_path / "evidence" / host / f"{i:09d}-{host[-1] * 8}.pftrace"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes([i % 256]) * TRACE_BYTES)
        os.utime(p, (t0 + 60 * i, t0 + 60 * i))
        out.append(p)
    return out


def _remote_traces(bucket: LocalObjectStore, host: str) -> list[str]:
    return sorted(o.key.rsplit("/", 1)[-1] for o in bucket.list(f"runs/{RUN.run_id}/0/evidence/{host}"))


def _names(indices, host: str) -> list[str]:
    return [f"{i:09d}-{host[-1] * 8}.pftrace" for i in indices]


def test_hosts_sharing_a_bucket_each_keep_their_own_budget(tmp_path):
    bucket = LocalObjectStore(tmp_path / "bucket")
    a = _host_store(tmp_path / "a", "host-a", traces=6)
    b = _host_store(tmp_path / "b", "host-b", traces=6)
    ma = Mirror(a, bucket, max_bytes=3 * TRACE_BYTES, max_age_s=None, host="host-a")
    mb = Mirror(b, bucket, max_bytes=3 * TRACE_BYTES, max_age_s=None, host="host-b")
    ma.once()
    mb.once()
    ma.once()  # the whole bucket holds 6 traces now, twice one host's budget: nothing of host-b's goes
    assert _remote_traces(bucket, "host-a") == _names(range(3, 6), "host-a")
    assert _remote_traces(bucket, "host-b") == _names(range(3, 6), "host-b")
    assert ma.stats.deleted == 0  # the three oldest were past the budget on arrival: never uploaded
    # host-a writes two more windows' traces: its own oldest copies in the bucket go, none of host-b's
    _traces(a / "runs" / RUN.run_id / "0", "host-a", range(6, 8))
    ma.once()
    mb.once()
    assert _remote_traces(bucket, "host-a") == _names(range(5, 8), "host-a")
    assert _remote_traces(bucket, "host-b") == _names(range(3, 6), "host-b")
    assert ma.stats.deleted == 2 and mb.stats.deleted == 0
    # tables of both hosts are all there, and retention never re-uploads what it deleted
    for _store, host in ((a, "host-a"), (b, "host-b")):
        assert len(bucket.list(f"runs/{RUN.run_id}/0/steps/{host}")) == 3
    assert ma.once().copied == 0 and mb.once().copied == 0


def test_retention_by_age_in_the_bucket_is_per_host_and_by_the_traces_own_time(tmp_path):
    bucket = LocalObjectStore(tmp_path / "bucket")
    now = 1_750_000_000.0
    a = _host_store(tmp_path / "a", "host-a", traces=4, t0=now - 4 * 60)  # 240, 180, 120, 60 s old
    b = _host_store(tmp_path / "b", "host-b", traces=4, t0=now - 4 * 60)
    ma = Mirror(a, bucket, max_bytes=None, max_age_s=150, host="host-a", clock=lambda: now)
    mb = Mirror(b, bucket, max_bytes=None, max_age_s=1e9, host="host-b", clock=lambda: now)
    ma.once()
    mb.once()
    assert _remote_traces(bucket, "host-a") == _names(range(2, 4), "host-a")  # the two past 150 s never went up
    assert _remote_traces(bucket, "host-b") == _names(range(4), "host-b")
    assert ma.stats.copied and ma.stats.deleted == 0


def test_a_mirror_lists_the_bucket_only_before_its_first_push(tmp_path):
    bucket = Counting(LocalObjectStore(tmp_path / "bucket"))
    store = _host_store(tmp_path / "s", "host-a", traces=4)
    attempt_path = store / "runs" / RUN.run_id / "0"
    m = Mirror(store, bucket, max_bytes=3 * TRACE_BYTES, max_age_s=None, host="host-a")
    first = m.once()
    assert first.copied > 0 and bucket.calls["list"] == first.listed > 0
    assert all(not recursive for _, recursive in bucket.list_args)  # one directory each, never the whole bucket
    assert {p for p, _ in bucket.list_args} <= {o.rsplit("/", 1)[0] if "/" in o else "" for o in _local_keys(store)}
    listed = bucket.calls["list"]
    # the store grows; the mirror pushes it and applies retention, all without a listing
    _windows(attempt_path, "host-a", range(3, 6))
    _traces(attempt_path, "host-a", range(4, 6))
    second = m.once()
    assert second.copied == 3 * 3 + 2 and second.deleted == 2 and second.listed == 0
    assert m.once().copied == 0
    # a restarted processor reads its ledger: still no listing
    again = Mirror(store, bucket, max_bytes=3 * TRACE_BYTES, max_age_s=None, host="host-a")
    assert again.once().copied == 0 and bucket.calls["list"] == listed
    # the bucket has the store (less the evidence retention removed), and never the ledger
    keys = {o.key for o in bucket.inner.list()}
    assert not any(k.startswith(MIRROR_STATE_DIR) for k in keys)
    local = _local_keys(store)
    assert {k for k in local if not k.endswith(".pftrace")} <= keys
    assert _remote_traces(bucket.inner, "host-a") == _names(range(3, 6), "host-a")
    # nor does a pull bring one back into a copy
    (tmp_path / "bucket" / MIRROR_STATE_DIR).mkdir()
    (tmp_path / "bucket" / MIRROR_STATE_DIR / "x.jsonl").write_text("{}\n")
    pull(bucket.inner, tmp_path / "copy")
    assert not (tmp_path / "copy" / MIRROR_STATE_DIR).exists()


def _local_keys(store: Path) -> set[str]:
    return {p.relative_to(store).as_posix() for p in store.rglob("*")
            if p.is_file() and not any(s.startswith(".") for s in p.relative_to(store).parts)}


@pytest.mark.parametrize("damage", ["deleted", "garbage", "foreign remote"])
def test_a_lost_ledger_is_rebuilt_from_one_listing_without_uploading_again(tmp_path, damage):
    bucket = Counting(LocalObjectStore(tmp_path / "bucket"))
    store = _host_store(tmp_path / "s", "host-a", traces=4)
    attempt_path = store / "runs" / RUN.run_id / "0"
    m = Mirror(store, bucket, max_bytes=3 * TRACE_BYTES, max_age_s=None, host="host-a")
    m.once()
    before = json.loads(json.dumps({k: (e.size, e.mtime) for k, e in m.ledger.entries.items() if not e.gone}))
    # local retention removes host-a's oldest remaining trace; its remote copy stays
    oldest_left = attempt_path / "evidence" / "host-a" / _names([1], "host-a")[0]
    oldest_left.unlink()
    if damage == "deleted":
        m.ledger.path.unlink()
    elif damage == "garbage":
        m.ledger.path.write_bytes(b"\x00not a ledger\n")
    else:
        m.ledger.path.write_text(json.dumps({"format": "argus-mirror-ledger", "version": 1,
                                             "remote": "s3://elsewhere"}) + "\n")
    puts, lists = bucket.calls["put"], bucket.calls["list"]
    restarted = Mirror(store, bucket, max_bytes=3 * TRACE_BYTES, max_age_s=None, host="host-a")
    s = restarted.once()
    assert s.listed > 0 and bucket.calls["list"] == lists + s.listed
    assert bucket.calls["put"] == puts  # nothing that is already there is sent again
    rebuilt = {k: (e.size, e.mtime) for k, e in restarted.ledger.entries.items() if not e.gone}
    assert rebuilt.keys() == before.keys()  # the remote-only trace included: it still counts against the budget
    assert all(rebuilt[k] == tuple(before[k]) for k in rebuilt if not k.endswith(_names([1], "host-a")[0]))
    assert _remote_traces(bucket.inner, "host-a") == _names(range(1, 4), "host-a")  # trace 0 did not go up again
    # the next trace pushes host-a past its budget; one copy goes, counted with the one gone locally
    _traces(attempt_path, "host-a", [4])
    s = restarted.once()
    assert s.listed == 0 and s.copied == 1 and s.deleted == 1
    left = _remote_traces(bucket.inner, "host-a")
    assert len(left) == 3 and _names([4], "host-a")[0] in left


def test_a_torn_last_ledger_line_is_skipped_not_a_reason_to_list(tmp_path):
    bucket = Counting(LocalObjectStore(tmp_path / "bucket"))
    store = _host_store(tmp_path / "s", "host-a", traces=2)
    Mirror(store, bucket, host="host-a").once()
    m = Mirror(store, bucket, host="host-a")
    with open(m.ledger.path, "ab") as fh:
        fh.write(b'{"k":"runs/run-a/0/steps/host-a/000000009-u')  # a crash mid-append
    lists = bucket.calls["list"]
    assert m.once().copied == 0 and bucket.calls["list"] == lists
    assert m.ledger.path.read_bytes().endswith(b"\n")  # compacted: the next append starts a line of its own
    assert Mirror(store, bucket, host="host-a").ledger.load()


def test_an_interrupted_push_is_finished_by_the_next_with_data_before_commits_before_metadata(tmp_path):
    store = _host_store(tmp_path / "s", "host-a", windows=3, traces=2)
    files = _local_keys(store)
    records = {k: json.loads((store / k).read_text()) for k in files if "/commits/" in k}
    for fail_at in range(1, len(files) + 1):
        bucket = Counting(LocalObjectStore(tmp_path / f"bucket-{fail_at}"), fail_put_at=fail_at)
        m = Mirror(store, bucket, max_bytes=None, max_age_s=None, host="host-a")
        first = m.once()
        assert first.errors and first.copied == fail_at - 1  # stopped at the failed PUT, logged, not raised
        assert set(m.ledger.entries) == set(bucket.put_order)  # only what was PUT is recorded
        assert m.once().copied == len(files) - (fail_at - 1)
        assert sorted(bucket.put_order) == sorted(files)  # each file exactly once over both pushes
        at = {k: i for i, k in enumerate(bucket.put_order)}
        for key, rec in records.items():
            attempt, _, rest = key.rpartition("/commits/")
            writer, stem = rest.split("/")[0], rest.rsplit("/", 1)[-1][:-5]
            assert all(at[f"{attempt}/{t}/{writer}/{stem}.parquet"] < at[key] for t in rec["tables"]), key
        meta = [at[k] for k in files if k.endswith(("attempt.json", "argus-store.json"))]
        rest = [at[k] for k in files if not k.endswith(("attempt.json", "argus-store.json"))]
        assert min(meta) > max(rest)


def test_a_commit_record_brings_data_files_the_walk_missed(tmp_path, monkeypatch):
    """A table directory created after the walk listed its attempt: the commit record the walk
    then saw names the data file, which is pushed before it."""
    import argus.objstore.sync as sync

    store = _host_store(tmp_path / "s", "host-a", windows=1)
    real = sync.local_files
    monkeypatch.setattr(sync, "local_files", lambda root, prefix="": [o for o in real(root, prefix)
                                                                      if "/hw/" not in o.key])
    bucket = Counting(LocalObjectStore(tmp_path / "bucket"))
    push(store, bucket)
    hw = [i for i, k in enumerate(bucket.put_order) if "/hw/" in k]
    commit = [i for i, k in enumerate(bucket.put_order) if "/commits/" in k]
    assert hw and commit and max(hw) < min(commit)


def test_a_mirror_leaves_a_directory_that_is_not_a_store_yet_untouched(tmp_path):
    bucket = LocalObjectStore(tmp_path / "bucket")
    m = Mirror(tmp_path / "new", bucket, host="h")
    m.once()  # before the processor created its store: nothing to push, no ledger written
    (tmp_path / "empty").mkdir()
    Mirror(tmp_path / "empty", bucket).once()
    assert not (tmp_path / "new").exists() and not any((tmp_path / "empty").iterdir())
    Store.create(tmp_path / "empty")  # still accepted as a new store's directory


def test_one_shot_retention_gives_each_host_of_the_store_its_own_budget(tmp_path):
    """``argus sync DIR BUCKET``: a store holding two hosts' evidence, a bucket also holding a
    third host's from another store; each of the store's hosts keeps its budget, the third is
    not looked at."""
    bucket = Counting(LocalObjectStore(tmp_path / "bucket"))
    store = _host_store(tmp_path / "s", "host-a", traces=4)
    attempt_path = store / "runs" / RUN.run_id / "0"
    _traces(attempt_path, "host-b", range(4))
    other = _host_store(tmp_path / "o", "host-c", traces=4)
    push(other, bucket)
    s = push(store, bucket)
    assert s.copied and all(not r for _, r in bucket.list_args)
    gone = enforce_remote_retention(bucket, max_bytes=2 * TRACE_BYTES, max_age_s=None,
                                    prefixes=evidence_prefixes(store))
    assert len(gone) == 4
    assert _remote_traces(bucket.inner, "host-a") == _names(range(2, 4), "host-a")
    assert _remote_traces(bucket.inner, "host-b") == _names(range(2, 4), "host-b")
    assert _remote_traces(bucket.inner, "host-c") == _names(range(4), "host-c")
    assert not any("host-c" in p for p, _ in bucket.list_args[-2:])
    # the same through a mirror without a host (``argus sync --watch``): every host of the store
    _traces(attempt_path, "host-b", [4])
    m = Mirror(store, bucket, max_bytes=2 * TRACE_BYTES, max_age_s=None)
    m.once()
    assert _remote_traces(bucket.inner, "host-b") == _names(range(3, 5), "host-b")
    assert _remote_traces(bucket.inner, "host-a") == _names(range(2, 4), "host-a")
    assert _remote_traces(bucket.inner, "host-c") == _names(range(4), "host-c")


def test_a_read_only_store_is_mirrored_with_the_ledger_elsewhere(tmp_path):
    """The Kubernetes sidecar mounts the store read-only (deploy/k8s): with ``state_dir`` the
    ledger lives there, the mirror writes nothing into the store, and each cycle pushes only what
    is new (the ledger remembered the first)."""
    bucket = Counting(LocalObjectStore(tmp_path / "bucket"))
    store = _host_store(tmp_path / "s", "host-a", traces=2)
    attempt_path = store / "runs" / RUN.run_id / "0"
    tree = lambda: sorted(str(p.relative_to(store)) for p in store.rglob("*"))  # noqa: E731
    before = tree()
    m = Mirror(store, bucket, max_bytes=None, max_age_s=None, host="host-a", state_dir=tmp_path / "state")
    assert m.once().copied > 0 and not m.last.errors
    assert m.ledger.path.parent == tmp_path / "state" and m.ledger.path.exists()
    assert tree() == before  # nothing written into the store
    _windows(attempt_path, "host-a", range(3, 5))
    listed = bucket.calls["list"]
    again = Mirror(store, bucket, max_bytes=None, max_age_s=None, host="host-a", state_dir=tmp_path / "state")
    assert again.once().copied == 2 * 3 and bucket.calls["list"] == listed  # the ledger, not a listing
    assert not (store / MIRROR_STATE_DIR).exists()
