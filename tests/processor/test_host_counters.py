"""The host counters sampler on a fake /proc and /sys tree, and on this machine's real files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from argus.processor.host_counters import HOST_METRICS, HostCountersSampler


def _psi(some_total: int, full_total: int, avg10: float = 1.5) -> str:
    return (f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total={some_total}\n"
            f"full avg10=0.00 avg60=0.00 avg300=0.00 total={full_total}\n")


def _stat(user: int, iowait: int, softirq: int, steal: int, idle: int = 10_000) -> str:
    return f"cpu  {user} 0 0 {idle} {iowait} 0 {softirq} {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def _tree(root: Path) -> dict[str, Path]:
    (root / "proc" / "pressure").mkdir(parents=True)
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    for nic in ("eth0", "lo"):
        (root / "sys/class/net" / nic).mkdir(parents=True)
    (root / "sys/class/net/eth0/device").mkdir()  # physical; lo has no device
    (root / "sys/class/net/lo/operstate").write_text("unknown\n")
    return {"port": port, "eth0": root / "sys/class/net/eth0"}


def _write(root: Path, at: dict[str, Path], *, io_some: int, stat: str, symbol: int, downed: int, ib: str, eth: str):
    (root / "proc/pressure/cpu").write_text(_psi(0, 0))
    (root / "proc/pressure/io").write_text(_psi(io_some, io_some // 2))
    (root / "proc/pressure/memory").write_text(_psi(0, 0))
    (root / "proc/stat").write_text(stat)
    (at["port"] / "state").write_text(ib)
    (at["port"] / "counters" / "symbol_error").write_text(f"{symbol}\n")
    (at["port"] / "counters" / "link_downed").write_text(f"{downed}\n")
    (at["port"] / "counters" / "port_rcv_errors").write_text("7\n")
    (at["eth0"] / "operstate").write_text(eth)


def test_pressure_cpu_shares_port_errors_and_a_port_gone_down(tmp_path):
    at = _tree(tmp_path)
    s = HostCountersSampler(root=tmp_path)
    _write(tmp_path, at, io_some=1_000_000, stat=_stat(100, 0, 0, 0), symbol=40, downed=1,
           ib="4: ACTIVE\n", eth="up\n")
    first = dict(s.sample_once(now=100.0))
    # the first read: PSI's own 10 s averages, no CPU shares or counter increments yet (the
    # counters' values since boot are no interval's), every port up
    assert first == {"psi_cpu_some": 1.5, "psi_io_some": 1.5, "psi_io_full": 0.0, "psi_mem_some": 1.5,
                     "psi_mem_full": 0.0, "nic_port_up": 1.0}
    _write(tmp_path, at, io_some=2_500_000, stat=_stat(400, 300, 200, 100, idle=10_400), symbol=43, downed=2,
           ib="4: ACTIVE\n", eth="down\n")
    second = dict(s.sample_once(now=105.0))
    assert second["psi_io_some"] == pytest.approx(30.0) and second["psi_io_full"] == pytest.approx(15.0)
    assert second["psi_cpu_some"] == 0.0
    # 300 + 300 + 200 + 100 + 400 jiffies: iowait 300/1300, softirq 200/1300, steal 100/1300
    assert second["cpu_iowait_pct"] == pytest.approx(100 * 300 / 1300)
    assert second["cpu_softirq_pct"] == pytest.approx(100 * 200 / 1300)
    assert second["cpu_steal_pct"] == pytest.approx(100 * 100 / 1300)
    assert (second["ib_link_errors"], second["ib_link_downed"]) == (4.0, 1.0)  # 3 symbol + 1 downed
    assert second["nic_port_up"] == 0.0  # eth0 was up, is down
    assert set(second) <= HOST_METRICS


def test_a_port_never_up_in_this_run_is_not_this_jobs_and_absent_files_are_said_once(tmp_path, caplog):
    at = _tree(tmp_path)
    (tmp_path / "proc/stat").write_text(_stat(1, 0, 0, 0))
    (at["port"] / "state").write_text("1: DOWN\n")
    (at["eth0"] / "operstate").write_text("up\n")
    s = HostCountersSampler(root=tmp_path)
    with caplog.at_level(logging.INFO, logger="argus.processor"):
        for t in (0.0, 5.0, 10.0):
            got = dict(s.sample_once(now=t))
    assert got["nic_port_up"] == 1.0  # the unused InfiniBand port is not judged
    said = [r.message for r in caplog.records if "proc/pressure/io" in r.message]
    assert len(said) == 1 and "skipped" in said[0]


def test_this_machines_own_files_read_without_error():
    import time

    s = HostCountersSampler()
    s.sample_once()
    time.sleep(0.2)  # a few clock ticks of CPU time to share out
    got = dict(s.sample_once(now=None))
    assert set(got) <= HOST_METRICS
    if Path("/proc/stat").exists():
        assert 0.0 <= got["cpu_iowait_pct"] <= 100.0


def test_samples_go_to_the_jobs_lowest_rank_only_when_its_clock_is_this_hosts():
    """A job fed by a simulator or a replay runs on a clock of its own: the host's *now* stamped
    into it landed decades ahead once shifted to the job's time, and a TSDB then refused every
    older sample of the run (the Prometheus test's second simulated job lost a third of its
    windows). Only a rank whose latest step started within the hour before the sample gets it."""
    import time

    from argus.processor.assembler import RankInfo
    from argus.processor.samplers import RankHandle

    now = time.time_ns()
    live = [RankHandle(1, RankInfo(rank=r), ("job", "0")) for r in (3, 2)]
    fed = RankHandle(2, RankInfo(rank=0), ("replay", "0"))
    for h in live:
        h.info.step_starts.append(now - 2 * 10**9)
    fed.info.step_starts.append(5 * 10**9)  # a clock starting at 5 s
    s = HostCountersSampler()
    out = s.receive(("host", now, [("psi_cpu_some", 12.0)]), [*live, fed])
    assert [(h.rank, list(recs["value"])) for h, _, recs in out] == [(2, [12.0])] and s.skipped == 1
    (_, _, recs), = out
    assert live[1].info.names[recs["metric"][0]] == "psi_cpu_some"
