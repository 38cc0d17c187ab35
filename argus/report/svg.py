"""Inline-SVG plot primitives: line charts, heatmaps and bar charts as strings.

SVG rather than canvas so a report is a static document: it prints, scales, needs no script
and is searchable. Every string that can come from user code (phase, kernel, host, frame
names) passes through :func:`esc` — in text nodes *and* attributes — so a name such as
``<script>`` is drawn as text. Callers bound the number of marks (the report downsamples
steps and samples ranks); nothing here loops over more than a few thousand points.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from argus.text import visible

__all__ = ["esc", "fmt", "Series", "Band", "Span", "line_chart", "heatmap", "stacked_bars", "hbars",
           "diverging_color", "sequential_color", "PALETTE"]

#: Distinguishable line colours; culprits use ``CULPRIT``.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
CULPRIT = "#d62728"
_FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def esc(value: object) -> str:
    """HTML/SVG-escape anything for text or a quoted attribute; control, bidi and other
    invisible characters are shown as their escapes (``\\u202e``), as on the terminal."""
    return html.escape(visible(value), quote=True)


def fmt(v: float | None, digits: int = 3) -> str:
    """Compact number: ``1.23k``, ``0.0123``, ``—`` for missing/non-finite."""
    if v is None or not np.isfinite(v):
        return "—"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.{digits}g}M"
    if a >= 1e3:
        return f"{v / 1e3:.{digits}g}k"
    return f"{v:.{digits}g}"


@dataclass(slots=True)
class Series:
    name: str
    y: np.ndarray
    color: str = PALETTE[0]
    width: float = 1.6
    dash: str = ""


@dataclass(slots=True)
class Band:
    """A filled range between two series (e.g. p10–p90 across ranks)."""

    name: str
    lo: np.ndarray
    hi: np.ndarray
    color: str = PALETTE[0]
    opacity: float = 0.18


@dataclass(slots=True)
class Span:
    """A shaded x-range (an L1 window) with a label shown on hover and in the legend."""

    x0: float
    x1: float
    label: str
    color: str = "#ffbf00"


@dataclass(slots=True)
class _Frame:
    width: int
    height: int
    left: int = 58
    right: int = 12
    top: int = 22
    bottom: int = 34
    parts: list[str] = field(default_factory=list)

    @property
    def pw(self) -> int:
        return self.width - self.left - self.right

    @property
    def ph(self) -> int:
        return self.height - self.top - self.bottom


def _svg(frame: _Frame, title: str, css_class: str) -> str:
    return (f'<svg class="plot {esc(css_class)}" xmlns="http://www.w3.org/2000/svg" role="img" '
            f'viewBox="0 0 {frame.width} {frame.height}" width="{frame.width}" height="{frame.height}" '
            f'aria-label="{esc(title)}"><title>{esc(title)}</title>' + "".join(frame.parts) + "</svg>")


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About ``n`` round tick values covering [lo, hi] (whole numbers only if ``integer``)."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo:
        return [lo] if np.isfinite(lo) else []
    raw = (hi - lo) / max(n, 1)
    if integer:
        raw = max(raw, 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw and not (integer and m == 2.5 and mag < 10))
    start = math.ceil(lo / step) * step
    return [round(start + i * step, 12) for i in range(int((hi - start) / step + 1e-9) + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks per decade within [lo, hi] (only decades when the range is wide)."""
    if lo <= 0 or hi <= lo:
        return []
    mults = (1, 2, 5) if hi / lo < 1e3 else (1,)
    out = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        out += [m * 10.0 ** e for m in mults if lo <= m * 10.0 ** e <= hi]
    return out


