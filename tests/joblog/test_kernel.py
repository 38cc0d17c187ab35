"""The kernel log channel: real line formats (``/dev/kmsg`` records, ``kern.log`` lines), read
from the run's start on, and a missing or unreadable log turns the channel off quietly."""

from __future__ import annotations

import os

from argus.joblog.kernel import KernelLog, parse_kernel_line
from argus.joblog.signatures import LogKind

XID = "4,1203,1734567890,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
OOM = "3,2071,88312345,-;Out of memory: Killed process 31337 (python) total-vm:98765432kB, anon-rss:87654321kB"
OOM_KILL = ("6,2070,88312340,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
            "global_oom,task_memcg=/user.slice,task=python,pid=31337,uid=0")
NIC = "Dec  4 02:13:14 node7 kernel: [8812.1] mlx5_core 0000:5e:00.0 ens1f0np0: Link down"


def test_the_lines_the_kernel_writes_are_known_with_the_process_they_name():
    sig, pid, text = parse_kernel_line(XID)
    assert (sig.kind, pid) == (LogKind.XID, 4242) and text.startswith("NVRM: Xid (PCI:0000:3b:00): 79")
    assert [(s.kind, p) for s, p, _ in map(parse_kernel_line, (OOM, OOM_KILL))] == [(LogKind.OOM, 31337)] * 2
    sig, pid, _ = parse_kernel_line(NIC)
    assert (sig.kind, pid, sig.severity) == (LogKind.NIC_DOWN, -1, "warning")
    assert parse_kernel_line(" SUBSYSTEM=pci") is None  # a /dev/kmsg record's continuation line
    assert parse_kernel_line("6,1,2,-;eth0: renamed from veth1a2b") is None
    assert parse_kernel_line("6,1,2,-;br0: port 1(port-h0) entered disabled state") is None  # netns set-up


def test_only_what_is_written_after_the_start_is_kept(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text(OOM + "\n")  # before the run: another job's
    k = KernelLog(str(path), interval_s=3600).start()
    with open(path, "a") as f:
        f.write("6,9,9,-;nothing to see\n" + XID + "\n" + NIC[:40])  # the last line still being written
    k.read_once()
    (e,) = k.take()
    assert (e.kind, e.pid, e.rank, e.stream) == (LogKind.XID, 4242, -1, "kernel")
    with open(path, "a") as f:
        f.write(NIC[40:] + "\n")
    k.stop()
    assert [e.kind for e in k.take()] == [LogKind.NIC_DOWN]


def test_an_unreadable_kernel_log_turns_the_channel_off(tmp_path):
    k = KernelLog(str(tmp_path / "missing")).start()
    assert k.off and "not readable" in k.off
    k.stop()
    assert k.take() == []


def test_this_machines_kernel_log_opens_or_says_why(tmp_path):
    k = KernelLog().start()
    try:
        assert k.off is None or "/dev/kmsg" in k.off
        if k.off is None:
            k.read_once()  # records written since the start: none of ours, but it reads
    finally:
        k.stop()
    assert os.path.exists("/dev/kmsg") or k.off
