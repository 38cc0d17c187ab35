"""Short directories for unix sockets, removed when the test process ends.

A socket's path holds at most 108 bytes, more than pytest's ``tmp_path`` may leave, so tests
that start a processor put its socket under the system's temporary directory. Made with a
bare ``mkdtemp`` they stayed there (this machine held ~750 of them, empty or with a stale
socket, after a few dozen runs of the suite). Here they live under one root per test
process, removed at its exit, when every processor a test started has stopped.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_root: list[Path] = []


def short_dir(prefix: str) -> Path:
    """A new directory with a short path (``/tmp/argus-tests-XXXX/<prefix>XXXX``)."""
    if not _root:
        _root.append(Path(tempfile.mkdtemp(prefix="argus-tests-")))
        atexit.register(shutil.rmtree, _root[0], True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=_root[0]))
