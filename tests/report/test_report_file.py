"""``argus report`` end to end on simulated stores: one self-contained file, plots, culprits,
escaping, evidence links, CLI errors."""

import re
from html import unescape
from pathlib import Path

import pytest

from argus.cli.main import main
from argus.report import build_report
from argus.store import Store
from tests.report.helpers import CASES, SCRIPT, add_script_names, copy_store, sim, write_evidence

PERFETTO = "https://ui.perfetto.dev"


def external_resources(html: str) -> list[str]:
    """Everything that would make the browser fetch or run something from elsewhere."""
    found = re.findall(r'(?:src|href|action|xlink:href)\s*=\s*"([^"]*)"', html)
    bad = [u for u in found if re.match(r"^(https?:)?//", u) and u != PERFETTO]
    bad += re.findall(r"<script\b|<link[^>]+stylesheet|@import|url\(|<iframe|<object|<embed", html)
    return bad


@pytest.mark.parametrize("scenario", CASES)
def test_report_is_one_self_contained_file_with_plots_and_the_culprits(reported, scenario):
    attempt, truth, path, html = reported(scenario)
    assert external_resources(html) == []
    assert "Content-Security-Policy" in html and "default-src 'none'" in unescape(html)
    assert f'href="{PERFETTO}"' in html
    for cls in ("step-time", "phase-heatmap"):
        svg = re.search(rf'<svg class="plot {cls}".*?</svg>', html, re.S)
        assert svg and re.search(r"<(polyline|rect)\b", svg.group(0)), cls
    culprits = {r for f in truth["faults"] for r in f["culprit_ranks"]}
    header = re.search(r'<dd class="culprits">(.*?)</dd>', html, re.S).group(1)
    shown = {int(r) for r in re.findall(r"\d+", re.sub(r"<[^>]+>", " ", header))}
    assert culprits <= shown
    assert path.stat().st_size < 2_000_000


def test_kernel_evidence_becomes_w1_matrix_and_cdf_plots(reported):
    _, _, _, html = reported("compute_straggler")
    assert '<svg class="plot w1-matrix"' in html and '<svg class="plot kernel-cdf"' in html
    assert "L1 window" in html and "regression" in html


def test_evidence_is_tables_with_named_columns_and_the_verdict_leads(reported):
    """Issue 24: evidence as a table per kind with a column per field, not ``k=v`` strings; the
    page opens with the verdict (who, cost per hour, what to do), before the run facts."""
    _, truth, _, html = reported("compute_straggler")
    table = re.search(r'<table class="evidence-busy_outlier"><tr>(.*?)</tr>', html, re.S)
    assert table, "no busy_outlier evidence table"
    heads = re.findall(r"<th>(.*?)</th>", table.group(1))
    assert {"rank", "phase", "ratio", "excess_s"} <= set(heads)
    assert not re.search(r"excess_s=\d", html)  # no k=v strings left
    verdict = html.index('<section class="verdict')
    assert verdict < html.index('<section class="card summary"')
    banner = re.sub(r"<[^>]+>", " ", html[verdict:html.index("</section>", verdict)])
    assert str(truth["faults"][0]["culprit_ranks"][0]) in banner and "GPU-h lost per hour" in banner


def test_hostile_phase_and_kernel_names_render_as_text(simulated, tmp_path):
    attempt = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "S")
    add_script_names(attempt, culprit=36)
    out = tmp_path / "r.html"
    build_report(attempt, out)
    html = out.read_text()
    assert SCRIPT not in html and "<script" not in html
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert html.count(escaped) >= 3
    assert re.search(r'<svg class="plot phase-heatmap".*?' + re.escape(escaped), html, re.S)  # inside SVG text
    assert re.search(r'<svg class="plot kernel-cdf"[^>]*aria-label="duration CDF of ' + re.escape(escaped), html)


def test_evidence_files_of_the_incident_window_are_listed_relative_to_the_report(simulated, tmp_path):
    attempt = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "S")
    inside = write_evidence(attempt, "node-0004", window=1)  # steps 5–9: inside the incident
    before = write_evidence(attempt, "node-0004", window=0)  # steps 0–4: before it
    out = tmp_path / "reports" / "r.html"
    build_report(attempt, out)
    html = out.read_text()
    hrefs = re.findall(r'class="evidence-file" href="([^"]+)"', html)
    assert len(hrefs) == 1 and (out.parent / hrefs[0]).resolve() == inside.resolve()
    assert before.name not in html
    assert "ui.perfetto.dev" in html


def test_cli_writes_the_report_and_fails_clearly_on_a_bad_store(simulated, tmp_path, capsys):
    attempt, _ = sim(simulated, "jit_stall")
    out = tmp_path / "jit.html"
    assert main(["report", str(attempt.path.parents[2]), "--out", str(out)]) == 0
    assert out.exists() and "host_stall" in out.read_text()
    assert main(["report", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no such store directory" in capsys.readouterr().err
    assert main(["report", str(attempt.path.parents[2]), "--run", "nope", "--out", str(out)]) == 2
    assert "no run attempt matching run=nope" in capsys.readouterr().err
    assert main(["report", str(attempt.path.parents[2]), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_healthy_job_reports_no_incident(simulated, tmp_path):
    attempt, _ = sim(simulated, "healthy")
    out = tmp_path / "h.html"
    res = build_report(attempt, out)
    assert res.incidents == 0 and "No incident" in out.read_text()
    assert Path(out).read_text().count("<svg") >= 1


def test_the_report_names_what_the_store_could_not_give(simulated, tmp_path):
    attempt = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "S")
    victim = sorted((attempt.path / "steps").rglob("*.parquet"))[1]
    victim.write_bytes(victim.read_bytes()[:100])  # torn by a crash
    out = tmp_path / "r.html"
    build_report(Store.open(tmp_path / "S").attempt(), out)
    html = out.read_text()
    assert "not read</dt>" in html and victim.name in html
