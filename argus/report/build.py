"""Build a report file: diagnose the attempt, gather, render, write temp-then-rename."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from argus.analysis.diagnosis import Diagnosis
from argus.report.collect import gather
from argus.report.page import render_report
from argus.store import Attempt
from argus.store.files import write_bytes_atomic

__all__ = ["ReportResult", "build_report"]


@dataclass(frozen=True, slots=True)
class ReportResult:
    path: Path
    bytes: int
    incidents: int
    wall_s: float
    diagnosis_s: float
    render_s: float


def build_report(attempt: Attempt, out: str | Path, diagnosis: Diagnosis | None = None,
                 on_window: Callable[[int, int], None] | None = None) -> ReportResult:
    """Write the self-contained HTML report of ``attempt`` to ``out``.

    Without ``diagnosis`` the attempt is diagnosed now (not written back to the store): the
    stored incidents table lacks the L1 windows and summaries the report shows, and may
    describe less data than the store now holds."""
    t0 = time.perf_counter()
    if diagnosis is None:
        from argus.analysis import DiagnoseConfig, diagnose

        diagnosis = diagnose(attempt, DiagnoseConfig(store_incidents=False), on_window=on_window)
    t1 = time.perf_counter()
    out = Path(out)
    data = gather(attempt, diagnosis)
    html = render_report(data, out.parent).encode()
    write_bytes_atomic(out, html)
    t2 = time.perf_counter()
    return ReportResult(out, len(html), len(data.incidents), t2 - t0, t1 - t0, t2 - t1)
