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
