"""Megatron-shaped PyTorch Profiler (Kineto) traces, written by hand for tests.

Deliberately shares no code with ``argus`` (stdlib only): the importer and the analysis are
checked against a second, simple model of what a real job records, not against their own
exporter. One ``rank{N}.json.gz`` per rank, as ``torch.profiler`` writes it with PyTorch 2.x:
``distributedInfo.pg_config`` lists the rank's process groups with Megatron's ``pg_desc``, and
every NCCL kernel's args name its group ("Process Group Ranks", "Process Group Description").

The model: layout order tp-cp-ep-dp-pp (rank = tp_idx + tp * dp_idx + tp * dp * pp_idx), 8 GPUs
a host, a GPipe schedule of 4 microbatches over 2 layers a stage. A collective's members end
together: each kernel lasts from its own start until the last member has started, plus the
transfer time of its communicator. TP, DP and model-parallel all-reduces share one stream, and
the bf16 ones one kernel name, yet their transfer times differ by an order of magnitude.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GPUS_PER_HOST", "TRANSFER_US", "parallel_groups", "rank_of", "write_job"]

GPUS_PER_HOST = 8
MICROBATCHES = 4
LAYERS = 2  # per pipeline stage
COMPUTE, COMM, P2P = 7, 40, 48  # CUDA streams: compute, NCCL collectives, pipeline send/recv
SIGMA = 0.03  # lognormal noise of every duration

TP, DP, PP, MP = ("TENSOR_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP",
                  "MODEL_PARALLEL_GROUP")

_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_{}_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
GEMM_FWD, GEMM_DGRAD, GEMM_WGRAD = (_GEMM.format(t) for t in ("tn", "nn", "nt"))
_FLASH = ("<Flash_{0}_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t>, true, false, false, false>"
          "(Flash_{0}_params)")
FLASH_FWD = "void flash_fwd_kernel" + _FLASH.format("fwd")
FLASH_BWD = "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel" + _FLASH.format("bwd")
_NCCL = "(ncclDevKernelArgsStorage<4096ul>)"
ALLREDUCE_BF16 = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" + _NCCL
ALLREDUCE_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL" + _NCCL
REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL" + _NCCL
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL" + _NCCL
SEND_RECV = "ncclDevKernel_SendRecv" + _NCCL

#: Transfer time (µs) of each collective: what its last-arriving member spends in the kernel.
TRANSFER_US = {"tp_allreduce": 300.0, "dp_reduce_scatter": 3000.0, "dp_all_gather": 3000.0,
               "dp_allreduce": 50.0, "mp_allreduce": 20.0, "sendrecv": 500.0}
#: Compute kernels' typical durations (µs).
_COMPUTE_US = {GEMM_FWD: 420.0, FLASH_FWD: 350.0, GEMM_DGRAD: 430.0, GEMM_WGRAD: 450.0, FLASH_BWD: 900.0}


def rank_of(tp: int, dp: int, t: int, d: int, p: int) -> int:
    """Global rank of tp index ``t``, dp index ``d``, pipeline stage ``p`` (tp fastest, then dp, then pp)."""
    return t + tp * d + tp * dp * p


def parallel_groups(tp: int, pp: int, dp: int) -> dict[str, list[list[int]]]:
    """Megatron's communicators by ``pg_desc``; MODEL_PARALLEL is tp x pp: the union of the tp
    groups along one pipeline line."""
    def r(t: int, d: int, p: int) -> int:
        return rank_of(tp, dp, t, d, p)
    return {TP: [[r(t, d, p) for t in range(tp)] for p in range(pp) for d in range(dp)],
            DP: [[r(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)],
            PP: [[r(t, d, p) for p in range(pp)] for d in range(dp) for t in range(tp)],
            MP: [sorted(r(t, d, p) for t in range(tp) for p in range(pp)) for d in range(dp)]}


@dataclass
class _Rank:
    """One rank's recorder: its CPU thread's clock, its streams' clocks and its events."""

    rank: int
    groups: dict[str, list[int]]  # pg_desc → members
    pg_names: dict[str, str]  # pg_desc → pg_name
    pid: int
    cpu: float = 0.0
    ready: dict[int, float] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    corr: int = 0
    ext: int = 0

    @property
    def device(self) -> int:
        return self.rank % GPUS_PER_HOST

    def _launch(self, name: str, stream: int, dur: float, args: dict | None = None,
                after: float = 0.0, nccl: bool = False) -> dict:
        """Launch a kernel from the CPU thread; it starts when its stream (and ``after``) allow."""
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC" if nccl
                            else "cudaLaunchKernel", "pid": self.pid, "tid": self.pid, "ts": round(self.cpu, 3),
                            "dur": 2.0, "args": {"External id": self.ext, "correlation": self.corr}})
        start = max(self.ready.get(stream, 0.0), after, self.cpu + 6.0)
        kernel = {"ph": "X", "cat": "kernel", "name": name, "pid": self.device, "tid": stream,
                  "ts": round(start, 3), "dur": round(dur, 3),
                  "args": {"External id": self.ext, "queued": 0, "device": self.device, "context": 1,
                           "stream": stream, "correlation": self.corr, **(args or {})}}
        self.events.append(kernel)
        self.ready[stream] = start + dur
        self.cpu += 4.0
        return kernel

    def compute(self, name: str, rng: random.Random) -> None:
        self.ext += 1
        self._launch(name, COMPUTE, _COMPUTE_US[name] * rng.lognormvariate(0.0, SIGMA))

    def annotate(self, name: str, cpu_start: float, kernels: list[dict]) -> None:
        """A ``record_function`` range on the CPU and its GPU twin over ``kernels``."""
        self.ext += 1
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": self.pid, "tid": self.pid,
                            "ts": round(cpu_start, 3), "dur": round(self.cpu - cpu_start, 3),
                            "args": {"External id": self.ext}})
        if kernels:
            lo = min(k["ts"] for k in kernels)
            hi = max(k["ts"] + k["dur"] for k in kernels)
            self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": self.device,
                                "tid": kernels[0]["tid"], "ts": lo, "dur": round(hi - lo, 3),
                                "args": {"External id": self.ext}})

    def post(self, desc: str, collective: str, annotation: str, kernel: str, stream: int, nelems: int,
             dtype: str) -> dict:
        """Enqueue a collective as PyTorch records it: ``record_param_comms`` around the
        ``nccl:…`` range around the launch. Its duration is set once every member has posted."""
        members = self.groups[desc]
        group = {"Process Group Name": self.pg_names[desc], "Process Group Description": desc,
                 "Process Group Ranks": json.dumps(members)}
        sizes = {"Collective name": collective, "In msg nelems": nelems, "Out msg nelems": nelems,
                 "Group size": len(members), "dtype": dtype, "In split size": "[]", "Out split size": "[]"}
        t0 = self.cpu
        self.ext += 1
        ext = self.ext
        self.events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": self.pid,
                            "tid": self.pid, "ts": round(t0, 3), "dur": 14.0,
                            "args": {"External id": ext, **sizes, "Global rank start": members[0],
                                     "Global rank stride": members[1] - members[0] if len(members) > 1 else 1,
                                     **group, "Rank": self.rank}})
        self.cpu += 2.0
        self.events.append({"ph": "X", "cat": "user_annotation", "name": annotation, "pid": self.pid,
                            "tid": self.pid, "ts": round(self.cpu, 3), "dur": 10.0, "args": {"External id": ext}})
        self.cpu += 2.0  # the launch and the kernel carry the range's id
        k = self._launch(kernel, stream, 0.0, {**sizes, **group}, after=self.ready.get(COMPUTE, 0.0), nccl=True)
        self.cpu += 6.0
        k["_ext"], k["_annotation"] = ext, annotation
        return k


