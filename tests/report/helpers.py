"""Stores for report, web-UI and browser tests: the five production cases, a copy with
hostile names, evidence files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from argus.store import Attempt, Store, conform

__all__ = ["CASES", "SCRIPT", "store_root", "copy_store", "add_script_names", "write_evidence", "sim", "report_of"]

CASES = ("compute_straggler", "link_degradation", "pipeline_bubble", "jit_stall", "masked_compute_straggler")
SCRIPT = "<script>alert(1)</script>"


def sim(simulated, scenario: str) -> tuple[Attempt, dict]:
    """The session's shared simulation of ``scenario`` (64 ranks, 20 steps, no raw kernels)."""
    return simulated(scenario, steps=20, kernels=False)


_REPORTS: dict[Path, Path] = {}  # attempt path → its report: diagnosed once per session, shared by test dirs


def report_of(attempt: Attempt, tmp_path_factory) -> Path:
    """The report of a shared (never modified) simulated attempt."""
    if attempt.path not in _REPORTS:
        from argus.report import build_report

        out = tmp_path_factory.mktemp(f"report-{attempt.identity.run_id}") / "report.html"
        build_report(attempt, out)
        _REPORTS[attempt.path] = out
    return _REPORTS[attempt.path]


def store_root(attempt: Attempt) -> Path:
    return attempt.path.parents[2]


def copy_store(attempt: Attempt, dst: Path) -> Attempt:
    """A private copy (tests that add files must not touch the shared store)."""
    shutil.copytree(store_root(attempt), dst)
    return Store.open(dst).attempt()


def add_script_names(attempt: Attempt, culprit: int) -> None:
    """A phase and a kernel named ``<script>alert(1)</script>``, ``culprit`` slower in both,
    so that diagnosis names them and every part of the report shows them."""
    w = attempt.writer("hostile")
    ph = attempt.read("phases", filter=pc.field("name") == "self_attention")
    ph = ph.set_column(ph.schema.get_field_index("name"), "name", pa.array([SCRIPT] * ph.num_rows))
    dur = ph.column("dur_ns").to_numpy() * 50
    ph = ph.set_column(ph.schema.get_field_index("dur_ns"), "dur_ns", pa.array(dur))
    w.write("phases", conform("phases", ph), window=0)
    ks = attempt.read("kernel_summaries", filter=pc.field("kernel") == "flash_fwd_kernel")
    ks = ks.set_column(ks.schema.get_field_index("kernel"), "kernel", pa.array([SCRIPT] * ks.num_rows))
    slow = ks.column("rank").to_numpy() == culprit
    for c in ("p50_ns", "p99_ns", "min_ns", "max_ns"):
        v = ks.column(c).to_numpy() * np.where(slow, 8.0, 1.0)
        ks = ks.set_column(ks.schema.get_field_index(c), c, pa.array(v))
    w.write("kernel_summaries", conform("kernel_summaries", ks), window=0)


def write_evidence(attempt: Attempt, host: str, window: int) -> Path:
    """A real Perfetto trace of one window's phases, where the processor would put it."""
    from argus.evidence import write_perfetto_trace

    lo, hi = (int(v) for v in attempt.sql(
        f'SELECT min(start_step), max(end_step) FROM kernel_summaries WHERE "window" = {window}').to_pylist()[0]
        .values())
    ph = attempt.read("phases", steps=(lo, hi), filter=pc.field("rank") < 4)
    path = attempt.path / "evidence" / host / f"{window:09d}-0badcafe.pftrace"
    write_perfetto_trace(path, phases=ph, kernels=None, title=f"window {window}")
    return path
