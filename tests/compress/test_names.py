import pytest

from argus.compress import categorize_kernel, normalize_kernel_name
from argus.sim.workload import Workload


def test_simulated_kernel_names_normalise_to_their_declared_short_names():
    w = Workload()
    for op in w.compute_ops():
        for k in op.kernels:
            assert normalize_kernel_name(k.name) == k.short
    for op in w.comm_ops():
        assert normalize_kernel_name(op.kernel.name) == op.kernel.short


@pytest.mark.parametrize("raw, short, category, op", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "AllReduce", "comm", "all_reduce"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllReduce", "comm", "all_reduce"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "SendRecv", "comm", "send_recv"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ReduceScatter", "comm",
     "reduce_scatter"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather", "comm", "all_gather"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)", "Broadcast", "comm", "broadcast"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD", "memcpy", ""),
    ("Memset (Device)", "Memset", "memset", ""),
    ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
     "permute_2D_lengths_kernel", "compute", ""),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(x::Params)",
     "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", "compute", ""),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float)",
     "vectorized_layer_norm_kernel", "compute", ""),
    ("ampere_sgemm_128x64_tn", "ampere_sgemm_128x64_tn", "compute", ""),
    ("aten::mm", "aten::mm", "compute", ""),
])
def test_names_collapse_and_categorise(raw, short, category, op):
    assert normalize_kernel_name(raw) == short
    assert categorize_kernel(raw) == (category, op)


def test_kind_decides_for_non_kernels_and_empty_names_are_safe():
    assert categorize_kernel("aten::addmm", "cpu_op") == ("cpu_op", "")
    assert categorize_kernel("whatever", "memcpy") == ("memcpy", "")
    assert normalize_kernel_name("") == "<unnamed>"
    assert normalize_kernel_name("void f<a, b<c>>(int (*)(int))") == "f"
