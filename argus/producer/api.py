"""The producer's public functions, behind ``argus.init()`` and friends.

``init`` never raises into the training script: a bad option or layout, a missing processor
or an internal error produce one warning and a disabled (or degraded) producer. The one
process-wide runtime lives here because ``import argus; argus.init()`` is the contract;
``_reset`` exists for tests.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import importlib.util
import logging
import sys
import warnings
from typing import Any, Callable, Iterator

__all__ = ["init", "step", "phase", "shutdown", "runtime", "install_torch_import_hook"]

log = logging.getLogger("argus.producer")
_RUNTIME: Any = None


def runtime() -> Any:
    return _RUNTIME


def init(**options: Any) -> bool:
    """Start tracing this process. Options override ``ARGUS_*`` variables (see
    ``argus.producer.config``). Returns whether tracing is on."""
    global _RUNTIME
    if _RUNTIME is not None:
        return _RUNTIME.active
    try:
        from argus.producer.config import resolve_config, resolve_identity
        from argus.producer.runtime import Runtime, make_layout

        config = resolve_config(options)
        if not config.enabled:
            return False
        identity = resolve_identity(config)
        layout = make_layout(config, identity.world_size)
        _RUNTIME = Runtime(config, identity, layout)
        _RUNTIME.start()
        if "torch" not in sys.modules:
            install_torch_import_hook(_RUNTIME.install_torch)
        atexit.register(shutdown)
        return _RUNTIME.active
    except Exception as exc:  # noqa: BLE001 - never stop training because of Argus
        warnings.warn(f"argus: tracing disabled: {exc}", RuntimeWarning, stacklevel=2)
        _RUNTIME = None
        return False


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


class phase(contextlib.ContextDecorator):
    """``with argus.phase("name"):`` or ``@argus.phase("name")``: a user-defined phase."""

    def __init__(self, name: str, category: str = "compute"):
        self.name = name
        self.category = category if category in ("compute", "comm", "host") else "compute"
        self._start: list[Any] = []

    def __enter__(self) -> "phase":
        rt = _RUNTIME
        if rt is not None and rt.active:
            self._start.append(rt.mark())
        return self

    def __exit__(self, *exc: object) -> bool:
        rt = _RUNTIME
        if rt is not None and rt.active and self._start:
            try:
                rt.record_span(self._start.pop(), rt.mark(), rt.mb_context, self.name, self.category)
            except Exception as err:  # noqa: BLE001
                rt.fail(f"phase() failed ({err})")
        return False


def shutdown() -> None:
    """Flush and stop (also run at exit; jobs killed hard lose at most the last second)."""
    global _RUNTIME
    rt, _RUNTIME = _RUNTIME, None
    if rt is not None:
        try:
            rt.shutdown()
        except Exception:  # noqa: BLE001
            pass


def _reset() -> None:  # tests
    shutdown()


# -- zero-code: hook PyTorch the moment it is imported ------------------------------------------
class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, module: str, callback: Callable[[], None]):
        self.module = module
        self.callback = callback

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, callback = spec.loader, self.callback
        original = loader.exec_module

        @functools.wraps(original)
        def exec_module(module: Any) -> None:
            original(module)
            try:
                callback()
            except Exception as exc:  # noqa: BLE001
                log.warning("argus: could not hook %s: %s", name, exc)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_torch_import_hook(callback: Callable[[], None]) -> None:
    if "torch" in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("torch", callback))
