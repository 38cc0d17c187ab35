"""The host counters sampler on a fake /proc and /sys tree, and on this machine's real files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from argus.processor.host_counters import HOST_METRICS, ROCE_RETRANSMIT_COUNTERS, HostCountersSampler, port_metric


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
    # … and per port, which one: the port's own increments, the port that went down
    assert (second["ib_link_errors:mlx5_0/1"], second["ib_link_downed:mlx5_0/1"]) == (4.0, 1.0)
    assert second["nic_port_up:eth0"] == 0.0 and "nic_port_up:mlx5_0/1" not in second
    assert {port_metric(m)[0] for m in second} <= HOST_METRICS


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


def _port(root: Path, dev: str, *, state: str = "4: ACTIVE\n", counters: dict[str, int] | None = None,
          hw_counters: dict[str, int] | None = None) -> None:
    port = root / "sys/class/infiniband" / dev / "ports/1"
    (port / "counters").mkdir(parents=True, exist_ok=True)
    (port / "state").write_text(state)
    for name, v in (counters or {}).items():
        (port / "counters" / name).write_text(f"{v}\n")
    if hw_counters is not None:
        (port / "hw_counters").mkdir(exist_ok=True)
        for name, v in hw_counters.items():
            (port / "hw_counters" / name).write_text(f"{v}\n")


def test_each_port_keeps_its_own_counters_and_roce_ports_their_retransmits(tmp_path, caplog):
    """Two InfiniBand ports and a RoCE port whose driver keeps three of the retransmission counters:
    the host-wide sums stay what the analysis reads; per port, only what rose is written."""
    ib = {c: 0 for c in ("symbol_error", "link_downed", "port_rcv_errors", "port_xmit_discards")}
    roce = {"local_ack_timeout_err": 10, "out_of_sequence": 100, "roce_slow_restart": 0}
    with caplog.at_level(logging.INFO, logger="argus.processor"):
        for round_, t in ((0, 0.0), (1, 5.0), (2, 10.0)):
            rose = int(round_ >= 1)  # in round 1 only: mlx5_1's errors and the RoCE port's retransmits
            _port(tmp_path, "mlx5_0", counters=ib)
            _port(tmp_path, "mlx5_1", counters={**ib, "port_rcv_errors": 5 * rose, "port_xmit_discards": 2 * rose})
            _port(tmp_path, "mlx5_2", counters=ib, hw_counters={k: v + 3 * rose for k, v in roce.items()})
            if round_ == 0:
                s = HostCountersSampler(root=tmp_path)
            got = dict(s.sample_once(now=t))
            if round_ == 0:  # counts since boot are no interval's
                assert got == {"nic_port_up": 1.0}
            elif round_ == 1:
                assert (got["ib_link_errors"], got["ib_link_downed"], got["roce_retransmits"]) == (7.0, 0.0, 9.0)
                assert {m: v for m, v in got.items() if port_metric(m)[1]} == {
                    "ib_link_errors:mlx5_1/1": 7.0, "roce_retransmits:mlx5_2/1": 9.0}
            else:  # nothing rose: the host-wide zeros, no per-port row
                assert got == {"ib_link_errors": 0.0, "ib_link_downed": 0.0, "roce_retransmits": 0.0,
                               "nic_port_up": 1.0}
    assert {port_metric(m)[0] for m in got} <= HOST_METRICS
    # the RoCE counters a driver lacks are not "missing files": no line for them, nor for hw_counters/
    assert not [r for r in caplog.records if "hw_counters" in r.message]
    assert set(roce) < set(ROCE_RETRANSMIT_COUNTERS)


def test_a_roce_port_alone_has_no_ib_error_counters_to_sum_and_a_port_name_splits_back(tmp_path):
    _port(tmp_path, "mlx5_3", hw_counters={"packet_seq_err": 1})
    (tmp_path / "sys/class/infiniband/mlx5_3/ports/1/counters").rmdir()
    s = HostCountersSampler(root=tmp_path)
    s.sample_once(now=0.0)
    _port(tmp_path, "mlx5_3", state="1: DOWN\n", hw_counters={"packet_seq_err": 4})
    (tmp_path / "sys/class/infiniband/mlx5_3/ports/1/counters").rmdir()
    got = dict(s.sample_once(now=5.0))
    assert got == {"roce_retransmits": 3.0, "roce_retransmits:mlx5_3/1": 3.0, "nic_port_up": 0.0,
                   "nic_port_up:mlx5_3/1": 0.0}
    assert port_metric("roce_retransmits:mlx5_3/1") == ("roce_retransmits", "mlx5_3/1")
    assert port_metric("psi_cpu_some") == ("psi_cpu_some", None)


def test_this_machines_own_files_read_without_error():
    import time

    s = HostCountersSampler()
    s.sample_once()
    time.sleep(0.2)  # a few clock ticks of CPU time to share out
    got = dict(s.sample_once(now=None))
    assert {port_metric(m)[0] for m in got} <= HOST_METRICS
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
