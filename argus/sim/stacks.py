"""Synthetic CPU stack samples that say what each rank's host thread was doing.

Rows are already aggregated (one per rank, step and distinct stack, with a count), the form
the processor stores. Counts follow from the time each rank spent in each activity at the
sampling rate, so a JIT stall of 6 s on one rank shows ~120 compile samples at 20 Hz.
Frames use py-spy's folded format: ``function (file:line)`` joined by ``;``, root first.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from argus.sim.faults import Hang, HostStall

__all__ = ["step_stacks", "FRAMES"]

_ROOT = ("<module> (pretrain_gpt.py:285);pretrain (megatron/training/training.py:386);"
         "train (megatron/training/training.py:1260);train_step (megatron/training/training.py:742)")
_PIPE = _ROOT + ";forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py:1421)"

FRAMES = {
    "forward": _PIPE + ";forward_step (megatron/core/pipeline_parallel/schedules.py:275);"
               "_call_impl (torch/nn/modules/module.py:1762);forward (megatron/core/transformer/transformer_block.py:549)",
    "backward": _PIPE + ";backward_step (megatron/core/pipeline_parallel/schedules.py:372);"
                "backward (torch/autograd/__init__.py:353);_engine_run_backward (torch/autograd/graph.py:825)",
    "waiting": _ROOT + ";finalize_model_grads (megatron/core/distributed/finalize_model_grads.py:141);"
               "synchronize (torch/cuda/__init__.py:985)",
    "dataloader": _ROOT + ";get_batch (pretrain_gpt.py:95);__next__ (torch/utils/data/dataloader.py:733);"
                  "_next_data (torch/utils/data/dataloader.py:1458);_get_data (torch/utils/data/dataloader.py:1420);"
                  "get (queue.py:180);wait (threading.py:331)",
    "checkpoint": _ROOT.replace("train_step (megatron/training/training.py:742)",
                                "save_checkpoint_and_time (megatron/training/training.py:1105)")
                  + ";save_checkpoint (megatron/training/checkpointing.py:416);save (torch/serialization.py:965);"
                  "_save (torch/serialization.py:1225);write_record (torch/serialization.py:899)",
    "jit": _PIPE + ";backward_step (megatron/core/pipeline_parallel/schedules.py:372);"
           "backward (torch/autograd/__init__.py:353);_engine_run_backward (torch/autograd/graph.py:825);"
           "apply (torch/autograd/function.py:307);backward (flash_attn/flash_attn_interface.py:1066);"
           "_flash_attn_backward (flash_attn/flash_attn_interface.py:268);run (triton/runtime/jit.py:591);"
           "compile (triton/compiler/compiler.py:283);make_cubin (triton/backends/nvidia/compiler.py:388);"
           "run (subprocess.py:550);communicate (subprocess.py:1209)",
    "gc": _PIPE + ";forward_step (megatron/core/pipeline_parallel/schedules.py:275);"
          "_call_impl (torch/nn/modules/module.py:1762);forward (megatron/core/transformer/transformer_block.py:549);"
          "gc_collect_main (Modules/gcmodule.c:1307)",
    "hung_collective": _ROOT + ";finalize_model_grads (megatron/core/distributed/finalize_model_grads.py:141);"
                       "all_reduce (torch/distributed/distributed_c10d.py:2810);wait (torch/distributed/distributed_c10d.py:3021)",
}


def step_stacks(*, step: int, start: np.ndarray, end: np.ndarray, busy: np.ndarray, waiting: np.ndarray,
                dataloader: np.ndarray, checkpoint: np.ndarray, stalled: np.ndarray, stalls: list[HostStall],
                hang: Hang | None, rate_hz: float, to_ns: Callable[[np.ndarray, np.ndarray], np.ndarray],
                hang_observed_s: float) -> pa.Table:
    """Aggregated samples of one step for all ranks (arrays are per rank, times in ns)."""
    n = len(start)
    unfinished = ~np.isfinite(end)
    end = np.where(unfinished, start + hang_observed_s * 1e9, end)
    per_ns = rate_hz / 1e9
    busy = np.nan_to_num(busy, posinf=0.0)
    waiting = np.nan_to_num(waiting, posinf=0.0)
    dataloader = np.nan_to_num(dataloader, posinf=0.0)
    parts: list[tuple[np.ndarray, str]] = [
        (busy / 3 * per_ns, FRAMES["forward"]),
        (busy * 2 / 3 * per_ns, FRAMES["backward"]),
        (waiting * per_ns, FRAMES["waiting"]),
        (checkpoint * per_ns, FRAMES["checkpoint"]),
        (dataloader * per_ns, FRAMES["dataloader"]),
    ]
    for st in stalls:
        stall_counts = np.zeros(n)
        stall_counts[list(st.ranks)] = stalled[list(st.ranks)] * per_ns
        parts.append((stall_counts, st.frames))
    if hang is not None:
        observed = np.where(unfinished, hang_observed_s * 1e9 * per_ns, 0.0)
        culprit = np.zeros(n)
        culprit[hang.rank] = observed[hang.rank]
        others = observed.copy()
        others[hang.rank] = 0.0
        parts += [(culprit, hang.frames), (others, FRAMES["hung_collective"])]

    ranks: list[np.ndarray] = []
    frames: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    labels: list[str] = []
    for values, label in parts:
        c = np.rint(values).astype(np.int64)
        idx = np.flatnonzero(c > 0)
        if idx.size:
            ranks.append(idx)
            counts.append(c[idx])
            frames.append(np.full(idx.size, len(labels)))
            labels.append(label)
    if not ranks:
        from argus.store.schema import TABLES

        return TABLES["stacks"].schema.empty_table()
    r = np.concatenate(ranks)
    f = np.concatenate(frames)
    return pa.table({
        "rank": pa.array(r, pa.int32()),
        "step": pa.array(np.full(r.size, step, np.int64)),
        "start_ns": to_ns(r, start[r]),
        "end_ns": to_ns(r, end[r]),
        "thread": pa.array(np.full(r.size, "MainThread", object), pa.string()),
        "frames": pa.DictionaryArray.from_arrays(pa.array(f, pa.int32()), pa.array(labels)).cast(pa.string()),
        "count": pa.array(np.concatenate(counts), pa.int32()),
    })
