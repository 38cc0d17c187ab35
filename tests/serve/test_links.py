"""A symbolic link inside the store — a run or attempt directory planted by another user,
or left by a copy — is never followed: what it points to is neither listed nor served."""

from __future__ import annotations

import os

import pytest

from argus.serve import safe_evidence_path
from argus.serve.state import reached_without_links
from tests.report.helpers import copy_store, sim, store_root, write_evidence


@pytest.fixture
def linked(simulated, tmp_path):
    """Store S (healthy) with ``runs/<run>`` a link to another store's run that has evidence."""
    inside = copy_store(sim(simulated, "healthy")[0], tmp_path / "S")
    outside = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "elsewhere")
    trace = write_evidence(outside, "node-0004", window=1)
    run = outside.identity.run_id
    os.symlink(outside.path.parent, store_root(inside) / "runs" / run)
    return inside, outside, trace


def test_a_linked_run_directory_is_not_listed_or_served(linked, serve):
    inside, outside, trace = linked
    run, att = outside.identity.run_id, outside.identity.attempt_id
    with serve(store_root(inside)) as c:
        runs = c.json("/api/runs")["runs"]
        assert [r["run_id"] for r in runs] == [inside.identity.run_id]
        assert c.get(f"/evidence/{run}/{att}/node-0004/{trace.name}")[0] == 404
        assert c.get(f"/api/run/{run}/{att}")[0] == 404
        assert c.get(f"/run/{run}/{att}")[0] == 404
        here = f"/run/{inside.identity.run_id}/{inside.identity.attempt_id}"
        assert c.get(f"{here}?wait=60")[0] == 200  # waits for the diagnosis: no thread left running at exit


def test_a_linked_attempt_directory_is_refused_for_evidence_even_when_asked_directly(linked, tmp_path):
    inside, outside, trace = linked
    linked_attempt = store_root(inside) / "runs" / outside.identity.run_id / outside.identity.attempt_id
    assert (linked_attempt / "evidence" / "node-0004" / trace.name).is_file()  # the link does lead there
    assert safe_evidence_path(linked_attempt, "node-0004", trace.name) is not None  # without the store: no view
    assert safe_evidence_path(linked_attempt, "node-0004", trace.name, store_root=store_root(inside)) is None
    assert safe_evidence_path(outside.path, "node-0004", trace.name, store_root=store_root(inside)) is None


def test_reached_without_links_checks_every_step_down(tmp_path):
    (tmp_path / "root" / "a" / "b").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    os.symlink(tmp_path / "other", tmp_path / "root" / "a" / "l")
    os.symlink(tmp_path / "root" / "a" / "b", tmp_path / "root" / "inner-link")
    root = tmp_path / "root"
    assert reached_without_links(root, root / "a" / "b")
    assert not reached_without_links(root, root / "a" / "l")
    assert not reached_without_links(root, root / "inner-link")  # even a link that stays inside
    assert not reached_without_links(root, root / "a" / ".." / ".." / "other")
    assert not reached_without_links(root, tmp_path / "other")
    assert not reached_without_links(root, root / "missing")


def test_an_evidence_host_name_cannot_write_a_header(simulated, serve, tmp_path):
    from urllib.parse import quote

    attempt = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "S")
    trace = write_evidence(attempt, "node-0004", window=1)
    run, att = attempt.identity.run_id, attempt.identity.attempt_id
    injected, odd = "h\r\nSet-Cookie: argus_session=x", 'nöde "1"; x=y'
    for host in (injected, odd):
        (attempt.path / "evidence" / host).mkdir()
        (attempt.path / "evidence" / host / trace.name).write_bytes(trace.read_bytes())
    with serve(store_root(attempt)) as c:
        code, headers, _ = c.get(f"/evidence/{run}/{att}/{quote(injected)}/{trace.name}")
        assert code == 404 and "set-cookie" not in headers
        code, headers, body = c.get(f"/evidence/{run}/{att}/{quote(odd)}/{trace.name}")
        assert code == 200 and body == trace.read_bytes()
        assert headers["content-disposition"] == f'attachment; filename="n_de__1___x_y-{trace.name}"'
