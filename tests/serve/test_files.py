"""Evidence downloads: the file asked for, and nothing else — traversal, encodings,
absolute paths and symbolic links all end in 404."""

import os

import pytest

from argus.serve import safe_evidence_path
from tests.report.helpers import copy_store, sim, store_root, write_evidence


@pytest.fixture
def store_with_evidence(simulated, tmp_path):
    attempt = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "S")
    trace = write_evidence(attempt, "node-0004", window=1)
    secret = tmp_path / "secret.pftrace"
    secret.write_bytes(b"outside the store")
    ev = attempt.path / "evidence"
    os.symlink(secret, ev / "node-0004" / "000000002-deadbeef.pftrace")  # a link to a file outside
    os.symlink(tmp_path, ev / "node-9999")  # a host directory that is a link
    return attempt, trace


def test_the_evidence_file_downloads(store_with_evidence, serve):
    attempt, trace = store_with_evidence
    run, att = attempt.identity.run_id, attempt.identity.attempt_id
    with serve(store_root(attempt)) as c:
        code, headers, body = c.get(f"/evidence/{run}/{att}/node-0004/{trace.name}")
        assert code == 200 and body == trace.read_bytes()
        assert headers["content-type"] == "application/octet-stream" and "attachment" in headers["content-disposition"]
        listed = c.json(f"/api/run/{run}/{att}/evidence")["files"]
        assert [f["name"] for f in listed] == [trace.name]  # links are not listed
        inc = c.json(f"/api/run/{run}/{att}/incidents?wait=60")["incidents"][0]
        files = c.json(f"/api/run/{run}/{att}/incident/{inc['id']}")["incident"]["evidence_files"]
        assert [(f["host"], f["steps"]) for f in files] == [("node-0004", [5, 9])]
        assert c.get(files[0]["url"])[2] == trace.read_bytes()
        page = c.get(inc["url"])[2].decode()
        assert f'class="evidence-file" href="{files[0]["url"]}"' in page and "ui.perfetto.dev" in page


@pytest.mark.parametrize("path", [
    "/evidence/{run}/{att}/../../etc/passwd",
    "/evidence/{run}/{att}/node-0004/../../../attempt.json",
    "/evidence/{run}/{att}/%2e%2e/%2e%2e/etc/passwd",
    "/evidence/{run}/{att}/node-0004/%2e%2e%2f%2e%2e%2fattempt.json",
    "/evidence/{run}/{att}/..%2F..%2F/attempt.json",
    "/evidence/{run}/{att}/%2Fetc/passwd",
    "/evidence/{run}/{att}/node-0004/%2Fetc%2Fpasswd",
    "/evidence/{run}/{att}/node-0004/..%5C..%5Cattempt.json",
    "/evidence/{run}/{att}/node-0004/000000002-deadbeef.pftrace",  # symlink to a file outside
    "/evidence/{run}/{att}/node-9999/{name}",  # host directory is a symlink
    "/evidence/{run}/{att}/node-0004/%00.pftrace",
    "/evidence/{run}/{att}/node-0004/%ff%fe.pftrace",
    "/evidence/..%2F..%2F/{att}/node-0004/{name}",
    "/evidence/{run}/{att}/node-0004",
    "//etc/passwd",
    "/../../etc/passwd",
])
def test_traversal_and_links_are_refused(store_with_evidence, serve, path, tmp_path):
    attempt, trace = store_with_evidence
    (tmp_path / trace.name).write_bytes(b"via a linked host dir")
    url = path.format(run=attempt.identity.run_id, att=attempt.identity.attempt_id, name=trace.name)
    with serve(store_root(attempt)) as c:
        code, _, body = c.get(url)
    assert code == 404, (url, code)
    assert b"root:" not in body and b"outside the store" not in body and b"via a linked" not in body


def test_safe_evidence_path_accepts_only_plain_files_inside(store_with_evidence):
    attempt, trace = store_with_evidence
    assert safe_evidence_path(attempt.path, "node-0004", trace.name) == trace.resolve()
    for host, name in [("node-0004", "000000002-deadbeef.pftrace"), ("node-9999", trace.name), ("..", "attempt.json"),
                       ("node-0004", "../x"), ("/etc", "passwd"), ("node-0004", "missing.pftrace"), ("", "x")]:
        assert safe_evidence_path(attempt.path, host, name) is None, (host, name)