def _finish(posted: list[tuple[_Rank, dict]], transfer: float, rng: random.Random, blocks: bool = True,
            blocked: set[int] | None = None) -> None:
    """Members of one communicator instance end together: the last one to start moves data for
    ``transfer`` µs, the others wait for it. ``blocks``: the compute stream waits for the result
    (``blocked``: only these ranks do)."""
    end = max(k["ts"] for _, k in posted) + transfer
    for r, k in posted:
        mine = end + rng.uniform(0.0, 2.0)
        k["dur"] = round(mine - k["ts"], 3)
        r.ready[k["tid"]] = mine
        if blocks and (blocked is None or r.rank in blocked):
            r.ready[COMPUTE] = max(r.ready.get(COMPUTE, 0.0), mine)
        r.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": k.pop("_annotation"), "pid": r.device,
                         "tid": k["tid"], "ts": k["ts"], "dur": k["dur"], "args": {"External id": k.pop("_ext")}})


def _device_properties() -> list[dict]:
    return [{"id": i, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045477376, "computeMajor": 9,
             "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
             "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132}
            for i in range(GPUS_PER_HOST)]


def write_job(out_dir: Path, tp: int, pp: int, dp: int, steps: int = 12, slow_group: list[int] | None = None,
              factor: float = 1.9, seed: int = 0, compress: bool = True) -> None:
    """Write ``rank{N}.json.gz`` (or ``.json``) for every rank of a tp x pp x dp job.

    ``slow_group``: the members of one DATA_PARALLEL communicator whose link is slow: its
    reduce-scatter, all-gather and all-reduce move data ``factor`` times slower, every step."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    world = tp * pp * dp
    rng = random.Random(seed)
    by_desc = parallel_groups(tp, pp, dp)
    if slow_group is not None and sorted(slow_group) not in by_desc[DP]:
        raise ValueError(f"{slow_group} is no DATA_PARALLEL group of tp={tp}, pp={pp}, dp={dp}")
    slow = set(slow_group or ())
    names: dict[tuple[str, tuple[int, ...]], str] = {}
    for desc in (TP, DP, PP, MP):
        for g in by_desc[desc]:
            names[(desc, tuple(g))] = str(len(names) + 1)
    ranks = []
    for r in range(world):
        mine = {desc: next(g for g in gs if r in g) for desc, gs in by_desc.items()}
        ranks.append(_Rank(r, mine, {d: names[(d, tuple(g))] for d, g in mine.items()}, pid=100_000 + 17 * r))

    def instances(desc: str, stage: int | None = None) -> list[list[_Rank]]:
        gs = by_desc[desc]
        return [[ranks[m] for m in g] for g in gs if stage is None or g[0] // (tp * dp) == stage]

    def tp_allreduce(group: list[_Rank]) -> None:
        posted = [(r, r.post(TP, "allreduce", "nccl:all_reduce", ALLREDUCE_BF16, COMM, 4_194_304, "BFloat16"))
                  for r in group]
        _finish(posted, TRANSFER_US["tp_allreduce"] * rng.lognormvariate(0.0, SIGMA), rng)

    def layers(group: list[_Rank], backward: bool) -> None:
        """One microbatch through this stage's layers on a tp group, its all-reduces included."""
        for _ in range(LAYERS):
            for parts in ([GEMM_FWD, FLASH_FWD, GEMM_FWD], [GEMM_FWD, GEMM_FWD]) if not backward else \
                    ([GEMM_DGRAD, GEMM_WGRAD, GEMM_DGRAD, GEMM_WGRAD], [FLASH_BWD, GEMM_DGRAD, GEMM_WGRAD]):
                for r in group:
                    for name in parts:
                        r.compute(name, rng)
                tp_allreduce(group)

    def p2p(senders: list[_Rank], receivers: list[_Rank], src: int, dst: int) -> None:
        """Activations (or gradients) from stage ``src`` to ``dst``: one SendRecv kernel on each side."""
        for s, r in zip(senders, receivers):
            posted = [(s, s.post(PP, "send", f"nccl:send {src}->{dst}", SEND_RECV, P2P, 4_194_304, "BFloat16")),
                      (r, r.post(PP, "recv", f"nccl:recv {dst}<-{src}", SEND_RECV, P2P, 4_194_304, "BFloat16"))]
            _finish(posted, TRANSFER_US["sendrecv"] * rng.lognormvariate(0.0, SIGMA), rng, blocked={r.rank})

    def dp_collective(key: str, coll: str, annotation: str, kernel: str, nelems: int) -> None:
        for group in instances(DP):
            posted = [(r, r.post(DP, coll, annotation, kernel, COMM, nelems, "BFloat16")) for r in group]
            scale = factor if {r.rank for r in group} == slow else 1.0
            _finish(posted, TRANSFER_US[key] * scale * rng.lognormvariate(0.0, SIGMA), rng)

    t = 1_000_000.0
    for step in range(steps):
        for r in ranks:
            r.cpu = t + rng.uniform(5.0, 30.0)
            r.ready = {s: t + 50.0 for s in (COMPUTE, COMM, P2P)}
        for phase in ("forward", "backward"):
            for _mb in range(MICROBATCHES):
                order = range(pp) if phase == "forward" else range(pp - 1, -1, -1)
                for stage in order:
                    prev = stage - 1 if phase == "forward" else stage + 1
                    if 0 <= prev < pp:  # the other side posted its send already: the schedule runs in stage order
                        for line in instances(PP):
                            p2p([line[prev]], [line[stage]], prev, stage)
                    for group in instances(TP, stage):
                        marks = [(r, r.cpu, len(r.events)) for r in group]
                        layers(group, backward=phase == "backward")
                        for r, c0, n0 in marks:
                            r.annotate(phase, c0, [e for e in r.events[n0:] if e.get("cat") == "kernel"
                                                   and e["tid"] == COMPUTE])
        dp_collective("dp_reduce_scatter", "_reduce_scatter_base", "nccl:_reduce_scatter_base", REDUCE_SCATTER,
                      50_331_648)
        for group in instances(MP):  # the grad norm: one float over tp x pp
            posted = [(r, r.post(MP, "allreduce", "nccl:all_reduce", ALLREDUCE_F32, COMM, 1, "Float")) for r in group]
            _finish(posted, TRANSFER_US["mp_allreduce"] * rng.lognormvariate(0.0, SIGMA), rng)
        dp_collective("dp_allreduce", "allreduce", "nccl:all_reduce", ALLREDUCE_BF16, 2048)
        for r in ranks:
            c0, n0 = r.cpu, len(r.events)
            r.compute(GEMM_WGRAD, rng)  # stands in for the optimizer's fused kernels
            r.annotate("optimizer", c0, r.events[n0 + 1:])
        dp_collective("dp_all_gather", "_allgather_base", "nccl:_all_gather_base", ALL_GATHER, 50_331_648)
        end = max(max(r.ready.values()) for r in ranks) + 200.0
        for r in ranks:
            r.corr += 1
            r.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": r.pid,
                             "tid": r.pid, "ts": round(r.cpu, 3), "dur": round(end - 20.0 - r.cpu, 3),
                             "args": {"External id": 0, "correlation": r.corr}})
            r.ext += 1
            r.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": r.pid,
                             "tid": r.pid, "ts": round(t, 3), "dur": round(end - t, 3),
                             "args": {"External id": r.ext}})
        t = end + 1.0

    for r in ranks:
        pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": world,
                      "ranks": list(range(world))}]
        pg_config += [{"pg_name": r.pg_names[d], "pg_desc": d, "backend_config": "cuda:nccl",
                       "pg_size": len(g), "ranks": g} for d, g in r.groups.items()]
        meta = [{"name": "process_name", "ph": "M", "ts": 0.0, "pid": r.pid, "tid": 0, "args": {"name": "python3"}},
                {"name": "process_labels", "ph": "M", "ts": 0.0, "pid": r.device, "tid": 0,
                 "args": {"labels": f"GPU {r.device}"}}]
        meta += [{"name": "thread_name", "ph": "M", "ts": 0.0, "pid": r.device, "tid": s,
                  "args": {"name": f"stream {s} "}} for s in (COMPUTE, COMM, P2P)]
        doc = {"schemaVersion": 1, "deviceProperties": _device_properties(),
               "distributedInfo": {"backend": "nccl", "rank": r.rank, "world_size": world,
                                   "pg_count": len(pg_config), "pg_config": pg_config, "nccl_version": "2.21.5"},
               "record_shapes": 1, "traceEvents": meta + sorted(r.events, key=lambda e: e["ts"]),
               "traceName": f"rank{r.rank}.json", "displayTimeUnit": "ms",
               "baseTimeNanoseconds": 1_700_000_000_000_000_000}
        text = json.dumps(doc, separators=(",", ":")).encode()
        if compress:
            (out_dir / f"rank{r.rank}.json.gz").write_bytes(gzip.compress(text, compresslevel=1))
        else:
            (out_dir / f"rank{r.rank}.json").write_bytes(text)
