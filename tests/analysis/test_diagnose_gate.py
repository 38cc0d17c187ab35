"""``argus diagnose`` as a gate scripts act on: exit codes by severity, filters, and every JSON
document it prints valid against the published schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from argus.analysis.incident import SCHEMA_VERSION, Action, IncidentClass, Severity, State
from argus.cli.diagnose import EXIT_CLEAR, EXIT_FOUND, EXIT_NO_DATA
from argus.cli.main import main
from tests.analysis.schema import SCHEMA, validate

SCENARIOS = ["healthy", "compute_straggler", "hang", "gc_pause", "link_flap", "pipeline_bubble"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    for name in SCENARIOS:
        assert main(["simulate", "--scenario", name, "--out", str(root / name), "--ranks", "16", "--steps", "30"]) == 0
    return root


def _diagnose(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["diagnose", *map(str, args), "--no-store"])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_document_validates_against_the_published_schema(stores, capsys, name):
    rc, out = _diagnose(capsys, stores / name, "--json")
    doc = json.loads(out)
    assert rc == EXIT_CLEAR and doc["schema_version"] == SCHEMA_VERSION
    validate(doc)
    if name != "healthy":
        assert doc["incidents"], name


def test_the_schema_names_every_class_state_severity_and_action():
    """A new class or action without a schema change would break scripts that check enums."""
    incident = json.loads(SCHEMA.read_text())["$defs"]["incident"]["properties"]
    assert set(incident["class"]["enum"]) == {str(c) for c in IncidentClass}
    assert set(incident["state"]["enum"]) == {str(s) for s in State}
    assert set(incident["severity"]["enum"]) == {str(s) for s in Severity}
    assert set(incident["action"]["enum"]) == {str(a) for a in Action}


def test_a_shell_loop_tells_healthy_from_faulty_by_exit_code_alone(stores, tmp_path):
    """What a prolog or a cron job runs: `argus diagnose S --fail-on warning`, nothing parsed."""
    empty = tmp_path / "empty"
    assert main(["simulate", "--scenario", "healthy", "--out", str(empty), "--ranks", "4", "--steps", "1"]) == 0
    for f in empty.rglob("*.parquet"):  # a store no rank ever wrote a step into
        if f.parent.parent.name in ("steps", "phases", "hangs"):
            f.unlink()
    script = ("for s in \"$@\"; do argus diagnose \"$s\" --fail-on warning --no-store >/dev/null 2>&1; "
              "rc=$?; echo \"$(basename \"$s\") $rc\"; done")
    out = subprocess.run(["bash", "-c", script, "gate", *(str(stores / n) for n in ("healthy", "compute_straggler",
                                                                                     "hang")), str(empty)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    codes = dict(line.split() for line in out.stdout.splitlines())
    assert codes == {"healthy": str(EXIT_CLEAR), "compute_straggler": str(EXIT_FOUND), "hang": str(EXIT_FOUND),
                     "empty": str(EXIT_NO_DATA)}, out.stdout + out.stderr


def test_fail_on_critical_ignores_what_is_only_a_warning(stores, capsys):
    rc, out = _diagnose(capsys, stores / "link_flap", "--json")
    severities = {i["severity"] for i in json.loads(out)["incidents"]}
    rc_crit, _ = _diagnose(capsys, stores / "link_flap", "--fail-on", "critical")
    rc_warn, _ = _diagnose(capsys, stores / "link_flap", "--fail-on", "warning")
    assert rc_crit == (EXIT_FOUND if "critical" in severities else EXIT_CLEAR)
    assert rc_warn == (EXIT_FOUND if severities & {"warning", "critical"} else EXIT_CLEAR)


def test_filters_leave_incidents_out_and_say_so(stores, capsys):
    rc, out = _diagnose(capsys, stores / "hang", "--json")
    (hang,) = [i for i in json.loads(out)["incidents"] if i["class"] == "hang"]
    before = hang["window"]["start_step"] - 1
    rc, out = _diagnose(capsys, stores / "hang", "--json", "--steps", f"0-{before}", "--fail-on", "warning")
    doc = json.loads(out)
    validate(doc)
    assert all(i["class"] != "hang" for i in doc["incidents"]) and doc["filters"]["left_out"] >= 1
    assert doc["filters"]["steps"] == [0, before]
    assert rc == (EXIT_FOUND if any(i["severity"] != "info" for i in doc["incidents"]) else EXIT_CLEAR)
    rc, out = _diagnose(capsys, stores / "hang", "--steps", f"0-{before}")
    assert "left out by --severity/--steps/--since" in out and "no incident" not in out  # never as healthy
    rc, out = _diagnose(capsys, stores / "hang", "--json", "--severity", "critical")
    assert {i["severity"] for i in json.loads(out)["incidents"]} == {"critical"}


@pytest.mark.parametrize("bad", ["x-y", "9-3", "-5-"])
def test_a_bad_step_range_is_refused_clearly(stores, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", str(stores / "healthy"), "--steps", bad])
    assert exc.value.code == 2 and "--steps" in capsys.readouterr().err


def test_since_keeps_the_incidents_of_the_jobs_last_stretch(stores, capsys):
    """``--since 1s``: only what overlaps the steps that ended in the job's last second — the
    straggler runs to the end and stays; a checkpoint-free early window would not."""
    rc, out = _diagnose(capsys, stores / "compute_straggler", "--json", "--since", "1s")
    doc = json.loads(out)
    validate(doc)
    assert doc["filters"]["since_s"] == 1.0 and doc["filters"]["steps"][0] >= 25
    assert [i["class"] for i in doc["incidents"]] == ["compute_straggler"]
    rc, out = _diagnose(capsys, stores / "compute_straggler", "--json", "--since", "1s", "--steps", "0-5")
    assert json.loads(out)["incidents"] == []  # both filters: the intersection


@pytest.mark.parametrize("bad", ["abc", "-5m", "0s"])
def test_a_bad_duration_is_refused_clearly(stores, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", str(stores / "healthy"), f"--since={bad}"])
    assert exc.value.code == 2 and "--since" in capsys.readouterr().err
