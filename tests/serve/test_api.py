"""The JSON API on a real server: runs, a diagnosed attempt's incidents, errors."""

from urllib.parse import quote

from tests.report.helpers import sim, store_root


def test_api_lists_runs_and_returns_the_diagnosed_incidents(simulated, serve):
    attempt, truth = sim(simulated, "compute_straggler")
    run, att = attempt.identity.run_id, attempt.identity.attempt_id
    with serve(store_root(attempt)) as c:
        runs = c.json("/api/runs")["runs"]
        assert [(r["run_id"], r["attempt_id"], r["ranks"]) for r in runs] == [(run, att, 64)]
        doc = c.json(f"/api/run/{quote(run)}/{att}/incidents?wait=60")
        assert doc["diagnosis"]["state"] == "ready" and doc["diagnosis"]["fresh"]
        culprits = set(truth["faults"][0]["culprit_ranks"])
        top = doc["incidents"][0]
        assert top["class"] == "compute_straggler" and set(top["culprit_ranks"]) == culprits
        assert top["source"] == "diagnosis" and top["url"].endswith(top["id"])
        one = c.json(f"/api/run/{run}/{att}/incident/{top['id']}")["incident"]
        assert one["id"] == top["id"] and one["evidence"] and one["evidence_files"] == []
        summary = c.json(f"/api/run/{run}/{att}")
        assert summary["steps"] == [0, 19] and len(summary["step_time"]["job_s"]) == 20
        assert any(w["kind"] == "regression" for w in summary["l1"])
        assert c.json(f"/api/run/{run}/{att}/status")["version"] == summary["version"]


def test_pages_render_with_culprits_and_unknown_things_are_404(simulated, serve):
    attempt, truth = sim(simulated, "jit_stall")
    run, att = attempt.identity.run_id, attempt.identity.attempt_id
    with serve(store_root(attempt)) as c:
        inc = c.json(f"/api/run/{run}/{att}/incidents?wait=60")["incidents"][0]
        code, headers, body = c.get(f"/run/{run}/{att}/incident/{inc['id']}")
        page = body.decode()
        assert code == 200 and "text/html" in headers["content-type"]
        assert "script-src 'nonce-" in headers["content-security-policy"]
        assert 'class="culprits"' in page and str(truth["faults"][0]["culprit_ranks"][0]) in page
        assert '<svg class="plot phase-heatmap"' in page
        code, _, body = c.get(f"/run/{run}/{att}")
        assert code == 200 and 'class="incident-row"' in body.decode()
        assert c.get("/")[0] == 200 and c.get("/run/nope/0")[0] == 404
        assert c.json("/api/run/nope/0/incidents", status=404)["error"].startswith("no run 'nope'")
        assert c.get(f"/run/{run}/{att}/incident/inc-nope")[0] == 404
        assert c.get("/api/nothing")[0] == 404
