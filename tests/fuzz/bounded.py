"""Run a hostile case in a child process under a memory limit and a deadline.

A blow-up must fail the test quickly rather than swap the machine, so the child gets an
address-space limit (``RLIMIT_AS``; Python with pyarrow and DuckDB maps ~1.5 GB before it
does anything) and reports its peak resident memory (``VmHWM``) on its last stderr line.
Callers assert on ``returncode``, ``traceback`` and ``peak_mb``.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Appended to the child's program: the peak resident set, read as the process exits.
_PEAK = ("import atexit as _a, sys as _s\n"
         "def _peak():\n"
         "    for _l in open('/proc/self/status'):\n"
         "        if _l.startswith('VmHWM:'):\n"
         "            _s.stderr.write('\\nARGUS_PEAK_KB=' + _l.split()[1] + '\\n')\n"
         "_a.register(_peak)\n")


@dataclass(frozen=True)
class Bounded:
    returncode: int
    stdout: str
    stderr: str
    peak_mb: float  # peak resident memory of the child; nan when it died before reporting

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr or "Traceback" in self.stdout

    @property
    def killed(self) -> bool:
        return self.returncode < 0 or self.returncode in (124, 137)


def run_bounded(code: str, *, mem_mb: int = 4096, timeout_s: float = 120.0, cwd: Path | None = None,
                env: dict[str, str] | None = None, stdin: str | None = None) -> Bounded:
    """Run Python ``code`` in a child limited to ``mem_mb`` of address space.

    ``code`` runs as ``__main__``; a CLI call is ``run_bounded("from argus.cli.main import
    main; raise SystemExit(main([...]))")``. A child past its deadline is killed and reported
    with return code 124.
    """
    limit = mem_mb << 20

    def _limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    full_env = {**os.environ, "PYTHONFAULTHANDLER": "0", **(env or {})}
    try:
        proc = subprocess.run([sys.executable, "-c", _PEAK + code], capture_output=True, text=True,
                              timeout=timeout_s, cwd=cwd, env=full_env, preexec_fn=_limit, input=stdin)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    peak = float("nan")
    lines = err.rstrip().splitlines()
    if lines and lines[-1].startswith("ARGUS_PEAK_KB="):
        peak = int(lines[-1].split("=", 1)[1]) / 1024
        err = "\n".join(lines[:-1])
    return Bounded(rc, out, err, peak)
