"""A 4-rank gloo job over two torchrun "nodes" on this host, where global rank 3 raises after the
first all-reduce: the others lose their peer (tests/joblog/test_offline.py reads the real logs)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(4)
dist.all_reduce(x)
if dist.get_rank() == 3:
    raise ValueError("loss is nan on this rank")
dist.all_reduce(x)
dist.destroy_process_group()
