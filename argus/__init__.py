"""Argus: always-on tracing and progressive diagnosis for distributed PyTorch training.

Importing this package is cheap: heavy modules (numpy, pyarrow, torch) load only in the
subpackages that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
