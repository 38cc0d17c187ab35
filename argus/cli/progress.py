"""Progress bars and consoles for long commands (stderr, so ``--json`` stdout stays clean).

The consoles parse rich markup in the strings they print but never turn ``:name:`` into an
emoji: a kernel called ``aten::fire:`` is printed as written. Untrusted text still goes
through :func:`argus.text.term` before it is put into a printed string."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from argus.text import term

__all__ = ["stderr_console", "stdout_console", "progress_bar"]


def stderr_console() -> Console:
    """Messages on stderr are not hard-wrapped: a note naming a long path stays one line that
    ``grep`` (and a log collector) finds whole; the terminal wraps it for the eye."""
    return Console(stderr=True, highlight=False, emoji=False, soft_wrap=True,
                   width=None if sys.stderr.isatty() else 160)


def stdout_console() -> Console:
    return Console(highlight=False, emoji=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool | None = None) -> Iterator[Callable[..., None]]:
    """A bar on stderr, shown only on a terminal (never under CI) unless forced; yields
    ``advance(n=1)``."""
    if enabled is None:
        enabled = sys.stderr.isatty() and not os.environ.get("CI")
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=stderr_console(),
                        disable=not enabled, transient=False)
    with progress:
        task = progress.add_task(term(description), total=total)  # may name a run: text, not markup
        yield lambda n=1: progress.advance(task, n)
