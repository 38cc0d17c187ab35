"""The semantic channel: hooks into PyTorch that need no change to the model or the loop.

* **forward per microbatch** — global module forward pre/post hooks track call depth; a
  depth-0 module call is one microbatch's forward (``forward-compute``); modules whose class
  name matches a pattern (attention, mlp, moe/experts) become module phases;
* **backward per microbatch** — ``torch.autograd.backward`` (what ``Tensor.backward`` calls)
  is wrapped: one call is one microbatch's backward (``backward-compute``);
* **step boundaries** — the global optimizer step post-hook (or ``argus.step()``); the
  optimizer's own time is the ``optimizer`` phase; ``DataLoader`` iteration is ``dataloader``;
* **collectives and p2p** — every ``torch.distributed`` call is wrapped at the API and named
  ``<group kind>-<op>`` (``dp-allreduce``, ``pp-send``…), the process group mapped to its kind
  through the layout; asynchronous ops end when their future completes;
* **DDP gradient communication** — a timing comm hook around the default all-reduce (or
  around the user's own hook, whenever it is registered): ``dp-allreduce`` per bucket.

Timing on CPU is the monotonic clock; on GPU each phase records CUDA events on the current
stream and a background thread resolves them (``cuda_timing.py``): the training thread never
synchronises. Every hook body is guarded: an exception disables Argus with one warning and
training continues.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from typing import Any, Callable

from argus.producer.recorder import now_ns

__all__ = ["TorchHooks", "COLLECTIVE_OPS"]

log = logging.getLogger("argus.producer")

#: torch.distributed function → op name in phase names
COLLECTIVE_OPS = {
    "all_reduce": "allreduce", "all_gather": "allgather", "all_gather_into_tensor": "allgather",
    "reduce_scatter": "reduce-scatter", "reduce_scatter_tensor": "reduce-scatter", "all_to_all": "alltoall",
    "all_to_all_single": "alltoall", "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
    "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv", "isend": "send", "irecv": "recv",
}
_P2P = {"send", "recv", "isend", "irecv"}


class _State(threading.local):
    def __init__(self) -> None:
        self.suppress = False  # inside one of our own collective calls (DDP hook → all_reduce)


class TorchHooks:
    """Installs and removes the hooks; all state lives on the runtime passed in."""

    def __init__(self, runtime: Any):
        self.rt = runtime
        self.handles: list[Any] = []
        self.patches: list[tuple[Any, str, Any]] = []
        self.local = _State()
        self.depth = 0
        self.top_start = 0
        self.module_stack: list[tuple[int, str, int, Any]] = []
        self.active_phases: set[str] = set()
        self.phase_of_class: dict[type, str | None] = {}
        self.instrumented_ddp: set[int] = set()
        self.group_kinds: dict[int, str] = {}
        self.opt_start: Any = None
        self.discovering = False
        self.global_handles: list[Any] = []
        self.module_handles: list[Any] = []
        self.top_modules: Any = weakref.WeakSet()  # seen at depth 0 while discovering
        self.phase_modules: Any = weakref.WeakSet()  # matched a module pattern while discovering
        self.buckets_launched = 0  # DDP gradient buckets handed to all-reduce so far …
        self.last_bucket_ns = 0  # … and when the last one was
        self.last_bucket_runq = 0
        self._ddp_register: Callable | None = None

    # -- install / remove ----------------------------------------------------------------
    def install(self) -> None:
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self._discover()
        self.handles.append(optim.register_optimizer_step_pre_hook(self._optimizer_pre))
        self.handles.append(optim.register_optimizer_step_post_hook(self._optimizer_post))
        self._patch(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        try:
            from torch.utils.data import dataloader

            self._patch(dataloader._BaseDataLoaderIter, "__next__",
                        self._wrap_dataloader(dataloader._BaseDataLoaderIter.__next__))
        except (ImportError, AttributeError):
            pass
        self._install_distributed()

    # -- module hooks: discover with global hooks, then hook only the modules that matter ------
    def _discover(self) -> None:
        """Global module hooks see every module call — and push every call in the model onto
        nn.Module's slow path (≈ 7% of a small model's step). They run only until a step has
        been seen; then the top-level modules and the pattern-matched ones get their own hooks."""
        from torch.nn.modules import module as nn_module

        self.discovering = True
        self.global_handles = [nn_module.register_module_forward_pre_hook(self._forward_pre),
                               nn_module.register_module_forward_hook(self._forward_post)]

    def settle(self, forwards_in_step: int) -> None:
        """At a step boundary: leave discovery once a step had forwards; go back to it when a
        step had none (a new model, say) while modules are hooked one by one."""
        if self.discovering:
            if forwards_in_step == 0 or not self.top_modules:
                return
            for h in self.global_handles:
                h.remove()
            self.global_handles = []
            for m in list(self.top_modules) + list(self.phase_modules):
                self.module_handles += [m.register_forward_pre_hook(self._forward_pre),
                                        m.register_forward_hook(self._forward_post)]
            self.discovering = False
        elif forwards_in_step == 0 and self.rt.bwd_mb > 0:
            for h in self.module_handles:
                h.remove()
            self.module_handles = []
            self._discover()

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        self.patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, new)

    def uninstall(self) -> None:
        for h in self.handles + self.global_handles + self.module_handles:
            h.remove()
        self.global_handles, self.module_handles = [], []
        for owner, name, old in reversed(self.patches):
            setattr(owner, name, old)
        self.handles.clear()
        self.patches.clear()

    # -- guards ------------------------------------------------------------------------
    def _guard(self, exc: BaseException) -> None:
        self.rt.fail(f"a PyTorch hook failed ({type(exc).__name__}: {exc})")

    # -- forward ---------------------------------------------------------------------------
    def _phase_for(self, cls: type) -> str | None:
        found = self.phase_of_class.get(cls, "?")
        if found == "?":
            low = cls.__name__.lower()
            found = None
            for phase, words in self.rt.config.module_patterns.items():
                if any(w in low for w in words):
                    found = phase
                    break
            self.phase_of_class[cls] = found
        return found

    def _forward_pre(self, module: Any, args: Any) -> None:
        rt = self.rt
        if not rt.active:
            return
        try:
            if self.depth == 0:
                if rt.step == 0 and rt.forwards_since_step == 0 and not rt.started:
                    rt.started = True
                    rt.step_start = now_ns()  # step 0 starts with its first forward, not at init()
                self.top_start = rt.mark()
                rt.mb_context = rt.fwd_mb if rt.grad_enabled() else -1
                if id(module) not in self.instrumented_ddp:
                    self._maybe_instrument_ddp(module)
                if self.discovering:
                    self.top_modules.add(module)
            self.depth += 1
            phase = self._phase_for(type(module))
            if phase is not None and self.discovering:
                self.phase_modules.add(module)
            if phase is not None and phase not in self.active_phases:
                self.active_phases.add(phase)
                self.module_stack.append((id(module), phase, rt.mark(), module))
        except Exception as exc:  # noqa: BLE001 - never raise into the model
            self._guard(exc)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        rt = self.rt
        if not rt.active:
            return
        try:
            self.depth = max(self.depth - 1, 0)
            mine = bool(self.module_stack) and self.module_stack[-1][0] == id(module)
            if not mine and self.depth:
                return  # an inner module without a phase: nothing to time
            t = rt.mark()
            if mine:
                _, phase, t0, _ = self.module_stack.pop()
                self.active_phases.discard(phase)
                rt.record_span(t0, t, rt.mb_context, phase, "compute")
            if self.depth == 0:
                self.module_stack.clear()
                self.active_phases.clear()
                training = rt.grad_enabled()
                rt.record_span(self.top_start, t, rt.fwd_mb if training else -1,
                               "forward-compute" if training else "forward-eval", "compute")
                if training:
                    rt.fwd_mb += 1
                    rt.forwards_since_step += 1
                rt.mb_context = -1
        except Exception as exc:  # noqa: BLE001
            self._guard(exc)

    # -- backward, optimizer, data ----------------------------------------------------------
    def _wrap_backward(self, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            rt = hooks.rt
            if not rt.active:
                return original(*args, **kwargs)
            t0, mb = rt.mark(), rt.bwd_mb
            rt.mb_context = mb
            launched = hooks.buckets_launched
            try:
                return original(*args, **kwargs)
            finally:
                try:
                    if hooks.buckets_launched > launched and rt.cuda is None:
                        # DDP waits at the end of backward for its gradient all-reduce; compute
                        # ended about when the last bucket was launched (run-queue delay in the
                        # tail, e.g. waking up, is counted already)
                        tail = now_ns() - hooks.last_bucket_ns
                        rt.waited_ns += max(tail - (rt.sched.runq_ns() - hooks.last_bucket_runq), 0)
                    rt.record_span(t0, rt.mark(), mb, "backward-compute", "compute")
                    rt.bwd_mb += 1
                    rt.mb_context = -1
                except Exception as exc:  # noqa: BLE001
                    hooks._guard(exc)

        return backward

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.rt.active:
            self.opt_start = self.rt.mark()

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        rt = self.rt
        if not rt.active:
            return
        try:
            t = rt.mark()
            rt.record_span(self.opt_start if self.opt_start is not None else t, t, -1, "optimizer", "compute")
            self.opt_start = None
            if not rt.explicit_steps and rt.forwards_since_step > 0:
                rt.end_step()
        except Exception as exc:  # noqa: BLE001
            self._guard(exc)

    def _wrap_dataloader(self, original: Callable) -> Callable:
        hooks = self

        @functools.wraps(original)
        def __next__(it: Any) -> Any:
            rt = hooks.rt
            if not rt.active:
                return original(it)
            t0 = now_ns()
            try:
                return original(it)
            finally:
                rt.record_phase(t0, now_ns(), -1, "dataloader", "host")

        return __next__

    # -- torch.distributed ------------------------------------------------------------------
    def _install_distributed(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from torch.distributed import distributed_c10d as c10d

        for fn, op in COLLECTIVE_OPS.items():
            original = getattr(dist, fn, None)
            if original is None:
                continue
            wrapped = self._wrap_collective(original, op, fn)
            self._patch(dist, fn, wrapped)
            if getattr(c10d, fn, None) is original:
                self._patch(c10d, fn, wrapped)
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self._patch(DDP, "register_comm_hook", self._wrap_register_comm_hook(DDP.register_comm_hook))
        except ImportError:
            pass

    def group_kind(self, group: Any, peer: int | None = None) -> str:
        """The layout kind of a process group (or of the pair with a p2p peer)."""
        key = (id(group), peer)
        found = self.group_kinds.get(key)
        if found is None:
            found = self.rt.kind_of_group(group, peer)
            self.group_kinds[key] = found
        return found

    def _wrap_collective(self, original: Callable, op: str, fn: str) -> Callable:
        hooks = self
        sig = inspect.signature(original)
        is_async_api = fn in ("isend", "irecv")
        p2p = fn in _P2P

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            rt = hooks.rt
            if not rt.active or hooks.local.suppress:
                return original(*args, **kwargs)
            try:
                bound = sig.bind_partial(*args, **kwargs).arguments
                group = bound.get("group")
                peer = bound.get("dst", bound.get("src")) if p2p else None
                kind = hooks.group_kind(group, peer)
                async_op = is_async_api or bool(bound.get("async_op", False))
            except Exception:  # noqa: BLE001 - odd arguments: let torch report them
                return original(*args, **kwargs)
            mb = rt.mb_context
            name = f"{kind or 'world'}-{op}"
            if async_op:  # completion is reported on another thread: CPU time
                t0 = now_ns()
                hooks.local.suppress = True
                try:
                    result = original(*args, **kwargs)
                finally:
                    hooks.local.suppress = False
                try:
                    if result is not None:
                        return hooks._on_completion(result, lambda: rt.record_phase(t0, now_ns(), mb, name, "comm", kind))
                except Exception as exc:  # noqa: BLE001
                    hooks._guard(exc)
                return result
            m0 = rt.mark()  # the current stream waits for a synchronous collective: events bracket it
            hooks.local.suppress = True  # torch may implement one API call with another (send → isend)
            try:
                result = original(*args, **kwargs)
            finally:
                hooks.local.suppress = False
            try:
                m1 = rt.mark()
                rt.record_span(m0, m1, mb, name, "comm", kind)
                rt.add_wait(m0, m1)
            except Exception as exc:  # noqa: BLE001
                hooks._guard(exc)
            return result

        return collective

    def _on_completion(self, work: Any, done: Callable[[], None]) -> Any:
        """Call ``done`` when an async op completes: its future if it has one, else on wait()."""
        try:
            fut = work.get_future()
            fut.add_done_callback(lambda _f: done())
            return work
        except Exception:  # noqa: BLE001 - some backends have no futures for p2p
            return _TimedWork(work, done)

    # -- DDP -------------------------------------------------------------------------------
    def _maybe_instrument_ddp(self, module: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not isinstance(module, DDP):
            return
        self.instrumented_ddp.add(id(module))
        if getattr(module, "_argus_user_hook", None) is not None:
            return
        try:
            self._register_ddp_hook(module)
        except Exception as exc:  # noqa: BLE001 - e.g. a hook already registered before init()
            log.info("argus: DDP gradient all-reduce not timed (%s)", exc)

    def _register_ddp_hook(self, ddp: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks = self
        kind = self.group_kind(ddp.process_group)
        name = f"{kind or 'dp'}-allreduce"

        def argus_timed_allreduce(state: Any, bucket: Any) -> Any:
            rt = hooks.rt
            t0, mb, step = now_ns(), rt.mb_context, rt.step
            hooks.last_bucket_ns = t0
            hooks.last_bucket_runq = rt.sched.runq_ns()
            hooks.buckets_launched += 1
            user = getattr(ddp, "_argus_user_hook", None)
            hooks.local.suppress = True
            try:
                fut = user[1](user[0], bucket) if user else default_hooks.allreduce_hook(ddp.process_group, bucket)
            finally:
                hooks.local.suppress = False

            def done(f: Any) -> Any:
                if rt.active:
                    rt.record_phase(t0, now_ns(), mb, name, "comm", kind or "dp", step=step)
                return f.value()

            return fut.then(done)

        import torch
        import torch.distributed as dist

        # DDP checks these annotations; `from __future__ import annotations` made ours strings
        argus_timed_allreduce.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                                                 "return": torch.futures.Future[torch.Tensor]}
        self._ddp_register(ddp, None, argus_timed_allreduce)
        ddp._argus_hooked = True

    def _wrap_register_comm_hook(self, original: Callable) -> Callable:
        """DDP accepts one comm hook: Argus registers its timed hook and calls the user's from it."""
        hooks = self
        self._ddp_register = original

        @functools.wraps(original)
        def register_comm_hook(ddp: Any, state: Any, hook: Callable) -> None:
            ddp._argus_user_hook = (state, hook)
            if getattr(ddp, "_argus_hooked", False):
                return None  # ours is registered and now delegates to this one
            if hooks.rt.active:
                try:
                    hooks._register_ddp_hook(ddp)
                    hooks.instrumented_ddp.add(id(ddp))
                    return None
                except Exception as exc:  # noqa: BLE001
                    log.info("argus: DDP gradient all-reduce not timed (%s)", exc)
            return original(ddp, state, hook)

        return register_comm_hook


class _TimedWork:
    """A Work whose ``wait`` also records the end of the op (when it has no future)."""

    def __init__(self, work: Any, done: Callable[[], None]):
        self._work = work
        self._done = done
        self._recorded = False

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        if not self._recorded:
            self._recorded = True
            self._done()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)
