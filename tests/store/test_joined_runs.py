"""One job written as two runs (its hosts' ``argus run`` started a second apart, before the
ranks agreed on a run id) is read as one, and its throttled host found — the repro store
``netns-throttled-link`` rebuilt from data of our own making: pp=2 × dp=2 on four hosts, one
host's link slow, no hardware signal, each half a run of its own."""

from __future__ import annotations

import time

import pyarrow.compute as pc

from argus.analysis import DiagnoseConfig, diagnose
from argus.sim import SimConfig, simulate_to_store
from argus.store import TABLES, JoinedAttempt, Store
from argus.topology import RunIdentity, parse_layout


def _split(src, dst, halves: dict[str, list[int]], drop=("hw", "incidents")) -> Store:
    """``src``'s attempt written again as one run per entry of ``halves`` (its ranks), each host
    its own writer, created a second apart: what the repro's four ``argus run`` left."""
    attempt = Store.open(src).attempt()
    store = Store.create(dst)
    for run_id, ranks in halves.items():
        out = store.create_attempt(RunIdentity(run_id), attempt.layout, source="processor")
        for table in TABLES:
            if table in drop or not attempt.files(table):
                continue
            t = attempt.read(table)
            t = t.filter(pc.is_in(t.column("rank"), value_set=pc.cast(ranks, t.schema.field("rank").type)))
            for host in sorted(set(attempt.topology().hosts[ranks].tolist())):
                mine = [r for r in ranks if attempt.topology().hosts[r] == host]
                part = t.filter(pc.is_in(t.column("rank"), value_set=pc.cast(mine, t.schema.field("rank").type)))
                out.writer(host).write(table, part, window=0)
        time.sleep(0.01)
    return store


def test_two_halves_of_one_job_are_read_as_one_and_the_slow_host_is_named(tmp_path):
    res = simulate_to_store(SimConfig(ranks=4, steps=20, seed=3, layout=parse_layout("pp=2,dp=2", world_size=4),
                                      gpus_per_host=1), "link_degradation", tmp_path / "sim",
                            params={"hosts": "1", "factor": "6"})
    truth = res.truth["faults"][0]
    store = _split(tmp_path / "sim", tmp_path / "split",
                   {"run-20261202-080127": [0, 2], "run-20261202-080128": [1, 3]})
    assert len(store.attempts()) == 2
    attempt = store.attempt()
    assert isinstance(attempt, JoinedAttempt)
    assert attempt.meta["joined_runs"] == ["run-20261202-080127", "run-20261202-080128"]
    d = diagnose(attempt, DiagnoseConfig(store_incidents=False))
    assert d.coverage is not None and d.coverage.complete
    claims = [i for i in d.incidents if i.severity != "info"]
    assert [(i.klass, i.culprit_ranks, i.hosts) for i in claims] == [
        ("link_degradation", truth["culprit_ranks"], truth["culprit_hosts"])]


def test_runs_of_other_jobs_or_of_the_same_ranks_are_never_joined(tmp_path):
    res = simulate_to_store(SimConfig(ranks=4, steps=6, seed=3, layout=parse_layout("pp=2,dp=2", world_size=4),
                                      gpus_per_host=1), "healthy", tmp_path / "sim")
    assert res is not None
    # the same ranks twice (two jobs of one shape back to back): two runs, the latest is read
    store = _split(tmp_path / "sim", tmp_path / "twice", {"job-a": [0, 1, 2, 3], "job-b": [0, 1, 2, 3]})
    latest = store.attempt()
    assert not isinstance(latest, JoinedAttempt) and latest.identity.run_id == "job-b"
    # asked for by name, a half is that half
    halves = _split(tmp_path / "sim", tmp_path / "halves", {"a": [0, 2], "b": [1, 3]})
    assert not isinstance(halves.attempt("a"), JoinedAttempt)
