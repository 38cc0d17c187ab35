"""Real Prometheus and VictoriaMetrics servers (Debian packages), started per session on
ephemeral loopback ports with temporary storage; tests skip when a binary is absent."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 20.0, what: str = "condition", interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class Server:
    """One TSDB process; :meth:`stop` and :meth:`start` keep its port and data directory."""

    kind: str
    binary: str
    data: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def write_url(self) -> str:
        return f"{self.base}/api/v1/write"

    def prom_url(self, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"job": "argus", **params}.items())
        return f"prom://127.0.0.1:{self.port}?{query}"

    def _args(self) -> list[str]:
        if self.kind == "victoria-metrics":
            # -search.latencyOffset: how long a point stays invisible to queries after its time
            # (default 30 s, for scrapes still arriving). Samples here are pushed whole, and a test
            # reading back what it just wrote waited those 30 s (37 s of the CLI test).
            return [self.binary, f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.data}",
                    "-loggerLevel=ERROR", "-search.latencyOffset=1s"]
        config = self.data.parent / f"{self.data.name}.yml"
        config.write_text("global:\n  scrape_interval: 1h\n")
        shown = subprocess.run([self.binary, "--help"], capture_output=True, text=True, check=False)
        helptext = shown.stdout + shown.stderr
        receiver = ("--web.enable-remote-write-receiver" if "web.enable-remote-write-receiver" in helptext
                    else "--enable-feature=remote-write-receiver")  # Prometheus < 2.33
        return [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.data}",
                f"--web.listen-address=127.0.0.1:{self.port}", receiver, "--log.level=error"]

    def start(self) -> "Server":
        self.log = self.data.parent / f"{self.data.name}.log"
        self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL, stderr=open(self.log, "a"))
        ready = f"{self.base}/health" if self.kind == "victoria-metrics" else f"{self.base}/-/ready"
        try:
            wait_for(lambda: _http_ok(ready) or self.proc.poll() is not None, 30, f"{self.kind} to start")
        except TimeoutError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            pytest.fail(f"{self.kind} exited at start: {self.log.read_text()[-2000:]}")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _server(kind: str, tmp_path_factory) -> Server:
    binary = shutil.which(kind)
    if binary is None:
        pytest.skip(f"{kind} not installed (apt-get install -y prometheus victoria-metrics)")
    root = tmp_path_factory.mktemp(kind)
    return Server(kind, binary, root / "data")


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory):
    server = _server("prometheus", tmp_path_factory).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def victoria(tmp_path_factory):
    server = _server("victoria-metrics", tmp_path_factory).start()
    yield server
    server.stop()


@pytest.fixture()
def own_victoria(tmp_path_factory):
    """A VictoriaMetrics of the test's own, to stop and restart."""
    server = _server("victoria-metrics", tmp_path_factory).start()
    yield server
    server.stop()
