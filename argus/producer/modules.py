"""Module phases without global hooks: which modules are timed is decided as the model is built.

Global forward hooks would see every module call, but they put every call of every module
on ``nn.Module``'s slow path and change what ``torch.compile`` does (dynamo warns about them
and treats the compiled module's wrapper differently). Instead one **registration** hook
(``register_module_module_registration_hook``: called when a module is assigned a
submodule, nothing at call time, not seen by dynamo) records the module tree as it is built,
and only two kinds of module get forward hooks of their own:

* **roots** — modules with children that are nobody's child (the model, or its DDP /
  FSDP / ``torch.compile`` wrapper): a root call on a non-nested level is one microbatch's
  forward (``forward-compute``; ``forward-eval`` without grad);
* **phase modules** — modules whose class name matches a pattern (attention, mlp, moe, …):
  their calls are module phases (``self_attention`` …); recomputed during backward
  (activation checkpointing) they are ``<phase>-recompute`` and are not a new microbatch.

A module that becomes a child loses its root hooks. Every hook body starts with
``torch.compiler.is_compiling()``: traced by dynamo (a hooked module inside a compiled
region) it is an empty function, so graphs, graph breaks and recompiles do not change — as
long as the hook existed before the first compilation, which is why hooks are attached as
modules are registered, never later (modules built before Argus started are attached when
it starts; after something was compiled, compiled subtrees are left alone). Post hooks are
``always_call``: a forward that raises leaves no phase open.

The tree is process-wide because the registration hook is (it is installed at ``import
torch``, before any runtime exists); :meth:`ModuleTree.attach` hands it to the runtime.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, Callable, ClassVar

from argus.vocab import PhaseCategory

__all__ = ["ModuleTree", "ForwardTimer", "guarded_hook"]

log = logging.getLogger("argus.producer")


def guarded_hook(body: Callable[..., None]) -> Callable[..., None]:
    """A hook method of an object with ``rt`` and ``is_compiling``: an empty function while dynamo
    traces it or while Argus is off, and one that never raises into the model (an exception
    disables Argus with one warning). Returns None, so PyTorch keeps its own result."""

    @functools.wraps(body)
    def hook(self: Any, *args: Any) -> None:
        if self.is_compiling() or not self.rt.active:
            return None
        try:
            body(self, *args)
        except Exception as exc:  # noqa: BLE001 - never raise into the user's code
            self.rt.fail(f"a PyTorch hook failed ({type(exc).__name__}: {exc})")
        return None

    return hook


class ModuleTree:
    """Parent/child relations of the modules built in this process (weak references)."""

    _instance: ClassVar["ModuleTree | None"] = None

    def __init__(self) -> None:
        self.parents: Any = weakref.WeakSet()
        self.children: Any = weakref.WeakSet()
        self.listener: Callable[[Any, Any], None] | None = None
        self.handle: Any = None

    @classmethod
    def install_recorder(cls) -> "ModuleTree":
        """The process's tree, recording from now on (idempotent)."""
        if cls._instance is None:
            from torch.nn.modules import module as nn_module

            tree = cls()
            tree.handle = nn_module.register_module_module_registration_hook(tree._registered)
            cls._instance = tree
        return cls._instance

    def _registered(self, parent: Any, name: str, child: Any) -> None:
        try:
            if child is None:
                return
            self.parents.add(parent)
            self.children.add(child)
            if self.listener is not None:
                self.listener(parent, child)
        except Exception:  # noqa: BLE001 - building the user's model must never fail because of us
            pass

    def roots(self) -> list[Any]:
        return [m for m in list(self.parents) if m not in self.children]

    def scan_existing(self) -> None:
        """Modules built before the recorder (``argus.init()`` called late): found once among
        the garbage collector's objects (``type()`` only — an ``isinstance`` would run
        properties of foreign objects)."""
        import gc

        from torch import nn

        for obj in gc.get_objects():
            if issubclass(type(obj), nn.Module):
                for child in obj.children():
                    self.parents.add(obj)
                    self.children.add(child)


def _compiled(module: Any) -> bool:
    """A module whose calls run compiled code: ``module.compile()`` or the inside of an
    ``OptimizedModule`` (``torch.compile(module)``)."""
    return getattr(module, "_compiled_call_impl", None) is not None or type(module).__name__ == "OptimizedModule"


