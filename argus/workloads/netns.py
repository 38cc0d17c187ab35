"""A multi-host cluster on one machine: one network namespace per host, a switch, tc throttling.

Layout (see ``docs/testing-network.md`` for the picture): every host ``i`` is a namespace
``{prefix}h{i}`` holding one end of a veth pair, ``veth-h{i}``, with the address
``subnet[i + 1]``; the other end, ``port-h{i}``, sits in a switch namespace ``{prefix}sw`` and is
enslaved to the bridge ``br0`` there. Nothing is created in the root namespace, so every link
and the bridge go away with the namespaces, two clusters never share a name, and the chosen
subnet cannot clash with the machine's own routes.

``throttle(host)`` puts a ``tbf`` qdisc on *both* ends of that host's veth: the host-side end
shapes what the host sends, the switch-side end shapes what it receives (egress of the port
towards the host). That limits both directions with nothing but ``tbf`` (``netem`` is not in
this kernel) and without an ``ifb`` + ``mirred`` ingress redirect.

Needs root, ``ip`` and ``tc`` (iproute2). Costs ~10 ms of ``ip`` calls per host to build.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Self

from argus import env as argus_env

__all__ = [
    "DEFAULT_PREFIX_BASE",
    "JobTimeout",
    "NamespaceCluster",
    "NetnsError",
    "available",
    "cleanup_stale",
    "launch_job",
    "parse_size_bytes",
]

#: Every cluster's default prefix is ``{DEFAULT_PREFIX_BASE}{pid}-{token}-``; the pid lets
#: ``cleanup_stale`` tell a crashed run's leftovers from a live run's namespaces.
DEFAULT_PREFIX_BASE = "argus-e2e-"
_PID_IN_NAME = re.compile(re.escape(DEFAULT_PREFIX_BASE) + r"(\d+)-")
_VALID_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_BRIDGE = "br0"
_ETH_HEADER_BYTES = 14
_MASTER_PORTS = itertools.count(29500)


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed; the message holds the command and its stderr."""


class JobTimeout(RuntimeError):
    """``launch_job`` ran past its timeout; ``results`` holds what each rank had written."""

    def __init__(self, message: str, results: list[subprocess.CompletedProcess]):
        super().__init__(message)
        self.results = results


def available() -> str | None:
    """``None`` when namespaces can be built here, else the reason they cannot."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return None


def _sh(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc


def _netns_names() -> list[str]:
    out = _sh(["ip", "netns", "list"]).stdout
    # Lines look like "name (id: 3)" or just "name".
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in(ns: str) -> list[int]:
    out = _sh(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split()]


def _kill_and_delete(ns: str) -> None:
    """Kill what still runs in ``ns`` (only harness-started processes live there), delete it."""
    for pid in _pids_in(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _sh(["ip", "netns", "del", ns], check=False)


def _pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (killed, not yet reaped) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def cleanup_stale(prefix: str = DEFAULT_PREFIX_BASE, *, include_live: bool = False) -> list[str]:
    """Delete namespaces (and so their veths and bridge) whose names start with ``prefix``.

    Namespaces named by a default prefix carry their creator's pid; those whose creator is
    still alive are kept unless ``include_live``, so running this before a test never breaks a
    cluster another process is using. Returns the names removed.
    """
    removed = []
    for ns in _netns_names():
        if not ns.startswith(prefix):
            continue
        owner = _PID_IN_NAME.match(ns)
        if owner and not include_live and _pid_alive(int(owner.group(1))):
            continue
        _kill_and_delete(ns)
        removed.append(ns)
    return removed


_SIZE_UNITS = {  # tc(8) size units, in bytes (tc's "k" is 1024 here, unlike rates)
    "": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3,
    "gb": 1024**3, "bit": 1 / 8, "kbit": 1024 / 8, "mbit": 1024**2 / 8, "gbit": 1024**3 / 8,
}


def parse_size_bytes(size: str | int) -> int:
    """A tc size (``"32kbit"``, ``"4kb"``, ``1500``) in bytes, the way tc reads it."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", size)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a tc size: {size!r} (use e.g. '32kbit', '16kb', 4096)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


