"""Argus: always-on tracing and progressive diagnosis for distributed PyTorch training.

Importing this package is cheap: heavy modules (numpy, pyarrow, torch) load only in the
subpackages that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "init", "phase", "shutdown", "step"]


def init(**options):  # thin front: the producer loads only when called
    """Start tracing this training process (``import argus; argus.init()``). Never raises."""
    from argus.producer.api import init as _init

    return _init(**options)


def step() -> None:
    """Mark a training step boundary (for loops without an optimizer)."""
    from argus.producer.api import step as _step

    _step()


def phase(name: str, category: str = "compute"):
    """``with argus.phase("name"):`` or ``@argus.phase("name")``: a user-defined phase."""
    from argus.producer.api import phase as _phase

    return _phase(name, category)


def shutdown() -> None:
    """Flush buffered data to the processor and stop tracing."""
    from argus.producer.api import shutdown as _shutdown

    _shutdown()
