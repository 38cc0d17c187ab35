"""The report's charts: report data and evidence entries → SVG strings.

Evidence dicts come from several analysis levels and grow new fields over time, so every
reader here uses ``.get`` and returns None when a chart cannot be drawn instead of failing
the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from argus.report.model import KernelCdfs, PhaseHeatmap, ReportData
from argus.report.svg import (CULPRIT, PALETTE, Band, Series, Span, diverging_color, esc, fmt, hbars, heatmap,
                              line_chart, sequential_color, stacked_bars)

__all__ = ["Figure", "step_time_chart", "phase_heatmap_chart", "w1_matrix_chart", "cdf_chart", "pipeline_chart",
           "what_if_chart", "critical_path_chart", "L1_COLORS"]

L1_COLORS = {"regression": "#d62728", "jitter": "#ff7f0e", "warmup": "#9e9e9e", "checkpoint": "#1f77b4"}
MAX_W1_RANKS = 40


@dataclass(frozen=True, slots=True)
class Figure:
    """An SVG chart and its caption (plain text: escaped when rendered)."""

    svg: str
    caption: str = ""
    heading: str = ""

    def html(self) -> str:
        head = f'<p class="fig-title">{esc(self.heading)}</p>' if self.heading else ""
        cap = f"<figcaption>{esc(self.caption)}</figcaption>" if self.caption else ""
        return f'<figure>{head}<div class="scroll">{self.svg}</div>{cap}</figure>'


def _floats(v: Any) -> np.ndarray | None:
    try:
        a = np.asarray(v, np.float64)
    except (TypeError, ValueError):
        return None
    return a if a.ndim == 1 and a.size else None


def step_time_chart(data: ReportData, highlight: tuple[int, int] | None = None, width: int = 860) -> Figure:
    s = data.series
    spans = [Span(float(w["start_step"]) - 0.5, float(w["end_step"]) + 0.5,
                  f'{w.get("kind", "?")} steps {w["start_step"]}–{w["end_step"]} ×{fmt(w.get("magnitude"))}',
                  L1_COLORS.get(str(w.get("kind")), "#ffbf00"))
             for w in data.l1_windows if isinstance(w.get("start_step"), int) and isinstance(w.get("end_step"), int)]
    if highlight is not None:
        spans.append(Span(highlight[0] - 0.5, highlight[1] + 0.5, f"incident steps {highlight[0]}–{highlight[1]}",
                          CULPRIT))
    per = f" (max of {s.steps_per_point} steps per point)" if s.steps_per_point > 1 else ""
    bands = [Band("p10–p90 across ranks", s.p10_s, s.p90_s)] if len(s.steps) else []
    hlines = [(data.baseline_s, f"baseline {data.baseline_s:.3f} s")] if data.baseline_s else []
    svg = line_chart(s.steps, [Series("job step time (median rank)" + per, s.job_s)], bands=bands, spans=spans,
                     hlines=hlines, title="step time over steps", x_label="step", y_label="seconds",
                     css_class="step-time", markers=True, width=width, integer_x=True)
    return Figure(svg, "Shaded: L1 windows (hover for detail)" + (", the incident's steps in red" if highlight else "")
                  + ". Band: p10–p90 of the ranks' own step durations.")


def phase_heatmap_chart(h: PhaseHeatmap) -> Figure:
    colors = [[diverging_color(v) for v in row] for row in h.ratio]
    tips = [[f"{label} · {col}: {fmt(ms)} ms mean, {fmt(r, 2)}× peer median"
             for col, ms, r in zip(h.columns, ms_row, r_row)]
            for label, ms_row, r_row in zip(h.row_labels, h.mean_ms, h.ratio)]
    shown = len(h.row_labels) - len(h.culprit_rows) - 3
    legend = (f"Mean duration per phase over steps {h.steps[0]}–{h.steps[1]}, divided by the peers' median of that "
              f"phase: blue 0.5× · white 1× · red ≥ 4× (hover a cell for ms). Culprits in red, then {shown} evenly "
              f"sampled of {h.peers_total} peers, then peer quantiles over {h.peers_sampled} peers.")
    svg = heatmap(h.row_labels, h.columns, colors, tips, highlight_rows=h.culprit_rows, separators=h.separators,
                  title="rank × phase: mean duration relative to peers", css_class="phase-heatmap", label_width=230)
    return Figure(svg, legend)


def w1_matrix_chart(ev: dict[str, Any]) -> Figure | None:
    ranks = [int(r) for r in ev.get("ranks") or []]
    m = ev.get("w1_ms")
    try:
        mat = np.asarray(m, np.float64)
    except (TypeError, ValueError):
        return None
    if not ranks or mat.ndim != 2 or mat.shape != (len(ranks), len(ranks)):
        return None
    culprits = {int(r) for r in ev.get("culprits") or []}
    if len(ranks) > MAX_W1_RANKS:  # keep every culprit, then the first peers
        keep = [i for i, r in enumerate(ranks) if r in culprits][:MAX_W1_RANKS]
        keep += [i for i, r in enumerate(ranks) if r not in culprits][:MAX_W1_RANKS - len(keep)]
        keep.sort()
        ranks, mat = [ranks[i] for i in keep], mat[np.ix_(keep, keep)]
    top = float(np.nanmax(mat)) if np.isfinite(mat).any() else 0.0
    labels = [f"rank {r}" for r in ranks]
    colors = [[sequential_color(np.sqrt(v / top) if top > 0 else 0.0) for v in row] for row in mat]
    tips = [[f"W₁(rank {a}, rank {b}) = {fmt(v)} ms" for b, v in zip(ranks, row)] for a, row in zip(ranks, mat)]
    kernel = str(ev.get("kernel", "?"))
    title = f"W₁ distance matrix of {kernel} (stream {ev.get('stream', '?')})"
    svg = heatmap(labels, labels, colors, tips, highlight_rows=[i for i, r in enumerate(ranks) if r in culprits],
                  title=title, css_class="w1-matrix", label_width=80)
    return Figure(svg, f"W₁ between the ranks' reconstructed duration distributions: white 0 · dark {fmt(top)} ms. "
                       "Culprits in red.", title)


def cdf_chart(k: KernelCdfs) -> Figure:
    series = [Series(f"peers median ({k.n_peers} ranks)", k.peer_median, PALETTE[0], 2.0)]
    shades = ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f")
    series += [Series(f"rank {r} (culprit)", c, shades[i % len(shades)], 2.0) for i, (r, c) in enumerate(k.culprits)]
    title = f"duration CDF of {k.kernel} (stream {k.stream}), steps {k.steps[0]}–{k.steps[1]}"
    svg = line_chart(k.grid_ms, series, bands=[Band("peers p10–p90", k.peer_lo, k.peer_hi)], title=title,
                     x_label="kernel duration, ms (log)", y_label="fraction of launches", log_x=True, y_min=0.0,
                     y_max=1.0, css_class="kernel-cdf")
    return Figure(svg, "Reconstructed from the kernel summaries (count-weighted log-normal modes).", title)


def pipeline_chart(ev: dict[str, Any]) -> Figure | None:
    stages = [s for s in ev.get("stages") or [] if isinstance(s, dict)]
    if not stages:
        return None
    has_peers = any("peer_busy_ms" in s or "peer_bubble_ms" in s for s in stages)
    vals = np.zeros((len(stages), 2 if has_peers else 1, 2))
    cats = []
    origin = ev.get("origin_stage")
    highlight = []
    for i, s in enumerate(stages):
        vals[i, 0] = [s.get("busy_ms") or 0.0, s.get("bubble_ms") or 0.0]
        if has_peers:
            vals[i, 1] = [s.get("peer_busy_ms") or 0.0, s.get("peer_bubble_ms") or 0.0]
        stage = s.get("stage", i)
        cats.append(f"stage {stage}" + (f" · rank {s['rank']}" if "rank" in s else ""))
        if origin is not None and stage == origin:
            highlight.append(i)
    step = f" step {ev['step']}" if "step" in ev else ""
    amp = f", amplification ×{fmt(ev['amplification'], 2)}" if isinstance(ev.get("amplification"), (int, float)) else ""
    title = f"pipeline busy vs bubble per stage{step}{amp}"
    svg = stacked_bars(cats, ["culprit's pipeline", "peers"] if has_peers else ["pipeline"],
                       [("busy", "#1f77b4"), ("bubble", "#f28e2b")], vals, highlight=highlight, title=title,
                       y_label="ms", css_class="pipeline")
    return Figure(svg, "Per stage: busy (own compute) and bubble (waiting) time of the culprit's pipeline"
                  + (", faded: the same stage's peers" if has_peers else "") + "; the origin stage is shaded red.",
                  title)


def what_if_chart(ev: dict[str, Any]) -> Figure | None:
    steps, actual, without = (_floats(ev.get(k)) for k in ("steps", "step_s", "without_fault_s"))
    if steps is None or actual is None or without is None or not (len(steps) == len(actual) == len(without)):
        return None
    svg = line_chart(steps, [Series("step time", actual, CULPRIT, 2.0),
                             Series("without the fault (culprit at peer medians)", without, PALETTE[2], 2.0, "5 3")],
                     title="what-if: step time with and without the culprit's excess", x_label="step",
                     y_label="seconds", css_class="what-if", markers=True, y_min=0.0, integer_x=True)
    return Figure(svg, str(ev.get("note") or ""))


def critical_path_chart(ev: dict[str, Any], culprits: set[int] | None = None) -> Figure | None:
    rows = [r for r in ev.get("by_rank") or [] if isinstance(r, dict) and "rank" in r]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: -float(r.get("share") or 0.0))[:16]
    shares = [100.0 * float(r.get("share") or 0.0) for r in rows]
    hl = [i for i, r in enumerate(rows) if r.get("rank") in (culprits or set())] or [0]
    svg = hbars([f"rank {r['rank']}" for r in rows], shares, highlight=hl, unit="%",
                title="critical path share by rank", css_class="critical-path")
    step = f" in step {ev['step']}" if "step" in ev else ""
    return Figure(svg, f"Share of the critical path{step} spent in each rank's own work. " + str(ev.get("note") or ""))