class _Scale:
    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool = False):
        self.log = log
        f = (lambda v: math.log10(v)) if log else (lambda v: v)
        self.lo, self.hi = f(lo), f(hi)
        if self.hi <= self.lo:
            self.hi = self.lo + 1.0
        self.a, self.b = a, b

    def __call__(self, v: np.ndarray | float) -> np.ndarray:
        arr = np.asarray(v, np.float64)
        if self.log:
            arr = np.log10(np.maximum(arr, 1e-300))
        return self.a + (arr - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _polyline(xs: np.ndarray, ys: np.ndarray) -> list[str]:
    """Point lists for the finite runs of a series (gaps break the line)."""
    ok = np.isfinite(xs) & np.isfinite(ys)
    runs, cur = [], []
    for x, y, good in zip(xs.tolist(), ys.tolist(), ok.tolist()):
        if good:
            cur.append(f"{x:.1f},{y:.1f}")
        elif cur:
            runs.append(" ".join(cur))
            cur = []
    if cur:
        runs.append(" ".join(cur))
    return runs


def line_chart(x: Sequence[float] | np.ndarray, series: Sequence[Series], *, bands: Sequence[Band] = (),
               spans: Sequence[Span] = (), hlines: Sequence[tuple[float, str]] = (), title: str = "",
               x_label: str = "", y_label: str = "", log_x: bool = False, y_min: float | None = None,
               y_max: float | None = None, width: int = 860, height: int = 260, css_class: str = "line",
               markers: bool = False, integer_x: bool = False) -> str:
    """Lines over a shared x, with optional bands, shaded x-spans and labelled horizontal lines."""
    xs = np.asarray(x, np.float64)
    fr = _Frame(width, height)
    ys_all = [s.y for s in series] + [b.lo for b in bands] + [b.hi for b in bands] + [np.array([h for h, _ in hlines])]
    finite = np.concatenate([np.asarray(v, np.float64)[np.isfinite(np.asarray(v, np.float64))] for v in ys_all]
                            or [np.zeros(0)])
    lo = y_min if y_min is not None else (min(0.0, float(finite.min())) if finite.size else 0.0)
    hi = y_max if y_max is not None else (float(finite.max()) * 1.05 if finite.size else 1.0)
    if hi <= lo:
        hi = lo + 1.0
    xok = xs[np.isfinite(xs)]
    x_lo, x_hi = (float(xok.min()), float(xok.max())) if xok.size else (0.0, 1.0)
    if x_hi <= x_lo:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    sx = _Scale(x_lo, x_hi, fr.left, fr.left + fr.pw, log=log_x)
    sy = _Scale(lo, hi, fr.top + fr.ph, fr.top)
    p = fr.parts
    p.append(f'<rect x="{fr.left}" y="{fr.top}" width="{fr.pw}" height="{fr.ph}" fill="#fff" stroke="#ccc"/>')
    for sp in spans:
        a, b = float(sx(max(sp.x0, x_lo))), float(sx(min(sp.x1, x_hi)))
        if b < a:
            continue
        p.append(f'<rect class="span" x="{a:.1f}" y="{fr.top}" width="{max(b - a, 2.0):.1f}" height="{fr.ph}" '
                 f'fill="{esc(sp.color)}" opacity="0.14"><title>{esc(sp.label)}</title></rect>')
    _axes(fr, sx, sy, lo, hi, x_lo, x_hi, log_x, x_label, y_label, integer_x)
    for band in bands:
        top = _polyline(sx(xs), sy(np.asarray(band.hi, np.float64)))
        bot = _polyline(sx(xs), sy(np.asarray(band.lo, np.float64)))
        if len(top) == 1 and len(bot) == 1:
            pts = top[0] + " " + " ".join(reversed(bot[0].split(" ")))
            p.append(f'<polygon points="{pts}" fill="{esc(band.color)}" opacity="{band.opacity}" stroke="none">'
                     f'<title>{esc(band.name)}</title></polygon>')
    for value, label in hlines:
        yy = float(sy(value))
        if fr.top <= yy <= fr.top + fr.ph:
            p.append(f'<line x1="{fr.left}" x2="{fr.left + fr.pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#555" '
                     f'stroke-dasharray="4 3"><title>{esc(label)}</title></line>'
                     f'<text x="{fr.left + fr.pw - 4}" y="{yy - 3:.1f}" text-anchor="end" {_FONT} fill="#555">'
                     f'{esc(label)}</text>')
    for s in series:
        px, py = sx(xs), sy(np.asarray(s.y, np.float64))
        dash = f' stroke-dasharray="{esc(s.dash)}"' if s.dash else ""
        for pts in _polyline(px, py):
            p.append(f'<polyline class="series" points="{pts}" fill="none" stroke="{esc(s.color)}" '
                     f'stroke-width="{s.width}"{dash}><title>{esc(s.name)}</title></polyline>')
        if markers and len(xs) <= 200:
            for cx, cy, xv, yv in zip(px.tolist(), py.tolist(), xs.tolist(), np.asarray(s.y).tolist()):
                if np.isfinite(cy):
                    p.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.2" fill="{esc(s.color)}">'
                             f'<title>{esc(s.name)}: x={fmt(xv)} y={fmt(yv)}</title></circle>')
    _legend(fr, [(s.name, s.color) for s in series] + [(b.name, b.color) for b in bands]
            + [(sp.label, sp.color) for sp in _unique_spans(spans)])
    return _svg(fr, title, css_class)


def _unique_spans(spans: Sequence[Span]) -> list[Span]:
    seen, out = set(), []
    for s in spans:
        key = s.label.split(" ")[0]
        if key not in seen:
            seen.add(key)
            out.append(Span(s.x0, s.x1, key, s.color))
    return out


