"""Zero-code activation: the injected ``sitecustomize`` starts the producer where a process
becomes a rank (its process group comes up), with the rank the group reports — and nowhere
else: not in a plain Python process, not in a helper a rank starts, not in forked workers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import shutil
import weakref

import pytest

pytest.importorskip("torch")

from argus.cli.run import INJECT_DIR
from argus.wire import FrameReader, Msg


class _Listener:
    """A unix socket that records the HELLO documents it receives."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="argus-a-")) / "p.sock"  # short: a socket path has 108 bytes
        weakref.finalize(self, shutil.rmtree, self.path.parent, True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        self.sock.listen(16)
        self.hellos: list[dict] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        reader = FrameReader()
        while chunk := conn.recv(65536):
            reader.feed(chunk)
            for msg, payload in reader.frames():
                if msg == Msg.HELLO:
                    self.hellos.append(json.loads(payload))


def _run(code: str, tmp_path: Path, listener: _Listener, **env: str) -> subprocess.CompletedProcess:
    rings = tmp_path / "rings"
    rings.mkdir(exist_ok=True)
    full = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "ARGUS_TRACED_PID")},
            "PYTHONPATH": os.pathsep.join([str(INJECT_DIR), os.environ.get("PYTHONPATH", "")]),
            "ARGUS_SOCKET": str(listener.path), "ARGUS_RING_DIR": str(rings), "ARGUS_FLUSH_S": "0.05",
            "ARGUS_KERNELS": "off", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=full,
                          cwd=tmp_path)


_INIT = ("import os, time, torch, torch.distributed as dist\n"
         "dist.init_process_group('gloo', init_method='file://' + os.path.abspath('pg'), rank=0, world_size=1)\n")


def test_a_process_that_never_makes_a_process_group_is_not_traced(tmp_path):
    listener = _Listener()
    done = _run("import torch\nm = torch.nn.Linear(2, 2)\nm(torch.ones(1, 2)).sum().backward()\nprint('ok')",
                tmp_path, listener, RANK="3", WORLD_SIZE="8")  # launcher variables alone do not make a rank
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
    assert not listener.hellos and not list((tmp_path / "rings").iterdir())


def test_a_rank_starts_at_process_group_init_with_the_groups_rank(tmp_path):
    listener = _Listener()
    code = _INIT + "time.sleep(0.5)\nprint(os.environ['ARGUS_TRACED_PID'] == str(os.getpid()))\nos._exit(0)\n"
    done = _run(code, tmp_path, listener, RANK="7", WORLD_SIZE="8")  # the group says 0 of 1: it wins
    assert done.returncode == 0 and "True" in done.stdout, done.stderr
    assert [(h["rank"], h["world_size"]) for h in listener.hellos] == [(0, 1)]
    ring = Path(listener.hellos[0]["ring"])
    assert ring.parent == tmp_path / "rings" and ring.exists()  # os._exit: left for the processor to drain


def test_a_helper_process_of_a_rank_that_makes_its_own_group_is_not_traced(tmp_path):
    """Like distributed checkpointing's background process: spawned by a rank, its own group."""
    listener = _Listener()
    code = (
        "import multiprocessing as mp, os, time\n"
        "def helper(path):\n"
        "    import torch.distributed as d\n"
        "    d.init_process_group('gloo', init_method='file://' + path, rank=0, world_size=1)\n"
        "    print('helper', os.getpid(), flush=True)\n"
        "if __name__ == '__main__':\n"
        + "".join("    " + line + "\n" for line in _INIT.splitlines()) +
        "    p = mp.get_context('spawn').Process(target=helper, args=(os.path.abspath('pg2'),))\n"
        "    p.start(); p.join()\n"
        "    time.sleep(0.3)\n"
        "    os._exit(p.exitcode)\n")
    script = tmp_path / "job.py"
    script.write_text(code)
    done = _run(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", tmp_path, listener)
    assert done.returncode == 0 and "helper" in done.stdout, done.stderr
    assert len(listener.hellos) == 1, listener.hellos  # the rank only


def test_forked_workers_stop_the_inherited_producer(tmp_path):
    listener = _Listener()
    code = _INIT + (
        "from argus.producer import api\n"
        "rt = api.runtime()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    m = torch.nn.Linear(2, 2)\n"
        "    m(torch.ones(1, 2)).sum().backward()\n"
        "    os._exit(0 if not rt.active and rt.ring.closed else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status), 'parent active', rt.active, flush=True)\n"
        "os._exit(0)\n")
    done = _run(code, tmp_path, listener)
    assert "child 0 parent active True" in done.stdout, done.stdout + done.stderr
    assert len(listener.hellos) == 1


def test_arming_every_process_costs_no_heavy_import(tmp_path):
    """Every Python process of an ``argus run`` job runs the injected sitecustomize: it must not
    load numpy, pyarrow or torch into processes that never become ranks."""
    listener = _Listener()
    done = _run("import sys\nprint(sorted(m for m in ('numpy', 'pyarrow', 'duckdb', 'torch') if m in sys.modules))",
                tmp_path, listener)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
