"""Host work that stops a rank without being its model's work: garbage collection and compiling.

* **Garbage collection** — CPython calls ``gc.callbacks`` at the start and stop of every
  collection (for free: the list is walked either way). A collection of at least
  ``MIN_GC_NS`` becomes a host phase ``gc`` (gen-0 collections of microseconds are not
  recorded). The callback runs inside whatever allocated — possibly inside Argus's own ring
  write — so it uses only pre-interned names and the ring's non-blocking path.
* **Compilation** — dynamo's compile start/end callbacks (``torch._dynamo.callback``), which
  bracket every frame compilation including inductor's code generation: a host phase
  ``compile``. Registered when ``torch._dynamo`` is first imported, never importing it.

The analysis reads these phases to name a host stall's cause (``gc``, ``jit_compile``) from
the rank's own timeline, where stack samples alone can miss a pause of a few hundred ms.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from argus.producer.activation import after_import
from argus.producer.recorder import CATEGORY, now_ns
from argus.vocab import PhaseCategory

__all__ = ["HostEvents", "MIN_GC_NS"]

log = logging.getLogger("argus.producer")

MIN_GC_NS = 1_000_000


class HostEvents:
    def __init__(self, runtime: Any):
        self.rt = runtime
        self.gc_start = 0
        self.compile_start: list[int] = []
        self.installed = False
        self._dynamo_handler: Any = None

    def install(self) -> None:
        rec = self.rt.recorder
        self.gc_name = rec.name_id("gc")
        self.compile_name = rec.name_id("compile")
        gc.callbacks.append(self._on_gc)
        after_import("torch._dynamo", self._hook_dynamo)
        self.installed = True

    def uninstall(self) -> None:
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
        handler = self._dynamo_handler
        if handler is not None:
            for remove, cb in ((handler.remove_start_callback, self._compile_started),
                               (handler.remove_end_callback, self._compile_ended)):
                try:
                    remove(cb)
                except ValueError:
                    pass
        self.installed = False

    def _on_gc(self, phase: str, info: dict) -> None:
        rt = self.rt
        if not rt.active:
            return
        try:
            if phase == "start":
                self.gc_start = now_ns()
            elif self.gc_start:
                t1 = now_ns()
                if t1 - self.gc_start >= MIN_GC_NS:
                    rt.recorder.phase_ids(rt.step, self.gc_start, t1 - self.gc_start, -1, self.gc_name,
                                          CATEGORY[PhaseCategory.HOST], 0)
                self.gc_start = 0
        except Exception:  # noqa: BLE001 - inside the interpreter's collector: never raise
            pass

    def _hook_dynamo(self, _module: Any) -> None:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._compile_started)
        callback_handler.register_end_callback(self._compile_ended)
        self._dynamo_handler = callback_handler

    def _compile_started(self, *_args: Any) -> None:
        if self.rt.active:
            self.compile_start.append(now_ns())

    def _compile_ended(self, *_args: Any) -> None:
        rt = self.rt
        if not self.compile_start:
            return
        t0 = self.compile_start.pop()
        if rt.active:
            try:
                rt.recorder.phase_ids(rt.step, t0, now_ns() - t0, -1, self.compile_name, CATEGORY[PhaseCategory.HOST], 0)
            except Exception:  # noqa: BLE001
                pass
