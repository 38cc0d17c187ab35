"""The report's "Job log" section: every event ``argus run`` kept, by kind — not only the lines an
incident took as evidence — bounded per kind, and shown as text whatever the job printed."""

from __future__ import annotations

import re

from argus.joblog import LogEvent, LogKind, events_table
from argus.report import build_report
from argus.report.collect import MAX_LOG_PER_KIND, Gatherer
from argus.report.model import JobLogView
from argus.report.page import job_log_section
from tests.report.helpers import SCRIPT, copy_store, sim

T0 = 1_767_225_600 * 10**9  # 2026-01-01 00:00:00 UTC


def _section(html: str) -> str:
    start = html.index('<section class="card job-log"')
    return html[start:html.index("</section>", start)]


def _add_logs(attempt) -> None:
    warns = [LogEvent(T0 + i * 10**9, 3, "stderr", LogKind.NCCL_WARN, "warning",
                      f"node-0000:4242:4290 [1] NCCL WARN NET/IB : Got completion from peer with error 12 (#{i})")
             for i in range(MAX_LOG_PER_KIND + 5)]
    hostile = LogEvent(T0 + 60 * 10**9 + 7 * 10**6, 5, "stderr", LogKind.EXCEPTION, "error",
                       f"ValueError: {SCRIPT} \x1b]0;pwned\x07 \u202egnp.exe at step (/job/train.py:41)")
    table = events_table([*warns, hostile], {(3, "stdout"): 1234}, "node-0000", T0)
    attempt.writer("joblog-node-0000").write("logs", table, 0)


def test_every_kind_is_shown_with_its_first_lines_and_counts_and_the_text_is_escaped(simulated, tmp_path):
    attempt = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "S")
    _add_logs(attempt)
    with Gatherer(attempt) as g:
        log = g.job_log()
    assert log.counts == {"nccl_warn": MAX_LOG_PER_KIND + 5, "exception": 1} and log.other_lines == 1234
    assert len(log.shown("nccl_warn")) == MAX_LOG_PER_KIND  # the first ones: the onset
    assert log.shown("nccl_warn")[0]["text"].endswith("(#0)")

    out = tmp_path / "r.html"
    build_report(attempt, out)
    section = _section(out.read_text())
    warns = re.search(r'<table class="log-events" data-kind="nccl_warn">(.*?)</table>', section, re.S).group(1)
    assert warns.count("<tr>") == MAX_LOG_PER_KIND + 1  # with the header row
    assert "NCCL WARN NET/IB : Got completion from peer with error 12 (#0)" in warns and "(#20)" not in warns
    assert "… 5 more in the store" in section and "1,234 other line(s)" in section
    assert "2026-01-01 00:00:00.000" in warns
    exc = re.search(r'data-kind="exception">(.*?)</table>', section, re.S).group(1)
    assert "2026-01-01 00:01:00.007" in exc and "<td>5</td>" in exc and "node-0000" in exc
    assert "<script" not in section and "&lt;script&gt;alert(1)&lt;/script&gt;" in exc
    assert "\x1b" not in section and "\\x1b]0;pwned\\x07" in exc and "\\u202egnp.exe" in exc
    assert "(a rank stopped)" in section.split('data-kind="exception"')[0].rsplit("<h4>", 1)[-1]


def test_a_store_without_a_logs_table_has_no_section_and_one_with_only_counts_says_so(simulated, tmp_path):
    attempt = sim(simulated, "compute_straggler")[0]
    with Gatherer(attempt) as g:
        assert g.job_log() is None
    assert job_log_section(None) == ""
    only_counts = job_log_section(JobLogView({}, [], other_lines=12))
    assert "No line of the job" in only_counts and "12 other line(s)" in only_counts


def test_the_section_is_bounded_by_what_it_is_given():
    rows = [{"rank": -1, "ts_ns": "bad", "host": SCRIPT, "stream": "stdout", "kind": SCRIPT, "text": "x" * 5000}]
    html = job_log_section(JobLogView({SCRIPT: 10**6}, rows))
    assert "<script" not in html and "… 999,999 more" in html and "x" * 501 not in html
    assert "<td>—</td>" in html  # a line no rank said
