"""Kernel names: collapse long templated names to stable short ones, and categorise them.

CUPTI and Kineto report names like ``void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128,
…>, false, true>(flash::Flash_fwd_params)`` or
``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)`` — or, where the
producer could not demangle them, mangled (``_Z28ncclDevKernel_AllReduce_Sum_f32_RING_LLP24…``:
the function's identifier is read out of the mangling, enough to name and classify it). Comparing ranks
needs one short, stable name per kernel (``flash_fwd_kernel``, ``AllReduce``) and a category:
compute, communication (with its op type), memcpy, memset or CPU op. Results are cached: a job
has a few hundred distinct names, seen millions of times.
"""

from __future__ import annotations

import re
from functools import lru_cache

from argus.vocab import kernel_in_group, split_kernel_group

__all__ = ["normalize_kernel_name", "categorize_kernel", "mangled_base", "COMM_OPS"]

#: NCCL kernel function → communication op type.
COMM_OPS = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "AllToAll": "all_to_all",
    "AlltoAll": "all_to_all",
    "SendRecv": "send_recv",
    "Send": "send_recv",
    "Recv": "send_recv",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
}
_NCCL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_GENERIC_WRAPPERS = {"Kernel", "Kernel2", "device_kernel", "kernel", "cutlass_kernel"}
_CUBLAS_TAIL = re.compile(r"_(?:tilesize|warpgroupsize|execute_|cga\d|stages_|splitK).*$")


_MANGLED_ID = re.compile(r"(\d+)")


def mangled_base(raw: str) -> str | None:
    """The function's own identifier in an Itanium-mangled name (``_ZN5flash15flash_fwd_kernelI…``
    → ``flash_fwd_kernel``), or None if it does not parse."""
    if not raw.startswith("_Z"):
        return None
    i = 2
    if raw[i:i + 1] == "L":
        i += 1
    if raw[i:i + 1] == "N":
        i += 1
        while raw[i:i + 1] in ("r", "V", "K"):
            i += 1
    if raw[i:i + 2] == "St":
        i += 2
    last = None
    while i < len(raw):
        m = _MANGLED_ID.match(raw, i)
        if not m:
            break
        n = int(m.group(1))
        start = m.end()
        if n <= 0 or start + n > len(raw):
            break
        last = raw[start:start + n]
        i = start + n
    return last


def _strip_brackets(text: str, open_: str, close: str) -> str:
    """Remove every (possibly nested) ``open_ … close`` span."""
    out, depth = [], 0
    for ch in text:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _first_template_arg(text: str) -> str | None:
    start = text.find("<")
    if start < 0:
        return None
    depth, arg = 0, []
    for ch in text[start + 1:]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        arg.append(ch)
    name = _strip_brackets("".join(arg), "<", ">").strip()
    return name.split("::")[-1].strip() or None


@lru_cache(maxsize=65536)
def normalize_kernel_name(name: str) -> str:
    """Stable short name: templates and argument lists collapsed, namespaces dropped (a
    collective's communicator tag, ``vocab.kernel_in_group``, kept)."""
    base, group = split_kernel_group(str(name))
    if group is not None:
        return kernel_in_group(normalize_kernel_name(base), group)
    raw = " ".join(str(name).split())
    if not raw:
        return "<unnamed>"
    raw = mangled_base(raw) or raw
    m = _NCCL.match(raw)
    if m:
        func = m.group(1)
        for op in COMM_OPS:  # ncclKernel_AllReduce_RING_LL_Sum_float → AllReduce
            if func.startswith(op) and (len(func) == len(op) or not func[len(op)].islower()):
                return op
        return func
    if raw.lower().startswith(("memcpy", "memset")):  # "Memcpy HtoD (Pageable -> Device)"
        return " ".join(_strip_brackets(raw, "(", ")").split())
    if not any(c in raw for c in "<( "):  # already short: "aten::mm", "ampere_sgemm_128x64_tn"
        return _CUBLAS_TAIL.sub("", raw)
    text = raw.replace("(anonymous namespace)", "anon")
    if text.startswith("void "):
        text = text[5:]
    head = _strip_brackets(text, "(", ")")
    base = _strip_brackets(head, "<", ">").strip().split("::")[-1].strip()
    base = base.split()[-1] if base else base
    if base in _GENERIC_WRAPPERS:  # cutlass::Kernel2<cutlass_80_tensorop_…> → the template argument
        base = _first_template_arg(head) or base
    base = _CUBLAS_TAIL.sub("", base)
    return base or raw[:64]


@lru_cache(maxsize=65536)
def categorize_kernel(name: str, kind: str = "kernel") -> tuple[str, str]:
    """``(category, op)``: category is ``compute``, ``comm``, ``memcpy``, ``memset`` or
    ``cpu_op``; ``op`` is the communication op type for ``comm``, else empty."""
    if kind in ("memcpy", "memset", "cpu_op"):
        return kind, ""
    raw = split_kernel_group(str(name))[0]
    raw = mangled_base(raw) or raw
    low = raw.lower()
    if low.startswith("memcpy"):
        return "memcpy", ""
    if low.startswith("memset"):
        return "memset", ""
    if low.startswith("nccl"):
        short = normalize_kernel_name(raw)
        return "comm", COMM_OPS.get(short, short.lower())
    return "compute", ""