class NamespaceCluster:
    """``hosts`` namespaces on one bridge; a context manager that deletes all it made.

    ``prefix`` names every namespace (default: unique per instance, with this pid). The
    subnet lives only inside the cluster's namespaces; the default is fine for parallel
    clusters because they do not share a network.
    """

    def __init__(self, hosts: int, prefix: str | None = None, subnet: str = "10.213.0.0/24",
                 mtu: int = 1500):
        if hosts < 1:
            raise ValueError(f"hosts must be >= 1, got {hosts}")
        net = ipaddress.ip_network(subnet)
        if net.num_addresses - 2 < hosts:
            raise ValueError(f"subnet {subnet} has no room for {hosts} hosts")
        prefix = prefix or f"{DEFAULT_PREFIX_BASE}{os.getpid()}-{secrets.token_hex(3)}-"
        if not _VALID_PREFIX.fullmatch(prefix):
            raise ValueError(f"prefix {prefix!r}: use 1-64 of [A-Za-z0-9_.-]")
        self.hosts = hosts
        self.prefix = prefix
        self.subnet = net
        self.mtu = mtu
        self.switch_ns = f"{prefix}sw"
        self._procs: list[subprocess.Popen] = []
        self._throttled: set[int] = set()
        self._entered = False

    # -- names -----------------------------------------------------------------------------
    def ns(self, host: int) -> str:
        """Namespace name of ``host``."""
        self._check_host(host)
        return f"{self.prefix}h{host}"

    def ifname(self, host: int) -> str:
        """The host's interface inside its namespace (what ``GLOO_SOCKET_IFNAME`` names)."""
        self._check_host(host)
        return f"veth-h{host}"

    def port(self, host: int) -> str:
        """The switch-side end of the host's veth, in ``switch_ns``."""
        self._check_host(host)
        return f"port-h{host}"

    def ip(self, host: int) -> str:
        """The host's address (``subnet`` + 1 + host)."""
        self._check_host(host)
        return str(self.subnet.network_address + 1 + host)

    def host_name(self, host: int) -> str:
        """Name the host reports (``ARGUS_HOST``)."""
        self._check_host(host)
        return f"ns-host-{host}"

    def namespaces(self) -> list[str]:
        return [self.switch_ns] + [self.ns(h) for h in range(self.hosts)]

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.hosts:
            raise IndexError(f"host {host} not in 0..{self.hosts - 1}")

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Self:
        reason = available()
        if reason:
            raise NetnsError(reason)
        self._entered = True
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch_ns
        _sh(["ip", "netns", "add", sw])
        _sh(["ip", "-n", sw, "link", "add", _BRIDGE, "type", "bridge"])
        _sh(["ip", "-n", sw, "link", "set", _BRIDGE, "mtu", str(self.mtu), "up"])
        plen = self.subnet.prefixlen
        for h in range(self.hosts):
            ns, ifn, port = self.ns(h), self.ifname(h), self.port(h)
            _sh(["ip", "netns", "add", ns])
            # Both ends are born inside their namespaces: no name ever exists in the root ns.
            _sh(["ip", "link", "add", ifn, "netns", ns, "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", port, "netns", sw, "mtu", str(self.mtu)])
            _sh(["ip", "-n", sw, "link", "set", port, "master", _BRIDGE, "up"])
            _sh(["ip", "-n", ns, "addr", "add", f"{self.ip(h)}/{plen}", "dev", ifn])
            _sh(["ip", "-n", ns, "link", "set", ifn, "up"])
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])

    def close(self) -> None:
        """Kill processes started here, delete every namespace (and with them links, bridge).

        Idempotent; safe after a partial build.
        """
        for proc in self._procs:
            _kill_tree(proc)
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        existing = set(_netns_names())
        for ns in self.namespaces():
            if ns in existing:
                _kill_and_delete(ns)
        self._throttled.clear()
        self._entered = False

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- processes -------------------------------------------------------------------------
    def run(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
            **popen_kw) -> subprocess.Popen:
        """Start ``argv`` inside ``host``'s namespace (``ip netns exec``).

        ``env`` is added to this process's environment. The child gets its own session so
        ``close()`` can kill it with everything it spawned.
        """
        if not self._entered:
            raise NetnsError("cluster is not built: use it as a context manager")
        full_env = {**os.environ, **(env or {})}
        popen_kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv], env=full_env,
                                **popen_kw)
        self._procs.append(proc)
        return proc

    # -- shaping ---------------------------------------------------------------------------
    def throttle(self, host: int, rate: str = "10mbit", burst: str = "32kbit",
                 latency: str = "400ms") -> None:
        """Limit ``host``'s link to ``rate`` in both directions with ``tbf``.

        ``burst`` must hold one full frame (MTU + 14 bytes): tbf drops any non-GSO packet
        larger than its bucket, which stalls TCP instead of slowing it. ``latency`` bounds the
        queue (``rate x latency`` bytes); beyond it packets are dropped.
        """
        burst_bytes = parse_size_bytes(burst)
        if burst_bytes < self.mtu + _ETH_HEADER_BYTES:
            raise ValueError(f"burst {burst!r} = {burst_bytes} B is below one frame "
                             f"({self.mtu + _ETH_HEADER_BYTES} B): tbf would drop full packets")
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        _sh(["tc", "-n", self.ns(host), "qdisc", "replace", "dev", self.ifname(host), *tbf])
        _sh(["tc", "-n", self.switch_ns, "qdisc", "replace", "dev", self.port(host), *tbf])
        self._throttled.add(host)

    def unthrottle(self, host: int) -> None:
        """Remove the host's tbf qdiscs (back to the veth default, ``noqueue``)."""
        for ns, dev in ((self.ns(host), self.ifname(host)), (self.switch_ns, self.port(host))):
            _sh(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
        self._throttled.discard(host)

    def qdisc(self, host: int) -> tuple[str, str]:
        """``tc qdisc show`` of the host side and the switch side (for assertions and logs)."""
        return (_sh(["tc", "-n", self.ns(host), "qdisc", "show", "dev", self.ifname(host)]).stdout,
                _sh(["tc", "-n", self.switch_ns, "qdisc", "show", "dev", self.port(host)]).stdout)


def launch_job(cluster: NamespaceCluster, script: str | os.PathLike, args: Sequence[str] = (),
               nproc_per_host: int = 1, master_host: int = 0,
               env: Mapping[str, str] | None = None, timeout: float = 120.0,
               master_port: int | None = None) -> list[subprocess.CompletedProcess]:
    """Run ``python script args`` as a torch.distributed job, ``nproc_per_host`` ranks per host.

    Rank ``r`` runs on host ``r // nproc_per_host`` with the usual ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` (the master host's
    address), ``GLOO_SOCKET_IFNAME`` (without it gloo resolves the machine's hostname, an
    address the namespace cannot reach) and ``ARGUS_HOST``; ``env`` is applied last, so a test
    can override any of them (an empty ``GLOO_SOCKET_IFNAME`` drops it). Returns one CompletedProcess per
    rank, in rank order, with text stdout/stderr. If a rank fails the others are killed at
    once (they would hang in gloo); past ``timeout`` raises ``JobTimeout``.
    """
    world = cluster.hosts * nproc_per_host
    port = master_port if master_port is not None else next(_MASTER_PORTS)
    base_env = {
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc_per_host),
        "MASTER_ADDR": cluster.ip(master_host),
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
    }
    procs: list[subprocess.Popen] = []
    logs = []
    with tempfile.TemporaryDirectory(prefix="argus-netns-job-") as tmp, ExitStack() as files:
        try:
            for rank in range(world):
                host = rank // nproc_per_host
                rank_env = {
                    **base_env,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank % nproc_per_host),
                    "GLOO_SOCKET_IFNAME": cluster.ifname(host),
                    argus_env.HOST: cluster.host_name(host),
                    **(env or {}),
                }
                # Files, not pipes: a rank that fills a pipe would block while we wait on another.
                out, err = (files.enter_context(open(Path(tmp) / f"rank{rank}.{kind}", "w+"))
                            for kind in ("out", "err"))
                logs.append((out, err))
                procs.append(cluster.run(host, [sys.executable, str(script), *args],
                                         env=rank_env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL))
            timed_out = _wait_all(procs, timeout)
        finally:
            for proc in procs:
                _kill_tree(proc)
                proc.wait()
        results = []
        for proc, (out, err) in zip(procs, logs):
            out.seek(0)
            err.seek(0)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode,
                                                       out.read(), err.read()))
    if timed_out:
        raise JobTimeout(f"job {script} did not finish within {timeout:.0f} s", results)
    return results


def _wait_all(procs: list[subprocess.Popen], timeout: float, poll_s: float = 0.05) -> bool:
    """Wait for all; kill the rest as soon as one fails. True if the timeout struck."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return False
        failed = any(c not in (None, 0) for c in codes)
        if failed or time.monotonic() > deadline:
            for p in procs:
                _kill_tree(p)
            for p in procs:
                p.wait()
            return not failed
        time.sleep(poll_s)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and, if it leads its own process group, everything it spawned."""
    if proc.poll() is not None:
        return
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