def _axes(fr: _Frame, sx: _Scale, sy: _Scale, lo: float, hi: float, x_lo: float, x_hi: float, log_x: bool,
          x_label: str, y_label: str, integer_x: bool = False) -> None:
    p = fr.parts
    for t in nice_ticks(lo, hi):
        yy = float(sy(t))
        p.append(f'<line x1="{fr.left}" x2="{fr.left + fr.pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>'
                 f'<text x="{fr.left - 4}" y="{yy + 3:.1f}" text-anchor="end" {_FONT} fill="#444">{fmt(t)}</text>')
    xt = log_ticks(x_lo, x_hi) if log_x else nice_ticks(x_lo, x_hi, 8, integer_x)
    for t in xt:
        xx = float(sx(t))
        p.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{fr.top + fr.ph}" y2="{fr.top + fr.ph + 4}" stroke="#888"/>'
                 f'<text x="{xx:.1f}" y="{fr.top + fr.ph + 15}" text-anchor="middle" {_FONT} fill="#444">'
                 f'{fmt(t)}</text>')
    if x_label:
        p.append(f'<text x="{fr.left + fr.pw / 2:.0f}" y="{fr.height - 4}" text-anchor="middle" {_FONT} '
                 f'fill="#222">{esc(x_label)}</text>')
    if y_label:
        p.append(f'<text transform="translate(12 {fr.top + fr.ph / 2:.0f}) rotate(-90)" text-anchor="middle" '
                 f'{_FONT} fill="#222">{esc(y_label)}</text>')


def _legend(fr: _Frame, items: list[tuple[str, str]]) -> None:
    x = fr.left
    for name, color in items[:8]:
        label = name if len(name) <= 56 else name[:55] + "…"
        fr.parts.append(f'<rect x="{x}" y="6" width="10" height="10" fill="{esc(color)}"/>'
                        f'<text x="{x + 14}" y="15" {_FONT} fill="#222">{esc(label)}</text>')
        x += 26 + round(6.4 * len(label))
        if x > fr.width - 80:
            break


def diverging_color(ratio: float) -> str:
    """Blue below 1×, white at 1×, red above; log2 scale clipped to [0.5×, 4×]."""
    if not np.isfinite(ratio) or ratio <= 0:
        return "#f0f0f0"
    t = math.log2(ratio)
    if t >= 0:
        f = min(t / 2.0, 1.0)
        return _mix((255, 255, 255), (178, 24, 43), f)
    f = min(-t, 1.0)
    return _mix((255, 255, 255), (33, 102, 172), f)


