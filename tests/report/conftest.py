from __future__ import annotations

import pytest

from tests.report.helpers import report_of, sim


@pytest.fixture(scope="session")
def reported(simulated, tmp_path_factory):
    """``reported(scenario)`` → (attempt, truth, report path, html), built once per scenario."""

    def make(scenario: str):
        attempt, truth = sim(simulated, scenario)
        out = report_of(attempt, tmp_path_factory)
        return attempt, truth, out, out.read_text()

    return make
