"""A production-shaped kernel workload: what one rank-step of a large dense + MoE job launches.

The standard simulator (``argus.sim.engine``) issues ≈ 900 launches of ≈ 25 names per
rank-step — enough to test detection, too small to say what compression costs at the paper's
volume (~10 MB of raw records per rank-step). This module builds the launch *program* of one
pipeline stage of a large job and draws its durations for many ranks and steps, vectorised:

* a stage of ``layers`` transformer layers, every ``moe_every``-th a MoE layer with
  ``local_experts`` experts on this rank (router, top-k, sort/scan, permute, grouped GEMMs);
* ``microbatches`` microbatches through 1F1B, full activation **recomputation** (the forward
  runs again before each backward), sequence-parallel **TP** all-gather / reduce-scatter
  around attention and MLP, **EP** all-to-all (NCCL ``SendRecv``) around the experts, **PP**
  send/recv per microbatch, **DP** bucketed reduce-scatter / all-gather, a world all-reduce
  for the gradient norm and the overflow check;
* the element-wise tails of a ``torch.compile``-d model: many distinct ``triton_*_fused_*``
  kernels, ATen element-wise / reduce / index kernels, and a chunked fused-Adam optimiser.

Durations: compute kernels are a per-position base (one name serves several shapes, so some
names are multi-modal) with a log-normal jitter and a per-rank speed; collectives are a
transfer time plus **waiting**, drawn per group kind: TP small, EP from the MoE load
imbalance, PP from the 1F1B bubble (a few long waits per step, many short), DP from the
step's slowest peer, world from stragglers (heavy-tailed, over decades). It is a kernel
*mix* for the compression benchmark, not a causal simulation: ranks do not wait for each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from argus.errors import ConfigError
from argus.sim.workload import STREAMS
from argus.vocab import GroupKind, KernelKind, PhaseCategory

__all__ = ["ProductionConfig", "ProductionKernels", "ProductionWorkload"]

_NS_PER_US = 1_000.0
#: Wait-model ids per launch (what a collective's duration is made of besides the transfer).
_COMPUTE, _TP, _EP, _PP, _DP, _WORLD = range(6)
_COMM_STREAM = {_TP: STREAMS[GroupKind.TP], _EP: STREAMS[GroupKind.EP], _PP: STREAMS[GroupKind.PP],
                _DP: STREAMS[GroupKind.DP], _WORLD: STREAMS[GroupKind.WORLD]}
#: GPU idle between back-to-back launches when the host keeps ahead (as ``Workload.launch_gap_us``).
_LAUNCH_GAP_NS = 3_000


@dataclass(frozen=True, slots=True)
class ProductionConfig:
    layers: int = 8  # per pipeline stage
    moe_every: int = 2  # every n-th layer is MoE
    local_experts: int = 4  # experts on this rank: one grouped-GEMM launch each per GEMM
    microbatches: int = 8
    recompute: bool = True  # full activation recomputation: forward kernels again before backward
    pp_stage: int = 1  # which stage (its 1F1B warm-up waits grow with the stage index)
    pp_stages: int = 4
    dp_buckets: int = 24  # gradient buckets: one reduce-scatter and one all-gather each
    optimizer_chunks: int = 64  # multi-tensor-apply launches per optimiser op
    compute_sigma: float = 0.03  # log-normal jitter of one compute launch
    rank_speed_sigma: float = 0.01  # per-rank speed spread (healthy GPUs differ by ~1%)
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.layers, self.moe_every, self.local_experts, self.microbatches, self.pp_stages,
               self.dp_buckets, self.optimizer_chunks) < 1 or not 0 <= self.pp_stage < self.pp_stages:
            raise ConfigError(f"bad production workload: {self}")


@dataclass
class ProductionKernels:
    """Kernel events with interned names (the processor's form): ids into ``names``."""

    rank: np.ndarray
    step: np.ndarray
    stream: np.ndarray
    name_id: np.ndarray
    start_ns: np.ndarray
    dur_ns: np.ndarray
    names: list[str]
    kind_id: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    kinds: list[str] = field(default_factory=lambda: [KernelKind.KERNEL])

    def __post_init__(self) -> None:
        if self.kind_id.size != self.dur_ns.size:
            self.kind_id = np.zeros(self.dur_ns.size, np.int64)

    def __len__(self) -> int:
        return int(self.dur_ns.size)

    def to_table(self) -> pa.Table:
        """The store's ``kernels`` schema (names as a dictionary column: strings travel once)."""
        from argus.store.schema import TABLES

        schema = TABLES["kernels"].schema
        names = pa.DictionaryArray.from_arrays(pa.array(self.name_id, pa.int32()), pa.array(self.names))
        kinds = pa.DictionaryArray.from_arrays(pa.array(self.kind_id, pa.int32()), pa.array(self.kinds))
        return pa.table({
            "rank": pa.array(self.rank, pa.int32()), "step": pa.array(self.step, pa.int64()),
            "kind": kinds.cast(pa.string()), "device": pa.array(self.rank % 8, pa.int32()),
            "stream": pa.array(self.stream, pa.int32()), "name": names.cast(pa.string()),
            "start_ns": pa.array(self.start_ns, pa.int64()), "dur_ns": pa.array(self.dur_ns, pa.int64()),
        }, schema=schema)


# -- kernel names ------------------------------------------------------------------------------
_NCCL_ARGS = "(ncclDevKernelArgsStorage<4096ul>)"
_TRITON_OPS = ("add", "mul", "rsqrt", "mean", "pow", "silu", "sigmoid", "_to_copy", "view", "clone", "native_dropout",
               "cat", "slice", "neg", "sum", "div", "sub", "exp", "where", "bmm", "permute", "expand", "gelu",
               "native_layer_norm", "embedding", "unsqueeze", "split", "index", "copy_", "masked_fill")
_ATEN = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
    "(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<c10::BFloat16>, "
    "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<c10::BFloat16>, at::detail::Array<char*, 1>)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"
    "(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 3> >(int, ...)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2> >(int, ...)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, ...)",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#3}::operator()() const::{lambda()#10}::operator()() const::{lambda(c10::BFloat16)#1}, "
    "at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, char*, at::native::memory::LoadWithCast<1>, "
    "at::native::memory::StoreWithCast<1> >(int, ...)",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
    "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::"
    "{lambda(float)#1}>(at::TensorIteratorBase&, ...)::{lambda(int)#1}>(int, ...)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
    "unsigned int, float, 4, 4> >(at::native::ReduceOp<float, ...>)",
    "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, "
    "float, 4, 4> >(at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4, 4>)",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl"
    "<at::native::OpaqueType<2> >(at::TensorIteratorBase&, ...)::{lambda(int)#1}>(long, ...)",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>"
    "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, ...)",
    "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel"
    "<true, c10::BFloat16>::operator()<at::native::ReduceAdd>(...)::{lambda(int)#1}>(int, ...)",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2>, "
    "unsigned int, 3, 128, 1>(...)",
    "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
    "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxBackwardEpilogue>(float*, float const*, float const*, long)",
)
_MOE = (
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float, "
    "unsigned int>, unsigned int, unsigned int, bool, unsigned int, unsigned int, ...)",
    "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long, at::native::LTOp<float, true>, unsigned int>"
    "(at::cuda::detail::TensorInfo<float, unsigned int>, ...)",
    "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, long, "
    "unsigned int>::Policy800, false, long, long, unsigned int, int, int>(int*, int*, unsigned int*, ...)",
    "void at_cuda_detail::cub::DeviceRadixSortHistogramKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, long, "
    "unsigned int>::Policy800, false, long, unsigned int>(unsigned int*, long const*, unsigned int, int, int)",
    "void at_cuda_detail::cub::DeviceScanKernel<at_cuda_detail::cub::DeviceScanPolicy<long>::Policy600, long const*, "
    "long*, at_cuda_detail::cub::ScanTileState<long, true>, std::plus<long>, ...>(...)",
    "void at_cuda_detail::cub::DeviceScanInitKernel<at_cuda_detail::cub::ScanTileState<long, true> >"
    "(at_cuda_detail::cub::ScanTileState<long, true>, int)",
    "void at::cuda::kernelHistogram1D<long, long, long, 1, 2, -1, (at::cuda::CUDAHistogramMemoryType)0, "
    "at::native::(anonymous namespace)::histc_template<long, long>(...)::{lambda(long)#1}>(...)",
    "void moe::permute_tokens_kernel<c10::BFloat16, 128>(c10::BFloat16 const*, c10::BFloat16*, int const*, int, int)",
    "void moe::unpermute_tokens_kernel<c10::BFloat16, float, 128>(c10::BFloat16 const*, c10::BFloat16*, float const*, "
    "int const*, int, int, int)",
)
_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
         "TensorListMetadata<{n}>, at::native::(anonymous namespace)::{functor}, {args}>(...)")


