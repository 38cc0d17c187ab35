"""New data and new incidents show up without restarting the server."""

import shutil

from argus.store import conform
from tests.report.helpers import copy_store, sim, store_root


def _incident(id_: str) -> dict:
    return {"id": [id_], "class": ["host_stall"], "state": ["suspected"], "severity": ["warning"],
            "culprit_ranks": [[5]], "hosts": [["node-0000"]], "gpus": [["GPU-5"]], "start_step": [3],
            "end_step": [4], "phase": ["dataloader"], "kernels": [[]], "slowdown_pct": [3.0],
            "gpu_hours_lost": [0.01], "action": ["observe"], "evidence": ["[]"], "detected_ns": [1]}


def test_new_incidents_and_new_windows_appear_without_a_restart(simulated, serve, tmp_path):
    attempt = copy_store(sim(simulated, "healthy")[0], tmp_path / "S")
    run, att = attempt.identity.run_id, attempt.identity.attempt_id
    api = f"/api/run/{run}/{att}"
    with serve(store_root(attempt)) as c:
        first = c.json(f"{api}/incidents?wait=60")
        assert first["diagnosis"]["state"] == "ready" and first["incidents"] == []
        # another diagnoser writes an incident: shown at once, no diagnosis needed
        attempt.writer("live-analyzer").write("incidents", conform("incidents", _incident("inc-live")), window=0)
        second = c.json(f"{api}/incidents")
        assert [(i["id"], i["source"]) for i in second["incidents"]] == [("inc-live", "store")]
        assert second["version"] != first["version"]
        # a new window of steps arrives: the step range grows, the stale stored incident goes
        steps = attempt.read("steps", steps=(15, 19))
        shift = steps.column("end_ns").to_numpy().max() - steps.column("start_ns").to_numpy().min()
        late = {"rank": steps.column("rank"), "step": steps.column("step").to_numpy() + 5,
                "start_ns": steps.column("start_ns").to_numpy() + shift,
                "end_ns": steps.column("end_ns").to_numpy() + shift}
        attempt.writer("late").write("steps", conform("steps", late), window=4)
        third = c.json(f"{api}?wait=60")
        assert third["steps"] == [0, 24] and third["diagnosis"]["fresh"]
        assert len(third["step_time"]["job_s"]) == 25
        assert c.json(f"{api}/incidents")["incidents"] == []
        runs_before = c.json("/api/runs")
        # a new run appears in the list
        other = sim(simulated, "jit_stall")[0]
        shutil.copytree(other.path.parent, store_root(attempt) / "runs" / other.identity.run_id)
        runs_after = c.json("/api/runs")
        assert len(runs_after["runs"]) == 2 and runs_after["version"] != runs_before["version"]