class ForwardTimer:
    """The forward hooks on roots and phase modules, recording into the runtime."""

    def __init__(self, runtime: Any, tree: ModuleTree, is_compiling: Callable[[], bool]):
        self.rt = runtime
        self.tree = tree
        self.is_compiling = is_compiling
        self.patterns = runtime.config.module_patterns
        self.root_handles: Any = weakref.WeakKeyDictionary()
        self.phase_handles: Any = weakref.WeakKeyDictionary()
        self.phase_of_class: dict[type, str | None] = {}
        self.root_depth = 0
        self.top_start: Any = None
        self.module_stack: list[tuple[int, str, Any]] = []
        self.on_root_call: Callable[[Any], None] = lambda m: None  # e.g. instrument DDP

    # -- attaching ------------------------------------------------------------------------
    def attach(self) -> None:
        """Hook the current roots and phase modules, then follow the tree as it grows."""
        if not self.tree.parents:
            self.tree.scan_existing()
        skip_compiled = _something_compiled()
        for root in self.tree.roots():
            self._hook_root(root)
            self._hook_subtree(root, skip_compiled)
        self.tree.listener = self._registered

    def detach(self) -> None:
        self.tree.listener = None
        for table in (self.root_handles, self.phase_handles):
            for handles in list(table.values()):
                for h in handles:
                    h.remove()
            table.clear()

    def _registered(self, parent: Any, child: Any) -> None:
        handles = self.root_handles.pop(child, None)
        if handles:
            for h in handles:
                h.remove()
        if parent not in self.tree.children and parent not in self.root_handles:
            self._hook_root(parent)
        self._hook_subtree(child, skip_compiled=False)

    def _hook_root(self, m: Any) -> None:
        self.root_handles[m] = (m.register_forward_pre_hook(self._root_pre),
                                m.register_forward_hook(self._root_post, always_call=True))

    def _hook_subtree(self, top: Any, skip_compiled: bool) -> None:
        stack = [top]
        while stack:
            m = stack.pop()
            if skip_compiled and _compiled(m):
                continue
            if m not in self.phase_handles and self._phase_for(type(m)) is not None:
                self.phase_handles[m] = (m.register_forward_pre_hook(self._phase_pre),
                                         m.register_forward_hook(self._phase_post, always_call=True))
            stack.extend(m.children())

    def _phase_for(self, cls: type) -> str | None:
        found = self.phase_of_class.get(cls, "?")
        if found == "?":
            low = cls.__name__.lower()
            found = next((phase for phase, words in self.patterns.items() if any(w in low for w in words)), None)
            self.phase_of_class[cls] = found
        return found

    # -- hooks ------------------------------------------------------------------------------
    @guarded_hook
    def _root_pre(self, module: Any, args: Any) -> None:
        rt = self.rt
        if self.root_depth == 0 and not rt.in_backward:
            rt.forward_starts(module)
            self.top_start = rt.mark()
            self.on_root_call(module)
        self.root_depth += 1

    @guarded_hook
    def _root_post(self, module: Any, args: Any, output: Any) -> None:
        rt = self.rt
        self.root_depth = max(self.root_depth - 1, 0)
        if self.root_depth == 0 and not rt.in_backward and self.top_start is not None:
            start, self.top_start = self.top_start, None
            rt.forward_ends(start)
            self.module_stack.clear()

    @guarded_hook
    def _phase_pre(self, module: Any, args: Any) -> None:
        phase = self.phase_of_class.get(type(module))
        if phase and all(p != phase for _, p, _ in self.module_stack):
            self.module_stack.append((id(module), phase, self.rt.mark()))

    @guarded_hook
    def _phase_post(self, module: Any, args: Any, output: Any) -> None:
        rt = self.rt
        if self.module_stack and self.module_stack[-1][0] == id(module):
            _, phase, t0 = self.module_stack.pop()
            name = f"{phase}-recompute" if rt.in_backward else phase
            rt.record_span(t0, rt.mark(), rt.mb_context, name, PhaseCategory.COMPUTE)


def _something_compiled() -> bool:
    import sys

    dynamo = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(dynamo and dynamo.counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        return False
