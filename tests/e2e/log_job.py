"""A 4-rank gloo job whose ranks fail in the ways a job's log shows (for test_job_log.py):
rank 1 prints an NCCL warning (as NCCL writes them: ``host:pid:tid [dev] NCCL WARN``), rank 2
raises, rank 3 is killed by SIGKILL — as the kernel's OOM killer does, which says so in the kernel
log: with ``$KERNEL_LOG`` set, rank 3 first writes that line there; every rank prints its steps."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
for step in range(6):
    dist.all_reduce(x)
    print(f"rank {rank} step {step} sum {x[0].item():.0f}", flush=True)
    time.sleep(0.3)
    if step == 2 and rank == 1:
        print(f"node-a:{os.getpid()}:{os.getpid() + 7} [0] NCCL WARN NET/IB : Got completion from peer with "
              f"error 12, opcode 0, len 0, vendor err 129", file=sys.stderr, flush=True)
    if step == 4 and rank == 2:
        raise ValueError("loss is nan")
    if step == 4 and rank == 3:
        if os.environ.get("KERNEL_LOG"):
            with open(os.environ["KERNEL_LOG"], "a") as kmsg:
                kmsg.write(f"3,2071,88312345,-;Out of memory: Killed process {os.getpid()} (python) "
                           f"total-vm:9876543kB, anon-rss:8765432kB, file-rss:0kB, shmem-rss:0kB, UID:0\n")
        os.kill(os.getpid(), signal.SIGKILL)
