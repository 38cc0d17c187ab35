"""The deployment examples stay in step with the CLI: every `argus` command line in them
parses with the real parser, and the Kubernetes manifest is valid YAML with the mounts the
processor and the training pods rely on."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from argus.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
yaml = pytest.importorskip("yaml")


def test_k8s_daemonset_commands_parse_and_share_the_socket_directory():
    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/argus-processor-daemonset.yaml").read_text()))
    ds = docs[0]
    assert ds["kind"] == "DaemonSet"
    spec = ds["spec"]["template"]["spec"]
    parser = build_parser()
    for c in spec["containers"]:
        argv = [a for a in c["command"][1:] + c.get("args", [])]
        args = parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in argv])
        assert args.func is not None
    proc = next(c for c in spec["containers"] if c["name"] == "processor")
    sock = proc["command"][proc["command"].index("--socket") + 1]
    mounts = {m["mountPath"] for m in proc["volumeMounts"]}
    assert str(Path(sock).parent) in mounts


def test_slurm_script_runs_argus_run_around_torchrun():
    text = (ROOT / "deploy/slurm/train.sbatch").read_text().replace("\\\n", " ")
    opts = re.search(r"argus run (.*?) -- ", text).group(1)
    assert "--run-id" in opts and "torchrun" in text
    opts = opts.replace('"$STORE"', "/shared/argus").replace('"$SLURM_JOB_ID"', "1")
    opts = opts.replace('${TSDB:+--remote-write "$TSDB"}', "--remote-write http://127.0.0.1:8428/api/v1/write")
    args = build_parser().parse_args(["run", *shlex.split(opts), "--", "torchrun", "train.py"])
    assert args.store == "/shared/argus" and args.run_id == "1" and args.remote_write


def test_every_container_writes_only_where_it_may():
    """A read-only mount is never a place a command writes to: the mirror's ledger goes to a
    writable ``--state-dir`` (without it ``argus sync --watch`` writes ``SRC/.argus-mirror/``,
    and each cycle after the first would fail on the read-only store)."""
    spec = list(yaml.safe_load_all((ROOT / "deploy/k8s/argus-processor-daemonset.yaml").read_text()))[0]
    spec = spec["spec"]["template"]["spec"]
    parser = build_parser()
    checked = 0
    for c in spec["containers"]:
        args = parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in c["command"][1:] + c.get("args", [])])
        mounts = {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}

        def writable(path: str) -> bool:
            owner = max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len)  # noqa: B023
            return not mounts[owner]  # noqa: B023

        if args.command == "sync" and args.watch:
            state = args.state_dir or str(Path(args.src) / ".argus-mirror")
            assert writable(state), f"{c['name']}: the ledger {state} is on a read-only mount"
            checked += 1
        if args.command == "processor":
            assert writable(args.store) and writable(str(Path(args.socket).parent))
            checked += 1
    assert checked == 2


def test_the_manifests_image_is_built_by_the_dockerfile():
    """The image the manifests name is what the repository's Dockerfile builds; where a Docker
    daemon runs here, it is built (the base image comes from a registry: none is reachable in
    CI, so there it is skipped)."""
    text = (ROOT / "deploy/k8s/argus-processor-daemonset.yaml").read_text()
    images = set(re.findall(r"image: (\S+)", text))
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert images == {"REGISTRY/argus:0.1.0"} and "docker build -t REGISTRY/argus:0.1.0 ." in dockerfile
    assert "pip install --no-cache-dir '.[s3]'" in dockerfile  # the mirror's S3 client
    import shutil
    import subprocess

    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no Docker daemon here")
    built = subprocess.run([docker, "build", "-q", "-t", "argus-test:ci", str(ROOT)], capture_output=True, text=True,
                           timeout=900)
    if built.returncode != 0 and ("pull" in built.stderr.lower() or "resolve" in built.stderr.lower()):
        pytest.skip(f"base image unreachable: {built.stderr.strip()[-200:]}")
    assert built.returncode == 0, built.stderr[-2000:]
    version = subprocess.run([docker, "run", "--rm", "argus-test:ci", "argus", "--version"], capture_output=True,
                             text=True, timeout=120)
    assert version.stdout.strip() == "argus 0.1.0"


def test_the_training_job_example_defines_what_it_uses():
    """Every ``$(VAR)`` the training job's command uses is defined in its env, its ``argus run``
    parses, and it mounts the directory of the socket the DaemonSet's processor listens on."""
    job = yaml.safe_load((ROOT / "deploy/k8s/training-job-example.yaml").read_text())
    (c,) = job["spec"]["template"]["spec"]["containers"]
    defined = {e["name"] for e in c["env"]}
    used = set(re.findall(r"\$\((\w+)\)", " ".join(c["command"])))
    assert used <= defined, used - defined
    args = build_parser().parse_args([re.sub(r"\$\(\w+\)", "x", a) for a in c["command"][1:]])
    assert "torchrun" in args.command
    ds = list(yaml.safe_load_all((ROOT / "deploy/k8s/argus-processor-daemonset.yaml").read_text()))[0]
    proc = next(x for x in ds["spec"]["template"]["spec"]["containers"] if x["name"] == "processor")
    sock = proc["command"][proc["command"].index("--socket") + 1]
    assert args.socket == sock and str(Path(sock).parent) in {m["mountPath"] for m in c["volumeMounts"]}
