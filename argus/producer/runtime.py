"""The producer runtime of one process: identity, ring, transport, hooks, sources.

One runtime per process, held by :mod:`argus.producer.api`. Everything here runs inside
someone else's training job, so the rules are: decide once at start, keep the hot path to
a ring write, and on any internal failure log once, disable, and let training continue.

Step boundaries come from the optimizer (its step post-hook), from ``argus.step()``, or — in
loops that update parameters without a ``torch.optim`` optimizer — from the parameters
themselves: a training forward that follows a backward while the model's first trainable
parameter has a new version (``Tensor._version``: every in-place update bumps it, gradient
accumulation does not). Updates through ``.data`` bypass the version counter: such loops
call ``argus.step()``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from argus.producer.activation import TRACED_PID_ENV
from argus.producer.config import Identity, ProducerConfig, default_socket
from argus.producer.recorder import Recorder, now_ns
from argus.topology import Layout, parse_layout
from argus.vocab import GroupKind, PhaseCategory
from argus.wire import GPU_STEP_PHASE, Msg, RingWriter, ring_dir

__all__ = ["Runtime", "ring_capacities"]

log = logging.getLogger("argus.producer")


def ring_capacities(buffer_events: int) -> dict[Msg, int]:
    """Records the ring holds per table: ``buffer_events``, capped so a rank's ring stays
    about 9 MB of shared memory (``/dev/shm`` in a container is often only 64 MB)."""
    return {Msg.STEPS: 8192, Msg.PHASES: max(4096, min(buffer_events, 65536)),
            Msg.KERNELS: max(4096, min(buffer_events, 131072)), Msg.STACKS: 16384, Msg.CHECKS: 1024}


class Runtime:
    def __init__(self, config: ProducerConfig, identity: Identity, layout: Layout):
        self.config = config
        self.identity = identity
        self.layout = layout
        self.pid = os.getpid()
        self.ring = RingWriter.create(ring_dir(), ring_capacities(config.buffer_events), tag=f"r{identity.rank}")
        self.recorder = Recorder(self.ring)
        self.active = False
        self.failed: str | None = None
        self.step = 0
        self.step_start = now_ns()
        self.started = False  # step 0 starts with the first forward or backward, not at init()
        self.fwd_mb = 0
        self.bwd_mb = 0
        self.mb_context = -1
        self.forwards_since_step = 0
        self.backwards_since_step = 0
        self.in_backward = False
        self.explicit_steps = False
        self.optimizer_seen = False
        self.comm_issued = 0  # collectives started on this rank (the tracker counts)
        self._versions: Any = None  # root module → [its first trainable parameter, version at step start]
        self._roots_seen = 0  # roots ever entered in _versions (it forgets those collected)
        self.hooks: Any = None
        self.kernels: Any = None
        self.stacks: Any = None
        self.cuda: Any = None
        self.nccl_timing = False  # TORCH_NCCL_ENABLE_TIMING is on for this job's process groups
        self._gpu_step_mark: Any = None  # the GPU event at the last step's end
        self.transport: Any = None
        self.main_ident = threading.get_ident()  # the training thread: the one that started tracing
        self.main_tid = threading.get_native_id()
        self._activity: list[tuple[int, int]] = []
        self._torch_installed = False
        self._lock = threading.Lock()
        self.sched = SchedClock(self.main_tid)
        self.waited_ns = 0

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        from argus.producer.transport import Transport

        self.active = True
        os.environ[TRACED_PID_ENV] = str(self.pid)  # descendants are not ranks of their own
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        if "torch" in sys.modules:
            self.install_torch()
        from argus.producer.recorder import _OFFSET

        hello = {"run_id": self.identity.run_id, "attempt_id": self.identity.attempt_id, "rank": self.identity.rank,
                 "world_size": self.identity.world_size, "local_rank": self.identity.local_rank,
                 "host": self.identity.host, "pid": self.identity.pid, "layout": str(self.layout),
                 "order": self.layout.order_str, "gpu_uuid": self._gpu_uuid(), "tid": self.main_tid,
                 "clock_offset_ns": _OFFSET, "kernels": getattr(self.kernels, "name", "off")}
        self.transport = Transport(self.ring, default_socket(self.config), hello, self.config.flush_interval_s,
                                   on_control=self.on_control, on_tick=self._tick, other_cpu_ns=self._threads_cpu_ns)
        self.transport.start()
        if self.config.stacks_hz > 0:
            self._start_stacks(self.config.stacks_hz)

    def install_torch(self) -> None:
        """Hook PyTorch (now, or when ``torch`` is first imported)."""
        with self._lock:
            if self._torch_installed or not self.active:
                return
            self._torch_installed = True
        try:
            from argus.producer.kernels import select_source
            from argus.producer.torch_hooks import TorchHooks

            self.hooks = TorchHooks(self)
            self.hooks.install()
            import torch

            if torch.cuda.is_available():
                from argus.producer.cuda_timing import CudaTimer
                from argus.producer.flight_recorder import enable_timing

                # before the job makes its process groups: NCCL's own per-collective timing, read
                # from the Flight Recorder instead of attaching anything to the works
                self.nccl_timing = enable_timing()

                self.cuda = CudaTimer(self._emit_cuda, device=self._device(), dropped=self._dropped_cuda)
                self.cuda.start()
            self.kernels = select_source(self.config.kernels, self.recorder, self.config.op_sample_every)
            self.kernels.on_step(self.step)
            from argus.producer.activation import after_import
            from argus.producer.torch_hooks import hide_from_dynamo

            after_import("torch._dynamo", hide_from_dynamo)  # now if dynamo is loaded, else once it is
        except Exception as exc:  # noqa: BLE001
            self.fail(f"cannot hook PyTorch ({exc})")

    def _after_fork_in_child(self) -> None:
        """A forked child (DataLoader worker, a helper) is not this rank: stop at once, touch
        nothing the parent owns."""
        if os.getpid() == self.pid:
            return
        self.active = False
        self.ring.forget_in_child()
        if self.transport is not None:
            self.transport.forget_in_child()

    def shutdown(self, flush: bool = True) -> None:
        if os.getpid() != self.pid:
            return  # a forked child's inherited exit hook
        if self.active and self.started and (self.forwards_since_step or self.backwards_since_step):
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
        connected = self.transport is not None and self.transport.ever_connected
        self.ring.close(unlink=not connected)  # no processor ever read it: nobody will
        if self.transport is not None and flush:
            self.transport.stop()

    def fail(self, why: str) -> None:
        """Disable the producer after an internal error: one warning, training continues."""
        if self.failed is None:
            self.failed = why
            log.warning("argus: disabled: %s; training continues without tracing", why)
        self.active = False

    def _tick(self) -> None:
        """The transport thread, every ``flush_interval_s``."""
        if self.kernels is not None and self.active:
            self.kernels.flush()

    def _threads_cpu_ns(self) -> int:
        """CPU the producer's background threads other than the transport used (each measures
        its own with ``time.thread_time_ns``)."""
        return sum(int(getattr(part, "cpu_ns", 0)) for part in (self.stacks, self.cuda, self.kernels) if part)

    # -- recording -----------------------------------------------------------------------
    def on_main_thread(self) -> bool:
        return threading.get_ident() == self.main_ident

    def grad_enabled(self) -> bool:
        import torch

        return torch.is_grad_enabled()

    def record_phase(self, start_ns: int, end_ns: int, microbatch: int, name: str, category: str,
                     group: str = "", step: int | None = None) -> None:
        self.recorder.phase(self.step if step is None else step, start_ns, end_ns, microbatch, name, category, group)

    def mark(self) -> Any:
        """A point on the timeline: a CUDA event on GPU; on CPU ``(ns, waited ns so far)``, where
        waited counts what is not this rank's work — the training thread's run-queue delay
        (preempted by other processes) and time blocked waiting for communication."""
        if self.cuda is not None:
            return self.cuda.mark()
        return now_ns(), self.sched.runq_ns() + self.waited_ns

    def record_span(self, m0: Any, m1: Any, microbatch: int, name: str, category: str, group: str = "",
                    step: int | None = None) -> None:
        step = self.step if step is None else step
        if self.cuda is not None:
            self.cuda.phase(m0, m1, (step, microbatch, name, category, group))  # drops a None token
        else:
            wait = m1[1] - m0[1] if category != PhaseCategory.COMM else -1
            self.recorder.phase(step, m0[0], m1[0], microbatch, name, category, group, wait)

    def add_wait(self, m0: Any, m1: Any) -> None:
        """The training thread was blocked waiting for communication between two CPU marks: that
        time is waiting for the phases around it (less what was already counted as run-queue
        delay)."""
        if self.cuda is None and m0 is not None:
            self.waited_ns += max((m1[0] - m0[0]) - (m1[1] - m0[1]), 0)

    def _emit_cuda(self, t0: int, t1: int, meta: tuple) -> None:
        """A span resolved on the GPU clock (the CUDA-event thread): a phase, or a collective's
        own completion (``meta = (callback, launch)``)."""
        if callable(meta[0]):
            meta[0](meta[1], t0, t1)
            return
        step, microbatch, name, category, group = meta
        self.recorder.phase(step, t0, t1, microbatch, name, category, group)

    def _dropped_cuda(self, meta: tuple) -> None:
        """A span the CUDA timer dropped: a collective's completion callback still settles its
        in-flight count (``meta = (callback, launch)``, called with no times)."""
        if callable(meta[0]):
            meta[0](meta[1], None, None)

    # -- what the training thread is doing (the in-flight block) -----------------------------
    def set_activity(self, name_id: int) -> None:
        t = now_ns()
        self._activity.append((name_id, t))
        self.ring.inflight.activity(name_id, t)

    def set_activity_name(self, name: str) -> None:
        self.set_activity(self.recorder.name_id(name))

    def restore_activity(self) -> None:
        if self._activity:
            self._activity.pop()
        name_id, since = self._activity[-1] if self._activity else (-1, now_ns())
        self.ring.inflight.activity(name_id, since)

    # -- the loop's shape ---------------------------------------------------------------------
    def _begin(self) -> None:
        if not self.started:
            self.started = True
            self.step_start = now_ns()

    def forward_starts(self, module: Any) -> None:
        """A training (or eval) forward of a root module begins, outside any backward."""
        self._begin()
        training = self.grad_enabled()
        if training and not self.explicit_steps and not self.optimizer_seen and self._parameters_updated(module):
            self.end_step()  # no optimizer, but the parameters changed since the last forward
        self.mb_context = self.fwd_mb if training else -1
        self.set_activity_name("forward-compute" if training else "forward-eval")

    def collective_starts(self) -> None:
        """A collective begins: in a loop without an optimizer, a step whose parameters were
        updated already ended (the job's last step ends at its closing barrier, not never)."""
        if self.optimizer_seen or self.explicit_steps or not self.backwards_since_step or self._versions is None:
            return
        if any(self._parameters_updated(root) for root in list(self._versions.keys())):
            self.end_step()
        elif self._roots_seen and not len(self._versions):
            # Every model this loop trained is gone (the function that held it returned and the
            # collector freed it): its last step is over, and the closing barrier ends it.
            self.end_step()

    def _parameters_updated(self, root: Any) -> bool:
        """Has ``root``'s first trainable parameter been updated in place since its last forward
        (with a backward in between)?"""
        import weakref

        if self._versions is None:
            self._versions = weakref.WeakKeyDictionary()
        entry = self._versions.get(root)
        if entry is None:
            param = next((p for p in root.parameters() if p.requires_grad), None)
            if param is None:
                return False
            entry = self._versions[root] = [weakref.ref(param), param._version]
            self._roots_seen += 1
            return False
        param = entry[0]()
        if param is None:
            return False
        # against the version the step began with (``_rebase_versions``), not the last one
        # looked at: a look in between can never swallow the update
        return param._version != entry[1] and self.backwards_since_step > 0

    def _rebase_versions(self) -> None:
        """A step ended: the versions its successor's update will be compared with."""
        for entry in list(self._versions.values()) if self._versions is not None else ():
            param = entry[0]()
            if param is not None:
                entry[1] = param._version

    def forward_ends(self, start: Any) -> None:
        training = self.grad_enabled()
        self.record_span(start, self.mark(), self.fwd_mb if training else -1,
                         "forward-compute" if training else "forward-eval", PhaseCategory.COMPUTE)
        if training:
            self.fwd_mb += 1
            self.forwards_since_step += 1
        self.mb_context = -1
        self.restore_activity()

    def backward_starts(self) -> tuple[Any, int]:
        self._begin()
        mb = self.bwd_mb
        self.mb_context = mb
        self.in_backward = True
        self.set_activity_name("backward-compute")
        return self.mark(), mb

    def backward_ends(self, token: tuple[Any, int]) -> None:
        t0, mb = token
        self.in_backward = False
        self.record_span(t0, self.mark(), mb, "backward-compute", PhaseCategory.COMPUTE)
        self.bwd_mb += 1
        self.backwards_since_step += 1
        self.mb_context = -1
        self.restore_activity()

    def optimizer_stepped(self) -> None:
        self.optimizer_seen = True
        self.restore_activity()
        if not self.explicit_steps and (self.forwards_since_step or self.backwards_since_step):
            self.end_step()

    def end_step(self, t: int | None = None) -> None:
        t = now_ns() if t is None else t
        self.recorder.step(self.step, self.step_start, t)
        self.ring.inflight.step_done(self.step, t)
        self.step += 1
        self.step_start = t
        self.fwd_mb = self.bwd_mb = 0
        self.forwards_since_step = self.backwards_since_step = 0
        self._rebase_versions()
        if self.kernels is not None:
            try:
                self.kernels.on_step(self.step)
            except Exception as exc:  # noqa: BLE001
                log.info("argus: kernel source stopped (%s)", exc)
                self.kernels = None
        if self.cuda is not None:
            self._gpu_step_boundary(self.step - 1)
            self.cuda.rebase()

    def _gpu_step_boundary(self, step: int) -> None:
        """An event at the step's end on the current stream: with the previous one, the step's
        interval on the GPU (``GPU_STEP_PHASE``) — where its kernels ran, while the CPU may be
        a step or two ahead. The processor places kernels by it, not by host time."""
        m = self.cuda.mark()
        if self._gpu_step_mark is not None and m is not None:
            self.cuda.phase(self._gpu_step_mark, m, (step, -1, GPU_STEP_PHASE, PhaseCategory.HOST, ""))
        self._gpu_step_mark = m

    # -- process groups ----------------------------------------------------------------------
    def kind_of_group(self, members: list[int], peer: int | None = None) -> str:
        """The layout kind of a group of global ranks (or of a p2p pair); '' if none."""
        rank = self.identity.rank
        if self.identity.world_size == 1:
            return GroupKind.DP
        if peer is not None:  # p2p: the smallest layout group holding both ends
            best, size = "", None
            for kind in _P2P_KINDS:
                g = self.layout.group_of(kind, rank)
                if peer in g and (size is None or len(g) < size):
                    best, size = kind, len(g)
            return best
        wanted = set(members)
        for kind in _MEMBER_KINDS:
            if set(self.layout.group_of(kind, rank).tolist()) == wanted:
                return kind
        return ""

    # -- control from the processor ----------------------------------------------------------
    def on_control(self, doc: dict) -> None:
        if doc.get("stop"):
            log.warning("argus: the processor stopped tracing this process: %s", doc["stop"])
            self.active = False
            return
        fr = doc.get("flight_recorder")
        if isinstance(fr, dict) and isinstance(fr.get("dir"), str):
            from argus.producer.flight_recorder import write_live_dump

            write_live_dump(fr["dir"], self.identity.rank)  # the processor saw this job hang
        hz = (doc.get("stacks") or {}).get("inprocess_hz")
        if hz:
            if self.stacks is None:
                self._start_stacks(float(hz))
            else:
                self.stacks.set_rate(float(hz))

    def _start_stacks(self, hz: float) -> None:
        from argus.producer.stacks import StackSampler

        self.stacks = StackSampler(self.recorder, self, hz, thread_ident=self.main_ident)
        self.stacks.start()

    def _device(self) -> int:
        import torch

        return self.identity.local_rank % max(torch.cuda.device_count(), 1)

    def _gpu_uuid(self) -> str:
        try:
            import torch

            if "torch" in sys.modules and torch.cuda.is_available():
                return f"GPU-{torch.cuda.get_device_properties(self._device()).uuid}"
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


#: Kinds tried for a p2p pair, in order: of two groups of one size, the first found names it.
_P2P_KINDS = (GroupKind.TP, GroupKind.CP, GroupKind.EP, GroupKind.PP, GroupKind.EDP, GroupKind.DP, GroupKind.WORLD)
#: Kinds tried for a group's members, in order: where two kinds' groups coincide (dp and edp
#: when ep = 1), the first names it.
_MEMBER_KINDS = (GroupKind.TP, GroupKind.CP, GroupKind.EP, GroupKind.PP, GroupKind.DP, GroupKind.EDP, GroupKind.WORLD)


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
