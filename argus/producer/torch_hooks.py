"""The semantic channel: hooks into PyTorch that need no change to the model or the loop.

* **forward per microbatch and module phases** — forward hooks on the model's root and on
  modules matching a pattern (``modules.py``; no global hooks);
* **backward per microbatch** — ``torch.autograd.backward`` (what ``Tensor.backward`` calls)
  is wrapped: one call is one microbatch's backward (``backward-compute``);
* **step boundaries** — the global optimizer step hooks (or ``argus.step()``, or, in loops
  without a ``torch.optim`` optimizer, a training forward that follows a backward whose
  gradients were communicated: ``Runtime.forward_starts``); the optimizer's own time is the
  ``optimizer`` phase; ``DataLoader`` iteration is ``dataloader``;
* **collectives and p2p** — at the process group's methods (``collectives.py``);
* **host events** — garbage collection and compilation (``host_events.py``).

Every hook body starts with ``torch.compiler.is_compiling()`` (traced by dynamo, it is an
empty function) and is guarded: an exception disables Argus with one warning, and training
continues with PyTorch's own result.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable

from argus.producer.collectives import CollectiveTracker
from argus.producer.host_events import HostEvents
from argus.producer.gemm_check import GemmSensor
from argus.producer.modules import ForwardTimer, ModuleTree, _something_compiled, guarded_hook
from argus.producer.recorder import now_ns
from argus.producer.replicas import ReplicaSensor
from argus.vocab import PhaseCategory

__all__ = ["TorchHooks"]

log = logging.getLogger("argus.producer")


def hide_from_dynamo(_module: Any = None) -> None:
    """Make dynamo never evaluate a frame of Argus's own: its frame-evaluation callback runs
    for every Python frame while compiled code is active, and a garbage-collector callback or
    a hook that runs then would be a frame dynamo counts and tries to compile (``frames_total``
    changed under Argus). ``skip_code`` skips those frames only — what they call is processed as
    usual — and leaves inlining alone: traced inside a compiled module, a hook is still inlined,
    an empty function."""
    import types

    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # no dynamo, or another version: nothing to hide from
        return
    seen: set = set()

    def walk(code: types.CodeType) -> None:
        if code in seen:
            return
        seen.add(code)
        skip_code(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    for name, module in list(sys.modules.items()):
        if not (name.startswith("argus.producer") or name.startswith("argus.wire")) or module is None:
            continue
        for obj in list(vars(module).values()):
            for fn in ([obj] + [v for v in vars(obj).values()] if isinstance(obj, type) else [obj]):
                fn = getattr(fn, "__func__", fn)
                code = getattr(fn, "__code__", None)
                if isinstance(code, types.CodeType) and getattr(fn, "__module__", "").startswith("argus."):
                    walk(code)


def _is_compiling_fn() -> Callable[[], bool]:
    try:
        from torch.compiler import is_compiling

        return is_compiling
    except ImportError:  # older torch
        return lambda: False


class TorchHooks:
    """Installs and removes the hooks; all state lives on the runtime passed in."""

    def __init__(self, runtime: Any):
        self.rt = runtime
        self.is_compiling = _is_compiling_fn()
        self.handles: list[Any] = []
        self.patches: list[tuple[Any, str, Any]] = []
        self.opt_start: Any = None
        self.collectives = CollectiveTracker(runtime, self.is_compiling)
        self.forward = ForwardTimer(runtime, ModuleTree.install_recorder(), self.is_compiling)
        self.host = HostEvents(runtime)
        self.replicas = ReplicaSensor(runtime.recorder.check, runtime.config.sdc_every)
        self.gemms = GemmSensor(runtime.recorder.check, self.replicas.due, runtime.config.sdc_gemms,
                                _something_compiled)
        self.forward.on_root_call = self._root_call

    # -- install / remove ----------------------------------------------------------------
    def install(self) -> None:
        import torch
        from torch.optim import optimizer as optim

        self.handles.append(optim.register_optimizer_step_pre_hook(self._optimizer_pre))
        self.handles.append(optim.register_optimizer_step_post_hook(self._optimizer_post))
        self._patch(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        try:
            from torch.utils.data import dataloader

            self._patch(dataloader._BaseDataLoaderIter, "__next__",
                        self._wrap_dataloader(dataloader._BaseDataLoaderIter.__next__))
        except (ImportError, AttributeError):
            pass
        self.collectives.install()
        self.host.install()
        self.forward.attach()

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self.patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def uninstall(self) -> None:
        self.forward.detach()
        self.host.uninstall()
        self.collectives.uninstall()
        for h in self.handles:
            h.remove()
        for owner, name, old in reversed(self.patches):
            setattr(owner, name, old)
        self.handles.clear()
        self.patches.clear()

    def _root_call(self, module: Any) -> None:
        """A root module's first forward of a step: DDP's buckets, the GEMM check's arming."""
        self.collectives.maybe_instrument_ddp(module)
        self.gemms.on_forward(module, self.rt.step)

    def _guard(self, exc: BaseException) -> None:
        self.rt.fail(f"a PyTorch hook failed ({type(exc).__name__}: {exc})")

    # -- backward, optimizer, data ----------------------------------------------------------
    def _wrap_backward(self, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            rt = hooks.rt
            if not rt.active or hooks.is_compiling() or rt.in_backward:
                return original(*args, **kwargs)
            try:
                t0 = rt.backward_starts()
                launched = hooks.collectives.buckets_launched
            except Exception as exc:  # noqa: BLE001
                hooks._guard(exc)
                return original(*args, **kwargs)
            try:
                return original(*args, **kwargs)
            finally:
                try:
                    tracker = hooks.collectives
                    if tracker.buckets_launched > launched and rt.cuda is None:
                        # DDP waits at the end of backward for its gradient all-reduce; compute
                        # ended about when the last bucket was launched (run-queue delay in the
                        # tail, e.g. waking up, is counted already)
                        tail = now_ns() - tracker.last_bucket_ns
                        rt.waited_ns += max(tail - (rt.sched.runq_ns() - tracker.last_bucket_runq), 0)
                    rt.backward_ends(t0)
                except Exception as exc:  # noqa: BLE001
                    hooks._guard(exc)

        return backward

    @guarded_hook
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.replicas.grads(self.rt.step, optimizer)  # before the optimizer's span: not its time
        self.opt_start = self.rt.mark()
        self.rt.set_activity_name("optimizer")

    @guarded_hook
    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        rt = self.rt
        t = rt.mark()
        rt.record_span(self.opt_start if self.opt_start is not None else t, t, -1, "optimizer", PhaseCategory.COMPUTE)
        self.opt_start = None
        self.replicas.params(rt.step, optimizer)
        rt.optimizer_stepped()

    def _wrap_dataloader(self, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def __next__(it: Any) -> Any:  # noqa: N807 - it replaces the iterator's own __next__
            rt = hooks.rt
            if not rt.active or hooks.is_compiling() or not rt.on_main_thread():
                return original(it)
            t0 = now_ns()
            try:
                rt.set_activity_name("dataloader")
            except Exception as exc:  # noqa: BLE001
                hooks._guard(exc)
            try:
                return original(it)
            finally:
                try:
                    rt.record_phase(t0, now_ns(), -1, "dataloader", PhaseCategory.HOST)
                    rt.restore_activity()
                except Exception as exc:  # noqa: BLE001
                    hooks._guard(exc)

        return __next__
