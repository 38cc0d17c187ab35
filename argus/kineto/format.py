"""The parts of the Kineto Chrome-trace format the importer reads and the exporter writes.

Kineto (PyTorch Profiler) writes ``{"traceEvents": [...], "distributedInfo": {...}, ...}``: complete
events (``ph: "X"``) with ``ts``/``dur`` in µs, a ``cat`` saying what they are, and ``args``. Older
traces spell the categories differently (``Kernel``, ``Runtime``) or leave ``cat`` out; the tables
below map every spelling seen to one code so the per-event loop does a single dict lookup.

Argus adds one thing of its own: an ``args["argus"]`` object on exported annotations (the phase's
exact name, category, group, microbatch, and whether it never finished) so that a store survives
export → import unchanged. Other consumers ignore unknown args.
"""

from __future__ import annotations

__all__ = ["ARGUS_ARG", "Cat", "CATEGORIES", "KIND_NAMES", "KIND_CODES", "KERNEL_CATEGORY", "LAUNCH"]

#: Key of the Argus metadata object in an event's ``args``.
ARGUS_ARG = "argus"


class Cat:
    """Event classes the importer distinguishes (small ints for a fast dispatch)."""

    OTHER = 0
    KERNEL = 1
    MEMCPY = 2
    MEMSET = 3
    RUNTIME = 4  # cudaLaunchKernel & co. (CPU side of a launch; carries ``correlation``)
    CPU_ANNOTATION = 5  # record_function on the CPU timeline
    GPU_ANNOTATION = 6  # the same range measured on the device
    CPU_OP = 7


#: ``cat`` spellings → class. Unknown categories (``python_function``, ``ac2g``, ``Trace``…) are OTHER.
CATEGORIES: dict[str, int] = {
    "kernel": Cat.KERNEL, "Kernel": Cat.KERNEL,
    "gpu_memcpy": Cat.MEMCPY, "Memcpy": Cat.MEMCPY, "memcpy": Cat.MEMCPY,
    "gpu_memset": Cat.MEMSET, "Memset": Cat.MEMSET, "memset": Cat.MEMSET,
    "cuda_runtime": Cat.RUNTIME, "Runtime": Cat.RUNTIME, "runtime": Cat.RUNTIME, "cuda_driver": Cat.RUNTIME,
    "user_annotation": Cat.CPU_ANNOTATION, "User Annotation": Cat.CPU_ANNOTATION,
    "gpu_user_annotation": Cat.GPU_ANNOTATION, "GPU User Annotation": Cat.GPU_ANNOTATION,
    "cpu_op": Cat.CPU_OP, "Operator": Cat.CPU_OP, "operator": Cat.CPU_OP,
}

#: ``kernels.kind`` values, indexed by the importer's kind code.
KIND_NAMES: tuple[str, ...] = ("kernel", "memcpy", "memset", "cpu_op")
KIND_CODES: dict[str, int] = {k: i for i, k in enumerate(KIND_NAMES)}

#: Kineto category the exporter writes for each device kind.
KERNEL_CATEGORY = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}

#: CPU-side launch the exporter writes for each device kind: (runtime call name, CUPTI callback id).
LAUNCH = {"kernel": ("cudaLaunchKernel", 211), "memcpy": ("cudaMemcpyAsync", 41), "memset": ("cudaMemsetAsync", 51)}
