"""A real gloo job that leaves Flight Recorder dumps (``TORCH_FR_BUFFER_SIZE``), for the tests.

``python -m torch.distributed.run --standalone --nproc_per_node=4 fr_job.py SCENARIO OUT``:
* ``skip``: three world all-reduces complete (dump ``OUT/healthy``); then on a new
  ``DATA_PARALLEL_GROUP`` every rank but 2 starts an all-reduce (dump ``OUT/skip``);
* ``nested``: tensor-parallel pairs {0,1} {2,3}; rank 3 stops, rank 2 starts its pair's
  all-reduce, ranks 0 and 1 a world one (dump ``OUT/nested``).
Gloo writes no dump on a timeout (NCCL does): each rank asks for its own with ``_dump_fr_trace``
while the others wait, the record a hung job's ranks would have written.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace


def _barrier(name: str) -> None:
    """Every rank here, through the rendezvous store: a collective barrier would be in the Flight
    Recorder itself, and one not yet marked complete when a rank dumps (it happened in 1 run of
    few) is a collective every member issued and none finished — a stuck one, which the
    analysis then rightly blames on the link instead of the rank that never came."""
    store = dist.distributed_c10d._get_default_store()
    world = dist.get_world_size()
    store.add(f"barrier/{name}", 1)
    deadline = time.monotonic() + 60
    while store.add(f"barrier/{name}", 0) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name}: not every rank came")
        time.sleep(0.01)


def dump(out: str, rank: int) -> None:
    os.makedirs(out, exist_ok=True)
    _barrier(out)  # every rank has issued what it will: the state a timeout finds
    with open(os.path.join(out, f"fr_trace_{rank}"), "wb") as f:
        f.write(_dump_fr_trace(True, True, False))


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(8)
    work = None  # the stuck collective, kept unwaited
    if scenario == "skip":
        for _ in range(3):
            dist.all_reduce(x)
        dump(os.path.join(out, "healthy"), rank)
        dp = dist.new_group(group_desc="DATA_PARALLEL_GROUP")
        work = dist.all_reduce(torch.ones(16, dtype=torch.float16), group=dp, async_op=True) if rank != 2 else None
        dump(os.path.join(out, "skip"), rank)
    else:
        pairs = [dist.new_group([0, 1], group_desc="TENSOR_MODEL_PARALLEL_GROUP"),
                 dist.new_group([2, 3], group_desc="TENSOR_MODEL_PARALLEL_GROUP")]
        tp = pairs[rank // 2]
        dist.all_reduce(x, group=tp)
        if rank == 2:
            work = dist.all_reduce(x, group=tp, async_op=True)  # rank 3 never comes
        elif rank in (0, 1):
            work = dist.all_reduce(x, async_op=True)  # ranks 2 and 3 never come
        dump(os.path.join(out, "nested"), rank)
    del work
    time.sleep(0.2)
    os._exit(0)  # the stuck works are never waited for


if __name__ == "__main__":
    main()
