"""The report and the web UI in a real headless Chromium: no console errors, plots with a
size, culprits on the incident page, hostile names shown as text with no dialog, and
screenshots of the five production cases in ``test-artifacts/screenshots/``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest

from argus.report import build_report
from argus.serve import ArgusServer, ServeConfig
from tests.report.helpers import CASES, SCRIPT, add_script_names, copy_store, report_of, sim, store_root

CHROMIUM = os.environ.get("ARGUS_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"

if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Watched:
    """A page that records console errors, uncaught exceptions and dialogs."""

    def __init__(self, browser):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def plot_sizes(self) -> dict[str, tuple[float, float]]:
        out = {}
        for i, svg in enumerate(self.page.locator("svg.plot").all()):
            box = svg.bounding_box()
            out[f"{svg.get_attribute('class')}#{i}"] = (box["width"], box["height"]) if box else (0.0, 0.0)
        return out

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def watched(browser):
    pages: list[Watched] = []

    def make() -> Watched:
        pages.append(Watched(browser))
        return pages[-1]

    yield make
    for p in pages:
        p.close()


def _assert_plots_render(w: Watched, expected: tuple[str, ...], min_marks: int = 20) -> None:
    sizes = w.plot_sizes()
    assert sizes and all(wd > 50 and ht > 50 for wd, ht in sizes.values()), sizes
    for cls in expected:
        assert any(cls in k for k in sizes), (cls, sizes)
    marks = w.page.locator("svg.plot rect, svg.plot polyline").count()
    assert marks >= min_marks


@pytest.mark.parametrize("scenario", CASES)
def test_report_of_each_production_case_loads_clean_with_plots(simulated, watched, tmp_path_factory, scenario):
    attempt, truth = sim(simulated, scenario)
    out = report_of(attempt, tmp_path_factory)
    w = watched()
    w.page.goto(out.as_uri())
    _assert_plots_render(w, ("step-time", "phase-heatmap"))
    culprits = w.page.locator("dd.culprits").first.inner_text()
    assert str(truth["faults"][0]["culprit_ranks"][0]) in culprits
    SHOTS.mkdir(parents=True, exist_ok=True)
    w.page.screenshot(path=str(SHOTS / f"{scenario}.png"), full_page=True)
    assert w.errors == [] and w.dialogs == []


def test_hostile_names_are_text_in_the_report_and_in_the_ui(simulated, watched, tmp_path):
    attempt = copy_store(sim(simulated, "compute_straggler")[0], tmp_path / "S")
    add_script_names(attempt, culprit=36)
    out = tmp_path / "hostile.html"
    build_report(attempt, out)
    w = watched()
    w.page.goto(out.as_uri())
    assert w.page.evaluate("document.querySelectorAll('script').length") == 0
    assert w.page.evaluate(f"document.body.textContent.includes({SCRIPT!r})")
    assert w.page.get_by_text(SCRIPT).count() >= 1
    assert w.errors == [] and w.dialogs == []
    with ArgusServer(ServeConfig(store=store_root(attempt), port=0, poll_s=0.5)) as server:
        server.start()
        run, att = attempt.identity.run_id, attempt.identity.attempt_id
        w2 = watched()
        w2.page.goto(f"{server.url}run/{quote(run)}/{att}")
        w2.page.locator("tr.incident-row a").first.click(timeout=60_000)
        w2.page.wait_for_selector("section.incident svg.plot.phase-heatmap", timeout=60_000)
        assert w2.page.evaluate(f"document.body.textContent.includes({SCRIPT!r})")
        assert w2.page.evaluate("document.querySelectorAll('script').length") == 1  # only the page's own
        assert w2.errors == [] and w2.dialogs == []


def test_ui_pages_go_live_and_show_the_culprits(simulated, watched, tmp_path):
    attempt, truth = sim(simulated, "masked_compute_straggler")
    root = tmp_path / "S"
    shutil.copytree(store_root(attempt), root)
    with ArgusServer(ServeConfig(store=root, port=0, poll_s=0.5)) as server:
        server.start()
        w = watched()
        w.page.goto(server.url)
        w.page.locator("tr.run-row a").first.click()
        # the first diagnosis runs in the background; the page swaps itself in when it is done
        w.page.wait_for_selector("tr.incident-row", timeout=60_000)
        _assert_plots_render(w, ("step-time",), min_marks=5)
        w.page.locator("tr.incident-row a").first.click()
        w.page.wait_for_selector("section.incident", timeout=60_000)
        shown = w.page.locator("dd.culprits").inner_text()
        assert all(str(r) in shown for r in truth["faults"][0]["culprit_ranks"])
        _assert_plots_render(w, ("phase-heatmap", "step-time", "kernel-cdf"))
        SHOTS.mkdir(parents=True, exist_ok=True)
        w.page.screenshot(path=str(SHOTS / "ui-incident-masked_compute_straggler.png"), full_page=True)
        # a new run appears on the runs page without a reload
        w.page.goto(server.url)
        assert w.page.locator("tr.run-row").count() == 1
        other = sim(simulated, "jit_stall")[0]
        shutil.copytree(other.path.parent, root / "runs" / other.identity.run_id)
        w.page.locator("tr.run-row").nth(1).wait_for(timeout=20_000)  # (the page's CSP forbids wait_for_function)
        assert w.errors == [] and w.dialogs == []


def test_the_first_screen_is_the_verdict(simulated, browser, tmp_path_factory, tmp_path):
    """Issue 24: at 1400×900 the report's first screen says what is wrong, who, what it costs
    per hour and what to do — before any fact table or chart; the UI's run page leads the same way."""
    attempt, truth = sim(simulated, "compute_straggler")
    out = report_of(attempt, tmp_path_factory)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(out.as_uri())
        banner = page.locator("section.verdict")
        box = banner.bounding_box()
        assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 900, box
        first_chart = page.locator("svg.plot").first.bounding_box()
        assert first_chart["y"] > box["y"] + box["height"]  # the verdict comes before the evidence
        who = page.locator("section.verdict .v-who").inner_text()
        assert all(str(r) in who for r in truth["faults"][0]["culprit_ranks"][:4]), who
        assert "GPU-h lost per hour" in page.locator("section.verdict .v-cost").inner_text()
        assert page.locator("section.verdict .v-action").inner_text().strip()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "report-first-screen-compute_straggler.png"))
        with ArgusServer(ServeConfig(store=store_root(copy_store(attempt, tmp_path / "S")), port=0,
                                     poll_s=0.5)) as server:
            server.start()
            page.goto(f"{server.url}run/{quote(attempt.identity.run_id)}/{attempt.identity.attempt_id}")
            page.wait_for_selector("section.verdict .v-who", timeout=60_000)
            ui_box = page.locator("section.verdict").bounding_box()
            assert ui_box["y"] + ui_box["height"] <= 900
            page.goto(server.url)
            assert page.locator("tr.run-row td.run-incidents").first.inner_text().strip()
    finally:
        page.close()
