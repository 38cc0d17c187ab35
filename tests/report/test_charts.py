"""Evidence of every kind renders, including hand-made L4/L5 entries with missing keys."""

import numpy as np

from argus.report.charts import critical_path_chart, pipeline_chart, w1_matrix_chart, what_if_chart
from argus.report.model import IncidentView
from argus.report.page import incident_section

SCRIPT = "<script>alert(1)</script>"

PIPELINE = {"level": "L4", "kind": "pipeline", "step": 7, "origin_stage": 1, "origin_rank": 9, "amplification": 1.4,
            "stages": [{"stage": 0, "rank": 1, "busy_ms": 90.0, "bubble_ms": 40.0, "peer_busy_ms": 88.0,
                        "peer_bubble_ms": 20.0},
                       {"stage": 1, "rank": 9, "busy_ms": 170.0, "bubble_ms": 5.0},  # peers' keys missing
                       {"stage": 2, "busy_ms": 91.0}]}  # rank and bubble missing
STACKS = {"level": "L5", "kind": "stacks", "rank": 9, "cause": "jit_compile", "samples": 40,
          "top_frames": [{"frames": f"main (train.py:1);step (train.py:9);{SCRIPT} (x.py:3)", "samples": 30},
                         {"frames": "gc_collect", "samples": 10}]}
WHAT_IF = {"level": "L4", "kind": "what_if", "steps": [5, 6, 7], "step_s": [1.4, 1.5, 1.4],
           "without_fault_s": [1.0, 1.0, 1.01], "slowdown_pct": 41.0, "gpu_hours_lost": 2.5, "extra_s": 12.0}
IDLE = {"level": "L4", "kind": "gpu_idle", "rank": 9, "step": 5, "phase": SCRIPT, "microbatch": 7, "phase_ms": 6300.0,
        "gpu_busy_ms": 95.0, "idle_pct": 98.5}
CRIT = {"level": "L4", "kind": "critical_path", "step": 5,
        "by_rank": [{"rank": 3, "share": 0.2}, {"rank": 9, "share": 0.7}]}
W1 = {"level": "L3", "kind": "w1_matrix", "kernel": SCRIPT, "stream": 7, "ranks": [1, 9, 17], "culprits": [9],
      "w1_ms": [[0, 5, 0.1], [5, 0, 5], [0.1, 5, 0]]}


def test_pipeline_chart_tolerates_missing_keys_and_marks_the_origin_stage():
    fig = pipeline_chart(PIPELINE)
    assert fig is not None and fig.svg.count('class="bar"') >= 5
    assert 'font-weight="bold" fill="#b00">' in fig.svg and "stage 1" in fig.svg
    assert pipeline_chart({"kind": "pipeline"}) is None and pipeline_chart({"stages": "nonsense"}) is None


def test_what_if_and_critical_path_charts_need_consistent_arrays():
    assert what_if_chart(WHAT_IF) is not None
    assert what_if_chart({**WHAT_IF, "without_fault_s": [1.0]}) is None and what_if_chart({}) is None
    fig = critical_path_chart(CRIT, culprits={9})
    assert fig is not None and fig.svg.index("rank 9") < fig.svg.index("rank 3")  # largest share first
    assert critical_path_chart({"by_rank": []}) is None


def test_w1_matrix_keeps_every_culprit_when_truncated():
    n = 60
    ranks = list(range(n))
    ev = {"kernel": "k", "stream": 1, "ranks": ranks, "culprits": [55, 59], "w1_ms": np.ones((n, n)).tolist()}
    fig = w1_matrix_chart(ev)
    assert fig is not None and ">rank 55<" in fig.svg and ">rank 59<" in fig.svg and ">rank 45<" not in fig.svg
    assert w1_matrix_chart({**ev, "w1_ms": [[1.0]]}) is None


def test_incident_section_renders_every_kind_and_escapes_user_strings():
    inc = {"id": "inc-1", "class": "host_stall", "state": "confirmed", "severity": "critical", "culprit_ranks": [9],
           "hosts": [f"host{SCRIPT}"], "gpus": [], "window": {"start_step": 5, "end_step": 7}, "steps": [5],
           "phase": SCRIPT, "kernels": [SCRIPT], "impact": {"slowdown_pct": 41.0, "gpu_hours_lost": None},
           "action": "raise_trace_fidelity", "summary": f"stalled in {SCRIPT}",
           "evidence": [PIPELINE, STACKS, WHAT_IF, IDLE, CRIT, W1, {"level": "L9", "kind": "future", "x": SCRIPT}, 7]}
    html = incident_section(IncidentView(inc), lambda f: f.rel_path)
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for cls in ("pipeline", "what-if", "critical-path", "w1-matrix", "stacks", "gpu-idle"):
        assert f'class="plot {cls}"' in html or f'class="{cls}"' in html, cls
    assert "jit_compile" in html and "98.5" in html and "ui.perfetto.dev" in html and "future" in html


def test_incident_section_survives_a_bare_incident():
    html = incident_section(IncidentView({"id": "x"}), lambda f: f.rel_path)
    assert 'class="card incident"' in html
