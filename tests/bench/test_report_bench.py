import json

from argus.cli.main import main
from tests.report.helpers import sim, store_root


def test_bench_report_prints_one_json_line_with_wall_time_and_size(simulated, capsys):
    attempt, _ = sim(simulated, "compute_straggler")
    assert main(["bench", "report", "--store", str(store_root(attempt))]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert row["bench"] == "report" and row["ranks"] == 64 and row["incidents"] >= 1
    assert row["file_bytes"] > 10_000 and row["wall_s"] >= row["diagnosis_s"] > 0
