"""The host's own counters: CPU, I/O and memory pressure, and the network ports' health.

What separates a degraded component from a busy one is rarely a timing: a port whose error
counters climb, a link that went down, or a host whose CPUs are saturated (packet processing,
other tenants) or whose storage stalls. Every ``interval_s`` one thread reads, from files the
kernel keeps (``root`` is ``/``; tests point it at a fake tree):

=========================  =================================================================
metric                     source
=========================  =================================================================
``psi_{cpu,io,mem}_some``  ``/proc/pressure/{cpu,io,memory}``: % of the interval some task
``psi_{io,mem}_full``      waited (``some``) / all non-idle tasks waited (``full``), from
                           the ``total=`` µs counters (``avg10`` on the first read)
``cpu_iowait_pct``         ``/proc/stat``: the share of all CPUs' time in iowait, softirq
``cpu_softirq_pct``        (packet processing) and steal (a hypervisor's other guests)
``cpu_steal_pct``
``ib_link_errors``         ``/sys/class/infiniband/*/ports/*/counters``: increments over the
                           interval of the error counters (symbol errors, link downed and
                           error recovery, receive errors, remote physical errors, transmit
                           discards, local link integrity, buffer overruns), all ports
``ib_link_downed``         the increments of ``link_downed`` alone
``roce_retransmits``       ``/sys/class/infiniband/*/ports/*/hw_counters`` (RoCE NICs, where
                           the driver keeps them): increments of the retransmission and
                           loss counters (``ROCE_RETRANSMIT_COUNTERS``: ACK timeouts, RNR NAK
                           retries exhausted, sequence errors, out-of-sequence packets, slow
                           restarts, adaptive retransmissions), all ports
``nic_port_up``            1, or 0 while a port that was up earlier in this run is not:
                           InfiniBand ``state`` ACTIVE, Ethernet ``operstate`` up (physical
                           interfaces only; a port never up here is not this job's)
=========================  =================================================================

Per port, the same as ``<metric>:<device>/<port>`` (``ib_link_errors:mlx5_0/1``,
``ib_link_downed:mlx5_0/1``, ``roce_retransmits:mlx5_0/1``; ``nic_port_up:mlx5_0/1`` and
``nic_port_up:eth0`` at 0 for a port that went down): the ``hw`` table's long format carries the
port in the metric name, and ``port_metric`` splits it back. Per-port rows are written only in
rounds where they are not zero, so a host with many ports costs rows only when one misbehaves;
the host-wide rows (what ``argus/analysis/signals.py`` reads) are written every round.

The samples are the host's, stored as ``hw`` rows of its lowest connected rank of each job
(``argus/analysis/signals.py`` reads them per host), from that rank's latest known step on. A file that is absent is skipped, said
once in the log; without ``/proc/pressure`` (kernels before 4.20, or PSI off) those metrics are
simply not sampled.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from argus.processor.samplers import Output, RankHandle, Sampler, hw_output

__all__ = ["HostCountersSampler", "IB_ERROR_COUNTERS", "ROCE_RETRANSMIT_COUNTERS", "HOST_METRICS", "port_metric"]

log = logging.getLogger("argus.processor")

IB_ERROR_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
                     "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors")
#: ``ports/*/hw_counters`` of RoCE NICs (mlx5 names; a driver without one simply lacks the file)
ROCE_RETRANSMIT_COUNTERS = ("local_ack_timeout_err", "rnr_nak_retry_err", "packet_seq_err", "out_of_sequence",
                            "implied_nak_seq_err", "roce_slow_restart", "roce_adp_retrans", "roce_adp_retrans_to")
_PSI = (("cpu", "cpu"), ("io", "io"), ("memory", "mem"))
#: a sample belongs to a job whose latest step started at most this long before it
SAME_CLOCK_NS = 3600 * 10**9
HOST_METRICS = frozenset({"psi_cpu_some", "psi_io_some", "psi_io_full", "psi_mem_some", "psi_mem_full", "cpu_iowait_pct",
                          "cpu_softirq_pct", "cpu_steal_pct", "ib_link_errors", "ib_link_downed", "roce_retransmits",
                          "nic_port_up"})
#: host-wide metrics also written per port, as ``<metric>:<port>``
PORT_METRICS = ("ib_link_errors", "ib_link_downed", "roce_retransmits", "nic_port_up")


def port_metric(name: str) -> tuple[str, str | None]:
    """``"ib_link_errors:mlx5_0/1"`` → ``("ib_link_errors", "mlx5_0/1")``; a host-wide name → ``(name, None)``."""
    metric, sep, port = name.partition(":")
    return (metric, port) if sep else (name, None)


class HostCountersSampler(Sampler):
    name = "host"

    def __init__(self, *, interval_s: float = 5.0, root: str | os.PathLike = "/"):
        super().__init__()
        self.interval_s = interval_s
        self.root = Path(root)
        self._prev: dict[str, tuple[float, float]] = {}  # counter → (time s, value)
        self._was_up: set[str] = set()
        self._missing: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = self.dropped = self.skipped = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="argus-host-counters", daemon=True)
        self._thread.start()

    def close(self) -> list[Output]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
        return []

    def _loop(self) -> None:
        while True:
            try:
                metrics = self.sample_once()
            except Exception as exc:  # noqa: BLE001 - a sampler never takes the processor down
                log.warning("host counters: %s", exc)
                metrics = []
            if metrics and not self.put(("host", time.time_ns(), metrics)):
                self.dropped += 1
            if self._stop.wait(self.interval_s):
                return

    # -- reading (thread) ------------------------------------------------------------------------
    def _read(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text()
        except OSError:
            if rel not in self._missing and len(self._missing) < 64:
                self._missing.add(rel)
                log.info("host counters: %s not readable here; skipped", self.root / rel)
            return None

    def _delta(self, key: str, value: float, now: float) -> float | None:
        """Increase of a counter since its last read (None on the first; a reset counts from 0)."""
        prev = self._prev.get(key)
        self._prev[key] = (now, value)
        if prev is None:
            return None
        return value - prev[1] if value >= prev[1] else value

    def sample_once(self, now: float | None = None) -> list[tuple[str, float]]:
        """One round: ``[(metric, value), …]``."""
        now = time.monotonic() if now is None else now
        self.rounds += 1
        return self._pressure(now) + self._cpu(now) + self._ports(now)

    def _pressure(self, now: float) -> list[tuple[str, float]]:
        out = []
        for file, short in _PSI:
            text = self._read(f"proc/pressure/{file}")
            if text is None:
                continue
            for line in text.splitlines():
                kind, _, rest = line.partition(" ")
                if kind not in ("some", "full") or (file == "cpu" and kind == "full"):
                    continue  # the system-wide cpu "full" is always 0
                fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
                key = f"psi_{short}_{kind}"
                try:
                    total_us = float(fields["total"])
                except (KeyError, ValueError):
                    continue
                prev = self._prev.get(key)
                grew = self._delta(key, total_us, now)
                if grew is not None and prev is not None and now > prev[0]:
                    out.append((key, min(100.0, 100.0 * grew / 1e6 / (now - prev[0]))))
                elif "avg10" in fields:
                    out.append((key, float(fields["avg10"])))
        return out

    def _cpu(self, now: float) -> list[tuple[str, float]]:
        text = self._read("proc/stat")
        if text is None:
            return []
        line = text.split("\n", 1)[0].split()
        if not line or line[0] != "cpu" or len(line) < 9:
            return []
        vals = [float(x) for x in line[1:9]]  # user nice system idle iowait irq softirq steal
        grew = [self._delta(f"cpu{i}", v, now) for i, v in enumerate(vals)]
        if any(g is None for g in grew):
            return []
        d = np.asarray(grew, np.float64)
        total = float(d.sum())
        if total <= 0:
            return []
        return [("cpu_iowait_pct", 100 * d[4] / total), ("cpu_softirq_pct", 100 * d[6] / total),
                ("cpu_steal_pct", 100 * d[7] / total)]

    def _counter(self, key: str, raw: str | None, now: float) -> float | None:
        """The increase of one port counter file's value since the last round (None: unread or first)."""
        if raw is None:
            return None
        try:
            return self._delta(key, float(raw.strip()), now)
        except ValueError:
            return None

    def _ports(self, now: float) -> list[tuple[str, float]]:
        up: dict[str, bool] = {}
        per_port: list[tuple[str, float]] = []
        errors = downed = retrans = 0.0
        compared = roce_compared = 0  # counters read before: their increments are this interval's
        ib = self.root / "sys/class/infiniband"
        for port in sorted(ib.glob("*/ports/*")) if ib.is_dir() else []:
            name = f"{port.parent.parent.name}/{port.name}"
            rel = port.relative_to(self.root)
            state = self._read(str(rel / "state"))
            if state is not None:
                up[name] = "ACTIVE" in state.upper()
            port_errors = port_downed = port_retrans = 0.0
            for counter in IB_ERROR_COUNTERS:
                grew = self._counter(f"ib:{name}:{counter}", self._read(str(rel / "counters" / counter)), now)
                if grew is None:
                    continue
                compared += 1
                port_errors += grew
                port_downed += grew if counter == "link_downed" else 0.0
            hw = port / "hw_counters"  # RoCE NICs only; which counters depends on the driver: no log line
            for counter in ROCE_RETRANSMIT_COUNTERS if hw.is_dir() else ():
                try:
                    raw = (hw / counter).read_text()
                except OSError:
                    continue
                grew = self._counter(f"roce:{name}:{counter}", raw, now)
                if grew is not None:
                    roce_compared += 1
                    port_retrans += grew
            errors, downed, retrans = errors + port_errors, downed + port_downed, retrans + port_retrans
            per_port += [(f"{m}:{name}", v) for m, v in (("ib_link_errors", port_errors),
                                                         ("ib_link_downed", port_downed),
                                                         ("roce_retransmits", port_retrans)) if v]
        net = self.root / "sys/class/net"
        for nic in sorted(net.iterdir()) if net.is_dir() else []:
            if not (nic / "device").exists():  # lo, bridges, veths, tunnels: no physical port
                continue
            state = self._read(str(nic.relative_to(self.root) / "operstate"))
            if state is not None:
                up[nic.name] = state.strip().lower() == "up"
        out: list[tuple[str, float]] = []
        if compared:
            out += [("ib_link_errors", errors), ("ib_link_downed", downed)]
        if roce_compared:
            out.append(("roce_retransmits", retrans))
        self._was_up |= {k for k, v in up.items() if v}
        judged = {k: v for k, v in up.items() if k in self._was_up}
        if judged:
            out.append(("nic_port_up", 1.0 if all(judged.values()) else 0.0))
            per_port += [(f"nic_port_up:{k}", 0.0) for k, v in judged.items() if not v]
        return out + per_port

    # -- to rows (main thread) -------------------------------------------------------------------
    def receive(self, payload: Any, ranks: Iterable[RankHandle]) -> list[Output]:
        _, ts, metrics = payload
        first: dict[tuple[str, str], RankHandle] = {}
        for h in ranks:  # one rank per job carries the host's rows
            if h.attempt_key not in first or h.rank < first[h.attempt_key].rank:
                first[h.attempt_key] = h
        # … within an hour after its latest known step's start: a sample is the host's *now*,
        # which belongs to the step the job is in. Before its first step, or for a job whose
        # clock is not this host's wall clock (a replay or a simulator feeding the processor:
        # stamped at their offset it landed decades ahead, and a TSDB then refused everything
        # older), it would reopen written windows or mean nothing.
        out = []
        for h in first.values():
            starts = h.info.step_starts
            if starts and 0 <= ts - starts[-1] <= SAME_CLOCK_NS:
                out.append(hw_output(h, ts, metrics))
            else:
                self.skipped += 1
        return out

    def status(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "rounds": self.rounds, "dropped": self.dropped, "skipped": self.skipped,
                "missing": sorted(self._missing)[:16]}
