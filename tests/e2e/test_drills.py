"""``argus drill`` on the bundled gloo job: each drill injects its real fault and its table says
what happened — the right class and culprit, the alert delivered to a real webhook — and a drill
whose stage did not react fails."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

import pytest

pytest.importorskip("torch")

from tests.e2e.jobs import env


class _Hook:
    def __init__(self) -> None:
        self.posts: list[dict] = []
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                hook.posts.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/argus"


def _drill(tmp_path, kind: str, *extra: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "argus", "drill", kind, "--store", str(tmp_path / "s"), "--steps", "40",
                           "--json", *extra], capture_output=True, text=True, timeout=400, env=env())
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def test_a_killed_rank_is_named_from_its_own_exit_and_paged(tmp_path):
    hook = _Hook()
    try:
        code, res = _drill(tmp_path, "kill-rank", "--rank", "2", "--webhook", hook.url)
    finally:
        hook.server.shutdown()
    stages = {s["name"]: s for s in res["stages"]}
    assert code == 0 and res["passed"], json.dumps(res["stages"], default=str)[:3000]
    assert "fail_stop" in stages["incident"]["detail"] and "culprits [2]" in stages["incident"]["detail"]
    assert stages["alert"]["result"] == "pass" and hook.posts
    assert any("P0" in json.dumps(p) for p in hook.posts)


@pytest.mark.parametrize("kind", ["stall-rank", "hang"])
def test_a_frozen_rank_is_named_by_its_process_state_not_called_the_network(tmp_path, kind):
    """Stopped inside its all-reduce, the rank matches its peers in every count and timing: the
    processor's live snapshot reads its process state (T) and names it — a 15 s freeze that
    resumes as a host stall, one that does not as the hang's culprit. (The drill's own 10 s
    threshold: at 6 s one run in 13 failed here, the cause not kept.)"""
    code, res = _drill(tmp_path, kind)
    stages = {s["name"]: s for s in res["stages"]}
    assert code == 0 and res["passed"], json.dumps(res["stages"], default=str)[:3000]  # the stages, not truncated
    expected = "host_stall" if kind == "stall-rank" else "hang"
    assert stages["incident"]["detail"].startswith(expected) and "culprits [1]" in stages["incident"]["detail"]
    assert stages["alert"]["result"] == "skipped"


def _netns_why() -> str | None:
    from argus.workloads.netns import available

    return available()


@pytest.mark.skipif(_netns_why() is not None, reason=str(_netns_why()))
def test_a_link_throttled_mid_job_is_named_on_its_host(tmp_path):
    """Six namespace hosts, each its own argus run into one store; host 4's link slowed to
    20 Mbit/s once the job trains: the drill's table names a link on host 4's rank alone."""
    code, res = _drill(tmp_path, "link", "--rank", "4", "--steps", "24", "--after-steps", "6")
    stages = {s["name"]: s for s in res["stages"]}
    assert code == 0 and res["passed"], json.dumps(res["stages"], default=str)[:3000]
    assert stages["incident"]["detail"].startswith("link_degradation") and "culprits [4]" in stages["incident"]["detail"]
    assert stages["job ended"]["result"] == "pass"