def _gemm(layout: str, tile: str, wg: str) -> str:
    return (f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_{layout}_n_tilesize{tile}_warpgroupsize{wg}_execute_segment_k_off"
            f"_kernel__5x_cublas")


def _splitk_reduce(k: float) -> str:
    """cuBLASLt's split-K reduction after a weight-gradient GEMM, templated on the split."""
    split = 2 + int(k) % 7
    return (f"void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
            f"false, {split}>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, "
            f"__nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*)")


def _grouped(tile: str, epilogue: str) -> str:
    cls = f"cutlass3x_sm90_tensorop_gemm_grouped_bf16_bf16_f32_bf16_bf16_{tile}_warpspecialized_{epilogue}"
    return f"void cutlass::device_kernel<{cls}>({cls}::Params)"


class _Program:
    """One rank-step's launches in order, as parallel lists (appended while building)."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.name: list[int] = []
        self.base_us: list[float] = []
        self.wait: list[int] = []
        self.slot: list[int] = []  # for PP: the microbatch's 1F1B slot; for DP: the bucket; else 0
        self.load: list[int] = []  # MoE launches: index of the (microbatch, layer) load draw, else -1

    def add(self, raw: str, us: float, wait: int = _COMPUTE, slot: int = 0, load: int = -1) -> None:
        self.name.append(self.names.setdefault(raw, len(self.names)))
        self.base_us.append(us)
        self.wait.append(wait)
        self.slot.append(slot)
        self.load.append(load)


class ProductionWorkload:
    """The launch program of one stage (built once, seeded) and its durations for any ranks and steps."""

    def __init__(self, config: ProductionConfig = ProductionConfig()) -> None:
        self.config = config
        rng = np.random.default_rng(config.seed)
        self._p = _Program()
        self._build(rng)
        p = self._p
        self.names = list(p.names)
        self.name_id = np.asarray(p.name, np.int64)
        self.base_ns = np.asarray(p.base_us) * _NS_PER_US
        self.wait = np.asarray(p.wait, np.int64)
        self.slot = np.asarray(p.slot, np.int64)
        self.load = np.asarray(p.load, np.int64)
        self.n_loads = int(self.load.max()) + 1 if (self.load >= 0).any() else 0
        self.stream = np.array([_COMM_STREAM.get(int(w), STREAMS[PhaseCategory.COMPUTE]) for w in self.wait], np.int64)

    @property
    def launches_per_step(self) -> int:
        return int(self.name_id.size)

    # -- the program ---------------------------------------------------------------------------
    def _build(self, rng: np.random.Generator) -> None:
        cfg, p = self.config, self._p
        triton = _triton_names(rng)
        fwd_tails = {kind: [next(triton) for _ in range(n)] for kind, n in (("dense", 28), ("moe", 32))}
        bwd_tails = {kind: [next(triton) for _ in range(n)] for kind, n in (("dense", 40), ("moe", 44))}
        tail_us = {name: float(rng.lognormal(np.log(7.0), 0.9)) for tails in (fwd_tails, bwd_tails)
                   for names in tails.values() for name in names}
        aten_us = [(raw, float(rng.lognormal(np.log(15.0), 0.9))) for raw in _ATEN]
        gemms = {op: (_gemm("tn", t, "2x1x1"), _gemm("nn", t2, "1x1x1"), _gemm("nt", t3, "2x1x1"), us)
                 for op, t, t2, t3, us in (("qkv", "128x256x64", "128x128x64", "256x128x64", 420),
                                           ("proj", "128x128x64", "128x256x64", "128x128x64", 160),
                                           ("fc1", "256x128x64", "256x128x64", "256x128x64", 640),
                                           ("fc2", "128x256x64", "128x128x64", "128x256x64", 320),
                                           ("router", "64x128x64", "64x64x64", "64x128x64", 30),
                                           ("shared_fc1", "128x128x128", "128x128x128", "128x256x128", 220),
                                           ("shared_fc2", "128x128x32", "128x64x64", "128x128x32", 110))}
        flash = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
                 "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, "
                 "false, false, true, true, false, false>(flash::Flash_fwd_params)",
                 "void flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, "
                 "false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >"
                 "(flash::Flash_bwd_params)",
                 "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, "
                 "4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, "
                 "false, true, false, false, false, false, false>(flash::Flash_bwd_params)",
                 "void flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, "
                 "false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> > >"
                 "(flash::Flash_bwd_params, int)")
        grouped = [(_grouped("128x128x64_1x2x1", "cooperative_epi_tma"), 380),
                   (_grouped("128x256x64_2x1x1", "pingpong_epi_tma"), 190),
                   (_grouped("256x128x64_2x1x1", "cooperative_epi_nosmem"), 760)]
        nccl = {"ag": "ncclDevKernel_AllGather_RING_LL128" + _NCCL_ARGS,
                "rs": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL128" + _NCCL_ARGS,
                "a2a": "ncclDevKernel_SendRecv" + _NCCL_ARGS,
                "dp_rs": "ncclDevKernel_ReduceScatter_Sum_f32_RING_SIMPLE" + _NCCL_ARGS,
                "dp_ag": "ncclDevKernel_AllGather_RING_SIMPLE" + _NCCL_ARGS,
                "norm": "ncclDevKernel_AllReduce_Sum_f32_RING_LL" + _NCCL_ARGS,
                "inf": "ncclDevKernel_AllReduce_Max_f32_TREE_LL" + _NCCL_ARGS}
        loads = iter(range(1 << 30))

        def aten(n: int, offset: int) -> None:
            for i in range(n):
                raw, us = aten_us[(offset + 5 * i) % len(aten_us)]
                p.add(raw, us * (1.0 + 0.5 * (i % 3)))  # one ATen name, several shapes

        def layer_fwd(layer: int, moe: bool) -> None:
            kind = "moe" if moe else "dense"
            tails = fwd_tails[kind]
            p.add(tails[0], tail_us[tails[0]])  # rms norm
            p.add(nccl["ag"], 90, _TP)
            p.add(gemms["qkv"][0], gemms["qkv"][3])
            p.add(tails[1], tail_us[tails[1]])  # rotary
            p.add(tails[2], tail_us[tails[2]])
            p.add(flash[0], 1100)
            p.add(gemms["proj"][0], gemms["proj"][3])
            p.add(nccl["rs"], 85, _TP)
            for t in tails[3:6]:
                p.add(t, tail_us[t])  # residual add, dropout, norm
            aten(3, layer)
            p.add(nccl["ag"], 90, _TP)
            if not moe:
                p.add(gemms["fc1"][0], gemms["fc1"][3])
                for t in tails[6:10]:
                    p.add(t, tail_us[t])  # swiglu
                p.add(gemms["fc2"][0], gemms["fc2"][3])
            else:
                load = next(loads)
                p.add(gemms["router"][0], gemms["router"][3])
                for raw, us in zip(_MOE[:7], (25, 18, 30, 8, 12, 4, 9)):
                    p.add(raw, us)
                p.add(_MOE[7], 40, load=load)
                p.add(nccl["a2a"], 260, _EP, load=load)
                for _ in range(cfg.local_experts):
                    p.add(grouped[0][0], grouped[0][1], load=load)
                    for t in tails[6:9]:
                        p.add(t, tail_us[t], load=load)
                    p.add(grouped[1][0], grouped[1][1], load=load)
                p.add(nccl["a2a"], 260, _EP, load=load)
                p.add(_MOE[8], 45, load=load)
                p.add(gemms["shared_fc1"][0], gemms["shared_fc1"][3])
                p.add(gemms["shared_fc2"][0], gemms["shared_fc2"][3])
                for t in tails[9:14]:
                    p.add(t, tail_us[t])
            p.add(nccl["rs"], 85, _TP)
            for t in tails[10 if not moe else 14:]:
                p.add(t, tail_us[t])

        def layer_bwd(layer: int, moe: bool) -> None:
            kind = "moe" if moe else "dense"
            tails = bwd_tails[kind]
            for t in tails[:4]:
                p.add(t, tail_us[t])
            p.add(nccl["ag"], 90, _TP)
            if not moe:
                p.add(gemms["fc2"][1], gemms["fc2"][3])
                p.add(gemms["fc2"][2], gemms["fc2"][3])
                p.add(_splitk_reduce(gemms["fc2"][3]), 6)
                for t in tails[4:10]:
                    p.add(t, tail_us[t])
                p.add(gemms["fc1"][1], gemms["fc1"][3])
                p.add(gemms["fc1"][2], gemms["fc1"][3])
                p.add(_splitk_reduce(gemms["fc1"][3]), 6)
            else:
                load = next(loads)
                p.add(_MOE[7], 40, load=load)
                p.add(nccl["a2a"], 260, _EP, load=load)
                for _ in range(cfg.local_experts):
                    p.add(grouped[2][0], grouped[2][1], load=load)
                    for t in tails[4:8]:
                        p.add(t, tail_us[t], load=load)
                    p.add(grouped[2][0], grouped[2][1] * 0.5, load=load)
                p.add(nccl["a2a"], 260, _EP, load=load)
                p.add(_MOE[8], 45, load=load)
                p.add(gemms["router"][1], gemms["router"][3])
                p.add(gemms["router"][2], gemms["router"][3])
                p.add(_splitk_reduce(gemms["router"][3]), 6)
                for t in tails[8:16]:
                    p.add(t, tail_us[t])
            p.add(nccl["rs"], 85, _TP)
            aten(4, layer + 1)
            p.add(nccl["ag"], 90, _TP)
            p.add(gemms["proj"][1], gemms["proj"][3])
            p.add(gemms["proj"][2], gemms["proj"][3])
            p.add(_splitk_reduce(gemms["proj"][3]), 6)
            for fl, us in zip(flash[1:], (60, 2600, 45)):
                p.add(fl, us)
            p.add(gemms["qkv"][1], gemms["qkv"][3])
            p.add(gemms["qkv"][2], gemms["qkv"][3])
            p.add(_splitk_reduce(gemms["qkv"][3]), 6)
            p.add(nccl["rs"], 85, _TP)
            for t in tails[16 if moe else 10:]:
                p.add(t, tail_us[t])

        moe_layer = [(i + 1) % cfg.moe_every == 0 for i in range(cfg.layers)]
        mb = cfg.microbatches
        warmup = min(cfg.pp_stages - cfg.pp_stage - 1, mb)
        # 1F1B order: warm-up forwards, then alternate one forward and one backward, then cool-down.
        order = [("f", m) for m in range(warmup)]
        f_next, b_next = warmup, 0
        while b_next < mb:
            if f_next < mb:
                order.append(("f", f_next))
                f_next += 1
            order.append(("b", b_next))
            b_next += 1
        for slot, (phase, _m) in enumerate(order):
            # PP: receive the activation (forward) or its gradient (backward), send ours on.
            recv_slot = slot if phase == "f" else len(order) + slot
            p.add(nccl["a2a"], 140, _PP, slot=recv_slot)
            if phase == "f":
                for layer in range(cfg.layers):
                    layer_fwd(layer, moe_layer[layer])
            else:
                for layer in reversed(range(cfg.layers)):
                    if cfg.recompute:
                        layer_fwd(layer, moe_layer[layer])
                    layer_bwd(layer, moe_layer[layer])
            p.add(nccl["a2a"], 140, _PP, slot=-1)  # the send: its peer is ready, no bubble
        # DP: bucketed gradient reduce-scatter (overlapping the last backward), grad norm, optimiser.
        for bucket in range(cfg.dp_buckets):
            p.add(nccl["dp_rs"], 1800, _DP, slot=bucket)
        for raw, us in (("L2NormFunctor<float, (at::native::(anonymous namespace)::NormType)1, float, float>", 9),
                        ("ScaleFunctor<float, float>", 6)):
            for _ in range(cfg.optimizer_chunks):
                p.add(_ADAM.format(n=1, functor=raw, args="float*, int"), us)
        p.add(nccl["norm"], 35, _WORLD)
        p.add(nccl["inf"], 25, _WORLD)
        for i in range(cfg.optimizer_chunks):
            p.add(_ADAM.format(n=4, functor="FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>",
                               args="double*, double, double, double, double, double, double, double*, double*"),
                  140 if i < cfg.optimizer_chunks - 1 else 60)  # the last chunk is partial
        for raw in (_ATEN[0], _ATEN[1]):  # zero_grad
            for _ in range(cfg.optimizer_chunks // 4):
                p.add(raw, 25)
        for bucket in range(cfg.dp_buckets):
            p.add(nccl["dp_ag"], 1500, _DP, slot=cfg.dp_buckets + bucket)

    # -- durations -----------------------------------------------------------------------------
    def generate(self, ranks: int | np.ndarray, steps: int, first_step: int = 0, seed: int | None = None
                 ) -> ProductionKernels:
        """Every launch of ``steps`` steps on ``ranks`` (a count, or the rank ids)."""
        cfg = self.config
        rank_ids = np.arange(ranks) if isinstance(ranks, int) else np.asarray(ranks, np.int64)
        rng = np.random.default_rng(cfg.seed + 1 if seed is None else seed)
        R, S, L = len(rank_ids), steps, self.launches_per_step
        shape = (R, S, L)
        speed = rng.lognormal(0.0, cfg.rank_speed_sigma, size=R)[:, None, None]
        dur = self.base_ns[None, None, :] * rng.lognormal(0.0, cfg.compute_sigma, size=shape)
        # MoE: tokens routed to this rank's experts, per (microbatch, layer): shared by its launches.
        if self.n_loads:
            load = rng.lognormal(0.0, 0.25, size=(R, S, self.n_loads))
            moe = self.load >= 0
            dur[:, :, moe] *= load[:, :, self.load[moe]]
        dur *= np.where(self.wait == _COMPUTE, 1.0, 0.0)[None, None, :] * (speed - 1.0) + 1.0
        dur += self._waits(rng, shape)
        dur = np.maximum(dur, 1_000.0)  # nothing on a GPU is shorter than ~1 µs of launch
        gaps = dur + _LAUNCH_GAP_NS
        ends = np.cumsum(gaps, axis=2)
        step_len = ends[:, :, -1]
        step_start = np.cumsum(step_len.max(axis=0)) - step_len.max(axis=0)
        start = step_start[None, :, None] + ends - gaps
        n = R * S * L
        return ProductionKernels(
            rank=np.repeat(rank_ids, S * L), step=np.tile(np.repeat(np.arange(first_step, first_step + S), L), R),
            stream=np.tile(self.stream, R * S), name_id=np.tile(self.name_id, R * S),
            start_ns=start.reshape(n).astype(np.int64), dur_ns=dur.reshape(n).astype(np.int64), names=self.names)

    def _waits(self, rng: np.random.Generator, shape: tuple[int, int, int]) -> np.ndarray:
        """Waiting inside each collective, by group kind (0 for compute launches)."""
        R, S, L = shape
        w = self.wait
        out = np.zeros(shape)
        base = self.base_ns[None, None, :]
        tp = w == _TP  # intra-host peers: short waits, now and then a host hiccup of ~100 µs
        out[:, :, tp] = rng.exponential(0.2, size=(R, S, int(tp.sum()))) * base[:, :, tp]
        hiccup = rng.random((R, S, int(tp.sum()))) < 0.02
        out[:, :, tp] += hiccup * rng.lognormal(np.log(100_000.0), 0.7, size=hiccup.shape)
        ep = w == _EP  # the most-loaded peer's experts finish last
        out[:, :, ep] = rng.gamma(2.0, 0.4, size=(R, S, int(ep.sum()))) * base[:, :, ep]
        pp = w == _PP  # 1F1B bubble: the first receives of warm-up and cool-down wait a stage's work
        slots = self.slot[pp]
        bubble_ns = 2_000_000.0 * self.config.layers  # ≈ one microbatch through a stage, forward
        bubble = np.where(slots < 0, 0.0, np.where(slots < self.config.pp_stage, (self.config.pp_stage - slots) * bubble_ns,
                                                   np.where(slots >= len(slots) - 1, 2 * bubble_ns, 0.0)))
        out[:, :, pp] = bubble[None, None, :] * rng.lognormal(0.0, 0.1, size=(R, S, int(pp.sum())))
        out[:, :, pp] += rng.exponential(30_000.0, size=(R, S, int(pp.sum())))
        dp = w == _DP  # the step's slowest DP peer: the first bucket waits for it, the rest pipeline
        lag = rng.lognormal(np.log(400_000.0), 1.0, size=(R, S, 1))
        first = (self.slot[dp] == 0) | (self.slot[dp] == self.config.dp_buckets)
        out[:, :, dp] = lag * first[None, None, :] + rng.exponential(60_000.0, size=(R, S, int(dp.sum())))
        world = w == _WORLD  # stragglers anywhere in the world: heavy-tailed, over decades
        out[:, :, world] = rng.lognormal(np.log(1_500_000.0), 1.5, size=(R, S, int(world.sum())))
        return out


def _triton_names(rng: np.random.Generator):
    """Distinct ``torch.compile`` kernel names, as Inductor spells them."""
    i = 0
    while True:
        kind = ("poi", "red", "per")[int(rng.integers(3))]
        ops = sorted(rng.choice(len(_TRITON_OPS), size=int(rng.integers(2, 6)), replace=False))
        yield f"triton_{kind}_fused_{'_'.join(_TRITON_OPS[o] for o in ops)}_{i}"
        i += 1