def sequential_color(f: float) -> str:
    """White → dark red for a value in [0, 1]."""
    if not np.isfinite(f):
        return "#f0f0f0"
    return _mix((255, 255, 255), (120, 0, 30), min(max(f, 0.0), 1.0))


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], f: float) -> str:
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def heatmap(row_labels: Sequence[str], col_labels: Sequence[str], colors: Sequence[Sequence[str]],
            tips: Sequence[Sequence[str]], *, highlight_rows: Sequence[int] = (), separators: Sequence[int] = (),
            title: str = "", cell: int = 18, css_class: str = "heatmap", label_width: int = 150) -> str:
    """A grid of coloured cells with row/column labels and a tooltip per cell.

    ``colors``/``tips`` are ``[row][col]``; highlighted rows get a red label and outline;
    ``separators`` are row indices above which a thicker line is drawn."""
    n_r, n_c = len(row_labels), len(col_labels)
    col_h = min(160, 12 + 6 * max((len(c) for c in col_labels), default=4))
    fr = _Frame(label_width + n_c * cell + col_h, col_h + n_r * cell + 8, left=label_width, top=col_h, bottom=8)
    p = fr.parts
    for j, c in enumerate(col_labels):
        x = fr.left + j * cell + cell / 2 + 4
        short = c if len(c) <= 26 else c[:25] + "…"
        p.append(f'<text transform="translate({x:.1f} {col_h - 4}) rotate(-55)" {_FONT} fill="#222">'
                 f'<title>{esc(c)}</title>{esc(short)}</text>')
    hl = set(highlight_rows)
    for i, r in enumerate(row_labels):
        y: float = fr.top + i * cell
        bold = ' font-weight="bold" fill="#b00"' if i in hl else ' fill="#222"'
        p.append(f'<text x="{fr.left - 6}" y="{y + cell * 0.7:.1f}" text-anchor="end" {_FONT}{bold}>{esc(r)}</text>')
        for j in range(n_c):
            p.append(f'<rect x="{fr.left + j * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                     f'fill="{esc(colors[i][j])}"><title>{esc(tips[i][j])}</title></rect>')
        if i in hl:
            p.append(f'<rect class="culprit-row" x="{fr.left - 1}" y="{y - 1}" width="{n_c * cell + 1}" '
                     f'height="{cell + 1}" fill="none" stroke="{CULPRIT}" stroke-width="1.5"/>')
    for i in separators:
        y = fr.top + i * cell - 0.5
        p.append(f'<line x1="{fr.left - 100}" x2="{fr.left + n_c * cell}" y1="{y}" y2="{y}" stroke="#333" '
                 f'stroke-width="1.2"/>')
    return _svg(fr, title, css_class)


def stacked_bars(categories: Sequence[str], groups: Sequence[str], segments: Sequence[tuple[str, str]],
                 values: np.ndarray, *, highlight: Sequence[int] = (), title: str = "", y_label: str = "",
                 width: int = 860, height: int = 260, css_class: str = "bars") -> str:
    """Per category, one stacked bar per group. ``values[c, g, s]``: category, group, segment;
    ``segments`` are (name, colour); ``highlight`` marks categories (e.g. the origin stage)."""
    values = np.nan_to_num(np.asarray(values, np.float64), nan=0.0)
    n_c, n_g = values.shape[0], values.shape[1]
    fr = _Frame(width, height, bottom=44)
    hi = float(values.sum(axis=2).max()) * 1.08 if values.size else 1.0
    sy = _Scale(0.0, hi if hi > 0 else 1.0, fr.top + fr.ph, fr.top)
    p = fr.parts
    p.append(f'<rect x="{fr.left}" y="{fr.top}" width="{fr.pw}" height="{fr.ph}" fill="#fff" stroke="#ccc"/>')
    _axes(fr, _Scale(0, 1, fr.left, fr.left), sy, 0.0, hi, 0, 0, False, "", y_label)
    slot = fr.pw / max(n_c, 1)
    bar = min(40.0, slot * 0.8 / max(n_g, 1))
    for c in range(n_c):
        x0 = fr.left + c * slot + (slot - bar * n_g) / 2
        if c in highlight:
            p.append(f'<rect x="{fr.left + c * slot:.1f}" y="{fr.top}" width="{slot:.1f}" height="{fr.ph}" '
                     f'fill="{CULPRIT}" opacity="0.08"/>')
        for g in range(n_g):
            base = 0.0
            for s, (seg, color) in enumerate(segments):
                v = float(values[c, g, s])
                if v <= 0:
                    continue
                y1, y0 = float(sy(base + v)), float(sy(base))
                p.append(f'<rect class="bar" x="{x0 + g * bar:.1f}" y="{y1:.1f}" width="{bar - 2:.1f}" '
                         f'height="{max(y0 - y1, 0.5):.1f}" fill="{esc(color)}" opacity="{1.0 if g == 0 else 0.55}">'
                         f'<title>{esc(categories[c])} · {esc(groups[g])} · {esc(seg)}: {fmt(v)}</title></rect>')
                base += v
        weight = ' font-weight="bold" fill="#b00"' if c in highlight else ' fill="#222"'
        cx = fr.left + (c + 0.5) * slot
        lines = "".join(f'<tspan x="{cx:.1f}" dy="{0 if k == 0 else 12}">{esc(part)}</tspan>'
                        for k, part in enumerate(categories[c].split(" · ")[:2]))
        p.append(f'<text x="{cx:.1f}" y="{fr.top + fr.ph + 14}" text-anchor="middle" {_FONT}{weight}>{lines}</text>')
    _legend(fr, [(f"{g} {s}" if n_g > 1 else s, col) for g in groups[:1] for s, col in segments]
            + ([(f"{groups[1]} (faded)", "#aaa")] if n_g > 1 else []))
    return _svg(fr, title, css_class)


def hbars(labels: Sequence[str], values: Sequence[float], *, highlight: Sequence[int] = (), title: str = "",
          unit: str = "", width: int = 560, css_class: str = "hbars") -> str:
    """Horizontal bars, one per label (critical-path shares, top frames)."""
    n = len(labels)
    fr = _Frame(width, 14 + n * 18 + 10, left=170, top=8, bottom=8)
    vmax = max([float(v) for v in values if np.isfinite(v)] + [1e-12])
    hl = set(highlight)
    for i, (lab, v) in enumerate(zip(labels, values)):
        y = fr.top + i * 18
        w = max(float(v) / vmax * (fr.pw - 60), 0.0) if np.isfinite(v) else 0.0
        color = CULPRIT if i in hl else PALETTE[0]
        fr.parts.append(f'<text x="{fr.left - 6}" y="{y + 12}" text-anchor="end" {_FONT} fill="#222">{esc(lab)}</text>'
                        f'<rect class="bar" x="{fr.left}" y="{y + 2}" width="{max(w, 1):.1f}" height="13" '
                        f'fill="{color}"><title>{esc(lab)}: {fmt(v)}{esc(unit)}</title></rect>'
                        f'<text x="{fr.left + w + 4:.1f}" y="{y + 12}" {_FONT} fill="#444">{fmt(v)}{esc(unit)}</text>')
    return _svg(fr, title, css_class)
