"""Object storage against a real S3-compatible server on 127.0.0.1 (moto's standalone
server): evidence and Parquet partitions written, listed, read back, kept within budget."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from argus.objstore import (MIRROR_STATE_DIR, LocalObjectStore, Mirror, ObjectStoreError, enforce_remote_retention,
                            open_objstore, pull, push)
from argus.objstore.sync import local_files
from argus.sim import SimConfig, simulate_to_store
from argus.store.files import TMP_PREFIX
from tests.shortdir import short_dir

pytest.importorskip("boto3")
MOTO = shutil.which("moto_server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    if MOTO is None:
        pytest.skip("moto_server is not installed (the test extra installs moto[server])")
    port = _free_port()
    proc = subprocess.Popen([MOTO, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    env = {"AWS_ACCESS_KEY_ID": "argus", "AWS_SECRET_ACCESS_KEY": "argus", "AWS_DEFAULT_REGION": "us-east-1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield url
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.terminate()
    proc.wait(10)


def _bucket(s3: str, name: str):
    return open_objstore(f"s3://{name}/jobs/a?endpoint={s3}", create_bucket=True)


def _evidence(store: Path, n: int) -> list[Path]:
    from argus.evidence import write_perfetto_trace
    from argus.store import Store

    attempt = Store.open(store).attempt()
    phases = attempt.read("phases", steps=(5, 6))
    out = []
    for i in range(n):
        p = attempt.path / "evidence" / "node-0000" / f"{i:09d}-test.pftrace"
        p.parent.mkdir(parents=True, exist_ok=True)
        write_perfetto_trace(p, phases=phases.slice(0, 2000), kernels=None, hosts={}, title=f"w{i}")
        os.utime(p, (time.time() - 3600 * (n - i), time.time() - 3600 * (n - i)))  # older first
        out.append(p)
    return out


def test_objects_are_written_listed_read_and_deleted(s3):
    b = _bucket(s3, "basic")
    b.put("runs/r/0/evidence/h/1.pftrace", b"trace")
    b.put("x/y.bin", b"12345")
    assert [(o.key, o.size) for o in b.list()] == [("runs/r/0/evidence/h/1.pftrace", 5), ("x/y.bin", 5)]
    assert [o.key for o in b.list("x")] == ["x/y.bin"]
    assert b.get("x/y.bin") == b"12345"
    assert b.delete("x/y.bin") and [o.key for o in b.list("x")] == []
    with pytest.raises(ObjectStoreError):
        b.get("x/y.bin")
    with pytest.raises(Exception, match="leaves the store"):
        b.put("../escape", b"no")


def test_a_store_pushed_and_pulled_diagnoses_the_same(s3, tmp_path):
    store = tmp_path / "s"
    simulate_to_store(SimConfig(ranks=16, steps=12, seed=3), "compute_straggler", store)
    traces = _evidence(store, 3)
    (store / "runs" / f"{TMP_PREFIX}half.parquet").write_bytes(b"half")  # a writer's temp file: never shipped
    b = _bucket(s3, "stores")
    s = push(store, b)
    assert s.copied > 10 and not s.errors
    keys = [o.key for o in b.list()]
    assert not any(TMP_PREFIX in k for k in keys)
    assert any(k.endswith(traces[0].name) for k in keys)
    assert push(store, b).copied == 0  # append-only: nothing to do the second time
    local = tmp_path / "pulled"
    pull(b, local)
    assert (local / traces[1].relative_to(store)).read_bytes() == traces[1].read_bytes()
    ours = _diagnose(str(store))
    env = {**os.environ, "ARGUS_CACHE_DIR": str(tmp_path / "cache")}
    remote = _diagnose(f"s3://stores/jobs/a?endpoint={s3}", env)
    assert [(i["class"], i["culprit_ranks"]) for i in remote] == [(i["class"], i["culprit_ranks"]) for i in ours]
    assert ours and ours[0]["class"] == "compute_straggler"


def _diagnose(target: str, env: dict | None = None) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "argus", "diagnose", target, "--json", "--no-store"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)["incidents"]


def test_evidence_retention_in_the_bucket(s3, tmp_path):
    store = tmp_path / "s"
    simulate_to_store(SimConfig(ranks=8, steps=8, seed=4), "healthy", store, baseline=False)
    traces = _evidence(store, 4)
    b = _bucket(s3, "retention")
    push(store, b)
    size = traces[0].stat().st_size
    # objects carry the upload time: age by a clock an hour ahead, size by a budget of two traces
    assert enforce_remote_retention(b, max_bytes=None, max_age_s=7200, now=time.time()) == []
    gone = enforce_remote_retention(b, max_bytes=int(2.5 * size), max_age_s=None)
    assert len(gone) == 2 and all(k.endswith(".pftrace") for k in gone)
    left = [o.key for o in b.list() if o.key.endswith(".pftrace")]
    assert len(left) == 2
    parquet = [o for o in b.list() if o.key.endswith(".parquet")]
    assert parquet  # tables are never touched by retention
    assert len(enforce_remote_retention(b, max_bytes=None, max_age_s=-1)) == 2  # everything is "too old"


def test_mirror_keeps_pushing_and_survives_an_unreachable_bucket(s3, tmp_path):
    store = tmp_path / "s"
    simulate_to_store(SimConfig(ranks=8, steps=8, seed=5), "healthy", store, baseline=False)
    dead = open_objstore(f"s3://nowhere/p?endpoint=http://127.0.0.1:{_free_port()}")
    m = Mirror(store, dead, interval_s=0.1)
    m.once()  # logged, counted, no exception
    assert m.stats.errors and m.stats.copied == 0
    b = _bucket(s3, "mirror")
    m = Mirror(store, b, interval_s=0.1).start()
    extra = store / "runs" / "late.bin"
    time.sleep(0.3)
    extra.write_bytes(np.arange(10).tobytes())  # a file that appears while the mirror runs
    m.stop()
    assert "runs/late.bin" in [o.key for o in b.list()]


def test_local_paths_work_through_the_same_interface(tmp_path):
    b = open_objstore(f"file://{tmp_path}/o")
    assert isinstance(b, LocalObjectStore)
    b.put("a/b.pftrace", b"x")
    assert [o.key for o in b.list()] == ["a/b.pftrace"] and b.get("a/b.pftrace") == b"x"
    with pytest.raises(Exception, match="unsupported"):
        open_objstore("gs://bucket/x")


def test_serve_follows_a_store_in_the_bucket(s3, tmp_path):
    """``argus serve s3://…`` serves a local copy and keeps pulling what the bucket gains."""
    from argus.cli.serve import _local_store

    store = tmp_path / "s"
    simulate_to_store(SimConfig(ranks=8, steps=8, seed=6), "healthy", store, baseline=False)
    b = _bucket(s3, "serve")
    push(store, b)
    os.environ["ARGUS_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        local, stop = _local_store(f"s3://serve/jobs/a?endpoint={s3}", every_s=0.2)
        assert (Path(local) / "argus-store.json").exists()
        b.put("runs/extra/later.bin", b"new window")
        for _ in range(50):
            if (Path(local) / "runs/extra/later.bin").exists():
                break
            time.sleep(0.1)
        stop.set()
        assert (Path(local) / "runs/extra/later.bin").read_bytes() == b"new window"
    finally:
        os.environ.pop("ARGUS_CACHE_DIR", None)


def test_processor_mirrors_its_store_and_evidence_to_the_bucket(s3, tmp_path):
    """A real processor with ``--mirror s3://…``: what it wrote (tables, Perfetto evidence) is
    in the bucket once it exits."""
    import signal as _signal

    from argus.sim.run import prepare
    from tests.tsdb.feed import Feeder

    config = SimConfig(ranks=8, steps=10, run_id="mirrored", seed=7)
    _, ctx, _, _ = prepare(config, "healthy")
    sock = short_dir("argus-mir-") / "p.sock"
    env = {**os.environ}
    proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(tmp_path / "P"), "--socket",
                             str(sock), "--host", "proc-0", "--no-fsync", "--no-stacks", "--no-host-counters", "--evidence-interval", "0",
                             "--mirror", f"s3://mirrored/p?endpoint={s3}", "--mirror-interval", "0.5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    for _ in range(300):
        if sock.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    feeder = Feeder(sock, "mirrored", ctx.layout, ctx.topology)
    simulate_to_store(config, "healthy", tmp_path / "S", on_step=feeder.step, baseline=False)
    feeder.close()
    proc.send_signal(_signal.SIGTERM)
    assert proc.wait(60) == 0, proc.stderr.read()[-2000:]
    keys = {o.key for o in open_objstore(f"s3://mirrored/p?endpoint={s3}").list()}
    local = {o.key for o in local_files(tmp_path / "P")}
    assert local and local <= keys
    assert (tmp_path / "P" / MIRROR_STATE_DIR).is_dir() and not any(k.startswith(".") for k in keys)
    assert any(k.endswith(".pftrace") for k in keys) and any("/steps/" in k for k in keys)


def test_hosts_mirroring_into_one_bucket_keep_their_own_evidence_and_list_it_once(s3, tmp_path):
    """Two hosts' stores, one real S3 bucket: each mirror lists only its own directories
    (delimited listings) before its first push and nothing after; each host keeps its own
    evidence budget; a one-shot ``argus sync`` of a third host's store leaves theirs alone."""
    from argus.cli.main import main
    from tests.objstore.test_mirror import TRACE_BYTES, Counting, _host_store, _names, _traces

    bucket = _bucket(s3, "shared")
    mirrors = {}
    for host in ("host-a", "host-b"):
        store = _host_store(tmp_path / host, host, traces=5)
        mirrors[host] = Mirror(store, Counting(bucket), max_bytes=3 * TRACE_BYTES, max_age_s=None, host=host)
        first = mirrors[host].once()
        assert first.copied and not first.errors and first.listed == mirrors[host].remote.calls["list"]
    for host, m in mirrors.items():
        _traces(tmp_path / host / "runs" / "run-a" / "0", host, [5])
        cycle = m.once()
        assert cycle.copied == 1 and cycle.deleted == 1 and cycle.listed == 0

    def traces(host: str) -> list[str]:
        return sorted(o.key.rsplit("/", 1)[-1] for o in bucket.list(f"runs/run-a/0/evidence/{host}"))

    for host in mirrors:
        assert traces(host) == _names(range(3, 6), host)
    _host_store(tmp_path / "host-c", "host-c", traces=4)
    assert main(["sync", str(tmp_path / "host-c"), f"s3://shared/jobs/a?endpoint={s3}",
                 "--evidence-max-mb", str(2 * TRACE_BYTES / (1 << 20)), "--evidence-max-age-h", "0"]) == 0
    assert traces("host-c") == _names(range(2, 4), "host-c")
    for host in mirrors:
        assert traces(host) == _names(range(3, 6), host)
