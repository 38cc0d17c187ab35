"""The producer's public functions, behind ``argus.init()`` and friends.

Two ways in:

* ``argus.init()`` in the training script — tracing starts now if the process group is up
  (or the process is a single, non-distributed job), else the moment
  ``init_process_group`` returns;
* zero-code (``argus run``): :func:`arm` at interpreter start, which starts nothing until
  this process becomes a rank (``activation.py``).

Neither ever raises into the training script: a bad option or layout, a missing processor
or an internal error produce one warning and a disabled (or degraded) producer. The one
process-wide runtime lives here because ``import argus; argus.init()`` is the contract;
``_reset`` exists for tests.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import warnings
from typing import Any, Literal

from argus import env as argus_env
from argus.vocab import PhaseCategory

__all__ = ["init", "step", "phase", "shutdown", "runtime", "arm"]

log = logging.getLogger("argus.producer")
_RUNTIME: Any = None
_CATEGORIES = frozenset(PhaseCategory)  # what argus.phase accepts; anything else is compute
_START_LOCK = threading.Lock()
_ATEXIT = False


def runtime() -> Any:
    return _RUNTIME


def _start(options: dict[str, Any], rank: int | None = None, world: int | None = None,
           agree: Any = None) -> bool:
    """Build and start the runtime (once per process); ``agree``: how the ranks agree on a run
    id when none was given (``activation.agree_run_id``)."""
    global _RUNTIME, _ATEXIT
    with _START_LOCK:
        if _RUNTIME is not None:
            return _RUNTIME.active
        from argus.producer.config import resolve_config, resolve_identity
        from argus.producer.runtime import Runtime, make_layout

        config = resolve_config(options)
        if not config.enabled:
            return False
        identity = resolve_identity(config, rank=rank, world_size=world, agree=agree)
        layout = make_layout(config, identity.world_size)
        rt = Runtime(config, identity, layout)
        _RUNTIME = rt
        rt.start()
        if not _ATEXIT:
            atexit.register(shutdown)
            _ATEXIT = True
        return rt.active


def _start_from_process_group(options: dict[str, Any]) -> None:
    """This process's process group is up: it is a rank. Start with what the group says."""
    from argus.producer.activation import agree_run_id, traced_ancestor

    if traced_ancestor() is not None:
        return
    import torch.distributed as dist

    try:
        _start(options, dist.get_rank(), dist.get_world_size(), agree=agree_run_id)
    except Exception as exc:  # noqa: BLE001 - never stop training because of Argus
        warnings.warn(f"argus: tracing disabled: {exc}", RuntimeWarning, stacklevel=2)


def init(**options: Any) -> bool:
    """Start tracing this process. Options override ``ARGUS_*`` variables (see
    ``argus.producer.config``). Returns whether tracing is on (or will be, once the process
    group is initialised)."""
    if _RUNTIME is not None:
        return _RUNTIME.active
    try:
        from argus.producer.activation import after_import, agree_run_id, traced_ancestor, wrap_init_process_group
        from argus.producer.config import resolve_config

        if not resolve_config(options).enabled or traced_ancestor() is not None:
            return False
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return _start(options, dist.get_rank(), dist.get_world_size(), agree=agree_run_id)
        if multiprocessing.parent_process() is not None and "RANK" not in os.environ:
            return False  # a DataLoader or pool worker importing the training script
        if any(v in os.environ for v in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
            # a launched rank whose process group is not up yet: start when it is
            after_import("torch.distributed", lambda mod: wrap_init_process_group(
                mod.distributed_c10d, lambda: _start_from_process_group(options)))
            return True
        return _start(options)
    except Exception as exc:  # noqa: BLE001 - never stop training because of Argus
        warnings.warn(f"argus: tracing disabled: {exc}", RuntimeWarning, stacklevel=2)
        return False


def arm() -> None:
    """Zero-code start (``argus run``'s ``sitecustomize``): trace this process if and when it
    becomes a rank; with ``ARGUS_FORCE=1``, a job that never makes a process group is traced
    from ``import torch`` in its top process."""
    try:
        from argus.producer.activation import after_import, arm as arm_activation

        arm_activation(lambda: _start_from_process_group({}))
        if os.environ.get(argus_env.FORCE) == "1" and multiprocessing.parent_process() is None:
            after_import("torch", lambda _torch: _start({}))
    except Exception as exc:  # noqa: BLE001
        print(f"argus: not started: {exc}", file=sys.stderr)


def step() -> None:
    """Mark a step boundary (for loops without an optimizer; turns automatic boundaries off)."""
    rt = _RUNTIME
    if rt is None or not rt.active:
        return
    try:
        rt.explicit_steps = True
        rt.end_step()
    except Exception as exc:  # noqa: BLE001
        rt.fail(f"step() failed ({exc})")


class phase(contextlib.ContextDecorator):  # noqa: N801 - public API: argus.phase is used like a function
    """``with argus.phase("name"):`` or ``@argus.phase("name")``: a user-defined phase."""

    def __init__(self, name: str, category: str = PhaseCategory.COMPUTE):
        self.name = name
        self.category = category if category in _CATEGORIES else PhaseCategory.COMPUTE
        self._start: list[Any] = []

    def __enter__(self) -> "phase":
        rt = _RUNTIME
        if rt is not None and rt.active:
            try:
                self._start.append(rt.mark())
            except Exception as err:  # noqa: BLE001
                rt.fail(f"phase() failed ({err})")
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        rt = _RUNTIME
        if rt is not None and rt.active and self._start:
            try:
                rt.record_span(self._start.pop(), rt.mark(), rt.mb_context, self.name, self.category)
            except Exception as err:  # noqa: BLE001
                rt.fail(f"phase() failed ({err})")
        return False


def shutdown() -> None:
    """Stop (also run at exit). Nothing is lost either way: records are in the ring already."""
    global _RUNTIME
    rt, _RUNTIME = _RUNTIME, None
    if rt is not None:
        try:
            rt.shutdown()
        except Exception:  # noqa: BLE001
            pass


def _reset() -> None:  # tests
    shutdown()
