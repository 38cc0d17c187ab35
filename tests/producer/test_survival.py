"""The producer never hurts training: processor absent, killed and restarted; store unwritable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from argus.producer import api  # noqa: E402
from argus.store import Store  # noqa: E402
from argus.workloads.train_transformer import Stage  # noqa: E402
from tests.shortdir import short_dir  # noqa: E402


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _processor(store: Path, sock: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(store), "--socket", str(sock),
                             "--host", "h0", "--window-steps", "2", "--no-fsync"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert _wait_for(lambda: sock.exists() or proc.poll() is not None), "processor did not start"
    assert proc.poll() is None, proc.stderr.read()
    return proc


def _steps(model, opt, n):
    for _ in range(n):
        x = torch.randint(0, 64, (2, 16))
        F.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.02)


def test_processor_killed_and_restarted_mid_run_loses_nothing(tmp_path, no_launcher_env):
    """Records wait in the rank's ring while no processor listens; the next processor drains
    them from where the killed one stopped."""
    sock = short_dir("argus-s-") / "p.sock"
    store = tmp_path / "store"
    first = _processor(store, sock)
    assert api.init(socket_path=str(sock), flush_interval_s=0.1, run_id="survive", kernels="off")
    rt = api.runtime()
    model = Stage(64, 32, 2, 1, first=True, last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    second = None
    try:
        _steps(model, opt, 10)
        assert _wait_for(lambda: rt.transport.connected)
        first.send_signal(signal.SIGKILL)  # a crash: no flush
        first.wait()
        sock.unlink(missing_ok=True)
        _steps(model, opt, 10)  # training goes on while nobody listens
        second = _processor(store, sock)
        assert _wait_for(lambda: rt.transport.connected and rt.transport.client.sock is not None)
        _steps(model, opt, 3)
        last = rt.step - 1
    finally:
        api.shutdown()
        if second is not None:
            second.send_signal(signal.SIGTERM)
            second.wait(30)
    attempt = Store.open(store).attempt("survive")
    steps = set(attempt.read("steps").column("step").to_pylist())
    # windows the killed processor held open are lost with it; everything after its death is there
    assert set(range(10, last + 1)) <= steps, sorted(steps)
    assert not any(d["events"] for d in attempt.read("drops").to_pylist() if d["table"] == "steps")


def test_unwritable_store_leaves_training_running(tmp_path):
    """``argus run`` with a store it cannot create: a clear error, the command still runs."""
    blocked = tmp_path / "ro"
    blocked.mkdir()
    os.chmod(blocked, 0o500)
    if os.access(blocked, os.W_OK):  # root ignores permissions: use a path under a file instead
        os.chmod(blocked, 0o700)
        (tmp_path / "file").write_text("x")
        store = tmp_path / "file" / "store"
    else:
        store = blocked / "store"
    script = tmp_path / "train.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                      "for _ in range(3):\n    m(torch.ones(2, 4)).sum().backward(); opt.step()\nprint('trained')\n")
    out = subprocess.run([sys.executable, "-m", "argus", "run", "--store", str(store), "--", sys.executable,
                          str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "trained" in out.stdout
    assert "processor could not start" in out.stderr and str(store) in out.stderr
    assert "Traceback" not in out.stderr
