"""Where a process becomes a rank: the producer starts there, and only there.

``argus run`` puts a ``sitecustomize`` on ``PYTHONPATH``, so every Python process of the job
runs :func:`arm` at start: the launcher (torchrun, a shell script's Python, accelerate,
deepspeed, srun's tasks), the ranks, their DataLoader workers, inductor's compile workers,
checkpoint helper processes. Arming only installs import hooks; nothing else happens until
``torch.distributed.init_process_group`` (or ``init_device_mesh``, which calls it) returns
in that process. Then the producer starts with the rank and world size the process group
reports. A process whose ancestor is already a traced rank (``ARGUS_TRACED_PID``, set by the
rank and inherited) is never a rank of its own — a checkpointing helper that makes its own
process group, say — and a forked child (DataLoader workers) stops the inherited producer
at once (``os.register_at_fork``).

Import hooks wrap a module loader's ``exec_module``: the callback runs right after the
module's code, before any user code can bind names from it, so a wrapped
``init_process_group`` is what everyone sees. Aliases torch binds internally before the hook
runs (``torch.distributed.device_mesh`` imports the function at import time) are replaced too.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import os
import sys
from typing import Any, Callable

from argus import env as argus_env

__all__ = ["after_import", "agree_run_id", "arm", "RUN_ID_KEY", "TRACED_PID_ENV", "traced_ancestor",
           "wrap_init_process_group"]

log = logging.getLogger("argus.producer")

TRACED_PID_ENV = argus_env.TRACED_PID  # set in a traced rank; its descendants are not ranks of their own
RUN_ID_KEY = "argus/run_id"  # the key the ranks agree on a run id under, in the job's rendezvous store


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[Any], object]]] = {}  # results ignored

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        callbacks = self.callbacks.pop(name, None)
        if not callbacks:
            return None
        if not self.callbacks:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        # let the other finders find it (this finder is out of the way for this name now)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        @functools.wraps(original)
        def exec_module(module: Any) -> None:
            original(module)
            loader.exec_module = original  # type: ignore[method-assign]  # once
            for cb in callbacks:
                try:
                    cb(module)
                except Exception as exc:  # noqa: BLE001 - never break the user's import
                    log.warning("argus: hook on import of %s failed: %s", name, exc)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _AfterImport()


def after_import(name: str, callback: Callable[[Any], object]) -> None:
    """Run ``callback(module)`` right after ``name`` is first imported (now if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _FINDER.callbacks.setdefault(name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def traced_ancestor() -> int | None:
    """The pid of a living traced ancestor of this process, if any."""
    raw = os.environ.get(TRACED_PID_ENV, "")
    try:
        pid = int(raw)
    except ValueError:
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def wrap_init_process_group(c10d: Any, on_initialised: Callable[[], None]) -> None:
    """Make every ``init_process_group`` call ``on_initialised()`` after it succeeded."""
    original = getattr(c10d, "init_process_group", None)
    if original is None or getattr(original, "__argus_wrapped__", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            on_initialised()
        except Exception as exc:  # noqa: BLE001 - the job's process group is fine; only tracing is off
            log.warning("argus: not started: %s", exc)
        return result

    init_process_group.__argus_wrapped__ = True  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):
        if (name == "torch" or name.startswith("torch.")) and getattr(module, "init_process_group", None) is original:
            setattr(module, "init_process_group", init_process_group)


def arm(start: Callable[[], None]) -> None:
    """Zero-code mode: call ``start()`` when this process's process group comes up."""
    if traced_ancestor() is not None:
        return

    def on_distributed(_module: Any) -> None:
        from torch.distributed import distributed_c10d

        if distributed_c10d.is_initialized():
            start()
        else:
            wrap_init_process_group(distributed_c10d, start)

    after_import("torch.distributed", on_distributed)
    after_import("torch", _record_module_tree)


def _record_module_tree(_torch: Any) -> None:
    """Start recording parent/child registrations of modules (cheap; hooks come at start)."""
    from argus.producer.modules import ModuleTree

    ModuleTree.install_recorder()


def agree_run_id(proposal: str) -> str:
    """The run id every rank of this job uses: the first proposal to reach the default process
    group's store (the job's own rendezvous store, shared by every host) under ``RUN_ID_KEY``.

    One ``compare_set`` per rank at start: never a collective, never a wait for another rank
    (the first rank sets the key, every later one reads it back in the same call). A store
    that cannot (no default group, a store without ``compare_set``) leaves ``proposal``: a
    single-host job is one run either way."""
    try:
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        agreed = store.compare_set(RUN_ID_KEY, "", proposal)
        text = agreed.decode() if isinstance(agreed, bytes) else str(agreed)
        return text or proposal
    except Exception as exc:  # noqa: BLE001 - the job's store is the job's: any failure keeps our own id
        log.info("argus: run id not agreed through the job's store (%s); using %s", exc, proposal)
        return proposal
