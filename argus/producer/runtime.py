"""The producer runtime of one process: identity, recorder, transport, hooks, sources.

One runtime per process, held by :mod:`argus.producer.api`. Everything here runs inside
someone else's training job, so the rules are: decide once at start, keep the hot path to
an append, and on any internal failure log once, disable, and let training continue.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from argus.producer.config import Identity, ProducerConfig, default_socket
from argus.producer.recorder import Recorder, now_ns
from argus.topology import Layout, parse_layout

__all__ = ["Runtime"]

log = logging.getLogger("argus.producer")


class Runtime:
    def __init__(self, config: ProducerConfig, identity: Identity, layout: Layout):
        self.config = config
        self.identity = identity
        self.layout = layout
        self.recorder = Recorder(capacity=config.buffer_events)
        self.active = False
        self.failed: str | None = None
        self.step = 0
        self.step_start = now_ns()
        self.fwd_mb = 0
        self.bwd_mb = 0
        self.mb_context = -1
        self.forwards_since_step = 0
        self.explicit_steps = False
        self.started = False
        self.hooks: Any = None
        self.kernels: Any = None
        self.stacks: Any = None
        self.cuda: Any = None
        self.transport: Any = None
        self._torch_installed = False
        self._lock = threading.Lock()
        self.sched = SchedClock()
        self.waited_ns = 0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        from argus.producer.transport import Transport

        hello = {"run_id": self.identity.run_id, "attempt_id": self.identity.attempt_id, "rank": self.identity.rank,
                 "world_size": self.identity.world_size, "local_rank": self.identity.local_rank,
                 "host": self.identity.host, "pid": self.identity.pid, "layout": str(self.layout),
                 "order": self.layout.order_str, "gpu_uuid": self._gpu_uuid()}
        self.transport = Transport(self.recorder, default_socket(self.config), hello, self.config.flush_interval_s,
                                   on_control=self.on_control)
        self.active = True
        self.transport.start()
        if self.config.stacks_hz > 0:
            self._start_stacks(self.config.stacks_hz)
        if "torch" in sys.modules:
            self.install_torch()

    def install_torch(self) -> None:
        """Hook PyTorch (now, or when ``torch`` is first imported under ``argus run``)."""
        with self._lock:
            if self._torch_installed or not self.active:
                return
            self._torch_installed = True
        try:
            from argus.producer.kernels import select_source
            from argus.producer.torch_hooks import TorchHooks

            self.hooks = TorchHooks(self)
            self.hooks.install()
            self.kernels = select_source(self.config.kernels, self.recorder, self.config.op_sample_every)
            self.kernels.on_step(self.step)
            import torch

            if torch.cuda.is_available():
                from argus.producer.cuda_timing import CudaTimer

                self.cuda = CudaTimer(self._emit_cuda)
                self.cuda.start()
        except Exception as exc:  # noqa: BLE001
            self.fail(f"cannot hook PyTorch ({exc})")

    def shutdown(self, flush: bool = True) -> None:
        if self.step_start and self.forwards_since_step and self.active:
            self.recorder.step(self.step, self.step_start, now_ns())
        self.active = False
        for part in (self.kernels, self.stacks, self.cuda):
            if part is not None:
                try:
                    part.stop()
                except Exception:  # noqa: BLE001
                    pass
        if self.hooks is not None:
            try:
                self.hooks.uninstall()
            except Exception:  # noqa: BLE001
                pass
        if self.transport is not None:
            self.transport.stop() if flush else None

    def fail(self, why: str) -> None:
        """Disable the producer after an internal error: one warning, training continues."""
        if self.failed is None:
            self.failed = why
            log.warning("argus: disabled: %s; training continues without tracing", why)
        self.active = False

    # -- recording -----------------------------------------------------------------------
    def grad_enabled(self) -> bool:
        import torch

        return torch.is_grad_enabled()

    def record_phase(self, start_ns: int, end_ns: int, microbatch: int, name: str, category: str,
                     group: str = "", step: int | None = None) -> None:
        self.recorder.phase(self.step if step is None else step, start_ns, end_ns, microbatch, name, category, group)

    def mark(self) -> Any:
        """A point on the timeline: a CUDA event on GPU; on CPU ``(ns, waited ns so far)``, where
        waited counts what is not this rank's work — the training thread's run-queue delay
        (preempted by other processes) and time blocked in synchronous communication."""
        if self.cuda is not None:
            return self.cuda.mark()
        return now_ns(), self.sched.runq_ns() + self.waited_ns

    def record_span(self, m0: Any, m1: Any, microbatch: int, name: str, category: str, group: str = "",
                    step: int | None = None) -> None:
        step = self.step if step is None else step
        if self.cuda is not None:
            self.cuda.phase(m0, m1, (step, microbatch, name, category, group))
        else:
            wait = m1[1] - m0[1] if category != "comm" else -1
            self.recorder.phase(step, m0[0], m1[0], microbatch, name, category, group, wait)

    def add_wait(self, m0: Any, m1: Any) -> None:
        """A synchronous collective between two CPU marks: its time is waiting for the phases
        around it (less what was already counted as run-queue delay)."""
        if self.cuda is None:
            self.waited_ns += max((m1[0] - m0[0]) - (m1[1] - m0[1]), 0)

    def _emit_cuda(self, t0: int, t1: int, meta: tuple) -> None:
        step, microbatch, name, category, group = meta
        self.recorder.phase(step, t0, t1, microbatch, name, category, group)

    def end_step(self, t: int | None = None) -> None:
        t = now_ns() if t is None else t
        self.recorder.step(self.step, self.step_start, t)
        if self.hooks is not None:
            self.hooks.settle(self.forwards_since_step)
        self.step += 1
        self.step_start = t
        self.fwd_mb = self.bwd_mb = 0
        self.forwards_since_step = 0
        if self.hooks is not None:
            self.hooks.depth = 0
        if self.kernels is not None:
            try:
                self.kernels.on_step(self.step)
            except Exception as exc:  # noqa: BLE001
                log.info("argus: kernel source stopped (%s)", exc)
                self.kernels = None
        if self.cuda is not None:
            self.cuda.rebase()

    # -- process groups ----------------------------------------------------------------------
    def kind_of_group(self, group: Any, peer: int | None = None) -> str:
        """Map a process group (or a p2p pair) to its layout kind; '' if it is none of them."""
        import torch.distributed as dist

        rank = self.identity.rank
        try:
            members = set(dist.get_process_group_ranks(group)) if group is not None else set(
                range(dist.get_world_size()))
        except Exception:  # noqa: BLE001 - not initialised yet
            members = set(range(self.identity.world_size))
        if self.identity.world_size == 1:
            return "dp"
        if peer is not None:  # p2p: the smallest layout group holding both ends
            best, size = "", None
            for kind in ("tp", "cp", "ep", "pp", "edp", "dp", "world"):
                g = self.layout.group_of(kind, rank)
                if peer in g and (size is None or len(g) < size):
                    best, size = kind, len(g)
            return best
        for kind in ("tp", "cp", "ep", "pp", "dp", "edp", "world"):
            if set(self.layout.group_of(kind, rank).tolist()) == members:
                return kind
        return ""

    # -- control from the processor ----------------------------------------------------------
    def on_control(self, doc: dict) -> None:
        hz = (doc.get("stacks") or {}).get("inprocess_hz")
        if hz:
            if self.stacks is None:
                self._start_stacks(float(hz))
            else:
                self.stacks.set_rate(float(hz))

    def _start_stacks(self, hz: float) -> None:
        from argus.producer.stacks import StackSampler

        self.stacks = StackSampler(self.recorder, self, hz)
        self.stacks.start()

    def _gpu_uuid(self) -> str:
        try:
            import torch

            if "torch" in sys.modules and torch.cuda.is_available():
                props = torch.cuda.get_device_properties(self.identity.local_rank % torch.cuda.device_count())
                return f"GPU-{props.uuid}"
        except Exception:  # noqa: BLE001
            pass
        return f"cpu-{self.identity.host}-{self.identity.local_rank}"


class SchedClock:
    """The training thread's run-queue delay (``/proc/<pid>/task/<tid>/schedstat``, field 2):
    time it was runnable but another process had the CPU. ~0.5 µs a read (``pread`` on an
    open descriptor); 0 where the file does not exist (non-Linux)."""

    def __init__(self, tid: int | None = None):
        self.fd = -1
        try:
            tid = tid or threading.main_thread().native_id
            self.fd = os.open(f"/proc/{os.getpid()}/task/{tid}/schedstat", os.O_RDONLY)
        except (OSError, TypeError):
            self.fd = -1

    def runq_ns(self) -> int:
        if self.fd < 0:
            return 0
        try:
            return int(os.pread(self.fd, 96, 0).split()[1])
        except (OSError, ValueError, IndexError):
            self.fd = -1
            return 0


#: Megatron-LM's names for the layout sizes (command-line flags and config keys).
MEGATRON_KEYS = {"tp": ("tensor_model_parallel_size", "tensor-model-parallel-size"),
                 "pp": ("pipeline_model_parallel_size", "pipeline-model-parallel-size"),
                 "cp": ("context_parallel_size", "context-parallel-size"),
                 "ep": ("expert_model_parallel_size", "expert-model-parallel-size")}


def make_layout(config: ProducerConfig, world_size: int, argv: list[str] | None = None) -> Layout:
    """The parallel layout: the option / ``ARGUS_LAYOUT`` (``"pp=2,dp=4"``, or
    ``"megatron:config.json"``), else Megatron-LM flags on this process's command line
    (``--tensor-model-parallel-size 2`` …), else pure data parallel."""
    text = config.layout or ""
    order = config.order or None
    if text.startswith("megatron:"):
        return parse_layout(megatron_sizes(_read_config(text[len("megatron:"):])), world_size, order)
    if not text:
        found = megatron_sizes(_argv_options(sys.argv if argv is None else argv))
        if found:
            return parse_layout(found, world_size, order)
    return parse_layout(text, world_size=world_size, order=order)


def megatron_sizes(options: dict[str, Any]) -> dict[str, int]:
    """Layout sizes from Megatron-LM options (missing ones are 1; dp is derived)."""
    out = {}
    for axis, names in MEGATRON_KEYS.items():
        for name in names:
            if name in options and options[name] not in (None, ""):
                out[axis] = int(options[name])
    return out


def _argv_options(argv: list[str]) -> dict[str, str]:
    opts = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if eq:
                opts[key] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                opts[key] = argv[i + 1]
    return opts


def _read_config(path: str) -> dict[str, Any]:
    """A Megatron-style config: JSON, or flat ``key: value`` YAML."""
    from argus.errors import ConfigError

    try:
        text = open(path).read()
    except OSError as exc:
        raise ConfigError(f"cannot read the Megatron config {path}: {exc}") from None
    import json

    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else {}
    except ValueError:
        pass
    out = {}
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition(":")
        if sep and key.strip() and not line.startswith((" ", "\t")):
            out[key.strip()] = value.strip().strip("'\"")
    return out
