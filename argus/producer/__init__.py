"""The producer: the library that runs inside each training process.

Import cost is kept low: heavy modules (numpy, torch hooks, CUPTI) load only when
``init()`` enables tracing.
"""

from argus.producer.api import init, phase, shutdown, step

__all__ = ["init", "phase", "shutdown", "step"]
