"""The simulated model: which compute kernels and collectives one layer, one microbatch and
one step issue, with base costs of an H100-class MoE transformer in bf16.

Kernel names are the long, templated names CUPTI reports, on purpose: the same cuBLAS
kernel serves several GEMMs of different sizes (so one name has a multi-modal duration
distribution) and the importer/compressor must collapse templates to short names.
``short`` is the name the normaliser is expected to produce; ``truth.json`` uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from argus.vocab import GroupKind, PhaseCategory

__all__ = ["KernelSpec", "ComputeOp", "CommOp", "Workload", "STREAMS"]

#: Stream ids per kind of work, as CUDA would number them on one device.
STREAMS = {PhaseCategory.COMPUTE: 7, GroupKind.TP: 21, GroupKind.CP: 23, GroupKind.EP: 25, GroupKind.DP: 29,
           GroupKind.EDP: 29, GroupKind.PP: 33, GroupKind.WORLD: 29, "model_parallel": 29, "embedding": 29}


@dataclass(frozen=True, slots=True)
class KernelSpec:
    name: str  # raw name as reported by CUPTI
    short: str  # normalised short name
    us: float  # base duration, microseconds
    seq_exp: float = 1.0  # cost ∝ (sequence-length factor) ** seq_exp
    sigma: float = 0.02  # lognormal jitter of a single launch
    moe: bool = False  # cost ∝ tokens routed to this rank's experts


@dataclass(frozen=True, slots=True)
class ComputeOp:
    phase: str
    kernels: tuple[KernelSpec, ...]


@dataclass(frozen=True, slots=True)
class CommOp:
    phase: str
    group: str  # group kind
    kernel: KernelSpec  # ``us`` = transfer time inside one host (NVLink)
    inter_host: float = 4.0  # transfer-time factor when the group spans hosts
    moe: bool = False  # transfer ∝ the most-loaded member's routed tokens


_GEMM_A = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
_GEMM_B = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
_GEMM_C = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
_LN_FWD = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
           "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)")
_LN_BWD = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>"
           "(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)")
_FLASH_FWD = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
              "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>"
              "(flash::Flash_fwd_params)")
_FLASH_BWD = ("void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, "
              "false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, false, true, "
              "false, false, false, false, false>(flash::Flash_bwd_params)")
_GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
         "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::"
         "{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl"
         "(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::"
         "operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)")
_GELU_BWD = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl"
             "(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::"
             "operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3> >(int, "
             "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
             "operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, "
             "at::detail::Array<char*, 3>)")
_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)")
_TOPK = ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float, "
         "unsigned int>, unsigned int, unsigned int, bool, unsigned int, unsigned int, at::cuda::detail::TensorInfo"
         "<float, unsigned int>, unsigned int, at::cuda::detail::TensorInfo<long, unsigned int>, unsigned int)")
_GROUPED = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
            "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)")
_XENT = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
         "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)")
_XENT_BWD = ("void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, "
             "at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, long)")
_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
         "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
         "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, double, double*, "
         "double*>(at::native::(anonymous namespace)::TensorListMetadata<4>, ...)")
_L2NORM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
           "TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, "
           "(at::native::(anonymous namespace)::NormType)1, float, float>, float*, int>(...)")
_NCCL_ARGS = "(ncclDevKernelArgsStorage<4096ul>)"
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL" + _NCCL_ARGS
NCCL_ALLREDUCE_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL" + _NCCL_ARGS
NCCL_REDUCESCATTER = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL" + _NCCL_ARGS
NCCL_ALLGATHER = "ncclDevKernel_AllGather_RING_LL" + _NCCL_ARGS
NCCL_SENDRECV = "ncclDevKernel_SendRecv" + _NCCL_ARGS


def _k(name: str, short: str, us: float, seq_exp: float = 1.0, moe: bool = False) -> KernelSpec:
    return KernelSpec(name, short, us, seq_exp, moe=moe)


@dataclass(frozen=True)
class Workload:
    """Costs of one pipeline stage's layers; every ``moe_every``-th layer is MoE when ``ep > 1``."""

    attention_fwd: ComputeOp = ComputeOp("self_attention", (
        _k(_LN_FWD, "vectorized_layer_norm_kernel", 60),
        _k(_GEMM_A, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 480),
        _k(_FLASH_FWD, "flash_fwd_kernel", 900, seq_exp=2.0),
        _k(_GEMM_C, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 240),
        _k(_ADD, "vectorized_elementwise_kernel", 40),
    ))
    attention_bwd: ComputeOp = ComputeOp("self_attention-bwd", (
        _k(_ADD, "vectorized_elementwise_kernel", 40),
        _k(_GEMM_B, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n", 240),
        _k(_GEMM_C, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 240),
        _k(_FLASH_BWD, "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", 2200, seq_exp=2.0),
        _k(_GEMM_B, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n", 480),
        _k(_GEMM_C, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 480),
        _k(_LN_BWD, "layer_norm_grad_input_kernel_vectorized", 120),
    ))
    mlp_fwd: ComputeOp = ComputeOp("mlp", (
        _k(_LN_FWD, "vectorized_layer_norm_kernel", 60),
        _k(_GEMM_A, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 960),
        _k(_GELU, "vectorized_elementwise_kernel", 90),
        _k(_GEMM_A, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 960),
    ))
    mlp_bwd: ComputeOp = ComputeOp("mlp-bwd", (
        _k(_GEMM_B, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n", 960),
        _k(_GEMM_C, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 960),
        _k(_GELU_BWD, "vectorized_elementwise_kernel", 150),
        _k(_GEMM_B, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n", 960),
        _k(_GEMM_C, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 960),
        _k(_LN_BWD, "layer_norm_grad_input_kernel_vectorized", 120),
    ))
    router_fwd: ComputeOp = ComputeOp("moe_router", (
        _k(_GEMM_C, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n", 45),
        _k(_TOPK, "gatherTopK", 35),
    ))
    router_bwd: ComputeOp = ComputeOp("moe_router-bwd", (
        _k(_GEMM_B, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n", 60),
    ))
    experts_fwd: ComputeOp = ComputeOp("moe_experts", (
        _k(_GROUPED, "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", 700, moe=True),
        _k(_GELU, "vectorized_elementwise_kernel", 70, moe=True),
        _k(_GROUPED, "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", 700, moe=True),
    ))
    experts_bwd: ComputeOp = ComputeOp("moe_experts-bwd", (
        _k(_GROUPED, "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", 1400, moe=True),
        _k(_GELU_BWD, "vectorized_elementwise_kernel", 120, moe=True),
        _k(_GROUPED, "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", 1400, moe=True),
    ))
    loss_fwd: ComputeOp = ComputeOp("loss", (_k(_GEMM_A, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1500),
                                            _k(_XENT, "cunn_SoftMaxForward", 400)))
    loss_bwd: ComputeOp = ComputeOp("loss-bwd", (_k(_XENT_BWD, "cunn_SoftMaxBackward", 400),
                                                _k(_GEMM_B, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n", 3000)))
    optimizer: ComputeOp = ComputeOp("optimizer", (_k(_L2NORM, "multi_tensor_apply_kernel", 300, seq_exp=0),
                                                  _k(_ADAM, "multi_tensor_apply_kernel", 9000, seq_exp=0)))
    tp_allreduce: CommOp = CommOp("tp-allreduce", GroupKind.TP, _k(NCCL_ALLREDUCE, "AllReduce", 260), inter_host=6.0)
    ep_alltoall: CommOp = CommOp("ep-alltoall", GroupKind.EP, _k(NCCL_SENDRECV, "SendRecv", 420), inter_host=3.0, moe=True)
    # context parallelism (Megatron's ring attention, ``cp_comm_type="p2p"``): each attention
    # passes its key/value chunk (forward) or their gradients (backward) around the cp ring,
    # cp - 1 exchanges a layer; an exchange waits for the ring's slowest member
    cp_ring: CommOp = CommOp("cp-ring-sendrecv", GroupKind.CP, _k(NCCL_SENDRECV, "SendRecv", 180), inter_host=3.0)
    pp_p2p: CommOp = CommOp("pp-send", GroupKind.PP, _k(NCCL_SENDRECV, "SendRecv", 250), inter_host=2.5)
    dp_reduce_scatter: CommOp = CommOp("dp-reduce-scatter", GroupKind.DP, _k(NCCL_REDUCESCATTER, "ReduceScatter", 9000, seq_exp=0),
                                       inter_host=2.5)
    dp_allgather: CommOp = CommOp("dp-allgather", GroupKind.DP, _k(NCCL_ALLGATHER, "AllGather", 7000, seq_exp=0), inter_host=2.5)
    grad_norm: CommOp = CommOp("grad-norm-allreduce", GroupKind.WORLD, _k(NCCL_ALLREDUCE_F32, "AllReduce", 40, seq_exp=0),
                               inter_host=2.0)
    # Megatron's groups (``SimConfig.megatron_groups``): the grad norm over MODEL_PARALLEL (tp × pp),
    # the tied embedding's gradients over EMBEDDING (the first and the last stage)
    grad_norm_mp: CommOp = CommOp("grad-norm-allreduce", "model_parallel",
                                  _k(NCCL_ALLREDUCE_F32, "AllReduce", 40, seq_exp=0), inter_host=2.0)
    embedding_allreduce: CommOp = CommOp("embedding-allreduce", "embedding",
                                         _k(NCCL_ALLREDUCE, "AllReduce", 900, seq_exp=0), inter_host=2.5)
    barrier: CommOp = CommOp("barrier", GroupKind.WORLD, _k(NCCL_ALLREDUCE_F32, "AllReduce", 20, seq_exp=0), inter_host=2.0)
    launch_gap_us: float = 3.0  # GPU idle between back-to-back kernels when the host keeps ahead
    dataloader_ms: float = 1.5
    checkpoint_s: float = 4.0
    moe_every: int = 2  # every n-th layer (1-based) is MoE when ep > 1

    def compute_ops(self) -> tuple[ComputeOp, ...]:
        return (self.attention_fwd, self.attention_bwd, self.mlp_fwd, self.mlp_bwd, self.router_fwd,
                self.router_bwd, self.experts_fwd, self.experts_bwd, self.loss_fwd, self.loss_bwd, self.optimizer)

    def comm_ops(self) -> tuple[CommOp, ...]:
        return (self.tp_allreduce, self.ep_alltoall, self.cp_ring, self.pp_p2p, self.dp_reduce_scatter, self.dp_allgather,
                self.grad_norm, self.grad_norm_mp, self.embedding_allreduce, self.barrier)

    def is_moe(self, layer: int, ep: int) -> bool:
        return ep > 1 and (layer + 1) % self.moe_every == 0
