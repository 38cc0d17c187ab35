import numpy as np

from argus.report.svg import Band, Series, Span, esc, fmt, hbars, heatmap, line_chart, nice_ticks, stacked_bars

SCRIPT = '<script>alert(1)</script>" onmouseover="x'


def test_user_names_are_escaped_in_text_and_attributes():
    svg = heatmap([SCRIPT], [SCRIPT], [["#fff"]], [[SCRIPT]], title=SCRIPT)
    svg += line_chart([0, 1], [Series(SCRIPT, np.array([1.0, 2.0]))], spans=[Span(0, 1, SCRIPT)], title=SCRIPT)
    svg += stacked_bars([SCRIPT], [SCRIPT], [(SCRIPT, "#000")], np.ones((1, 1, 1)))
    svg += hbars([SCRIPT], [1.0], unit=SCRIPT)
    assert "<script" not in svg and '" onmouseover' not in svg
    assert esc(SCRIPT) in svg


def test_line_chart_breaks_lines_at_gaps_and_survives_degenerate_input():
    y = np.array([1.0, np.nan, 2.0, 3.0])
    svg = line_chart([0, 1, 2, 3], [Series("s", y)], bands=[Band("b", y - 0.5, y + 0.5)])
    assert svg.count('<polyline class="series"') == 2  # one run before the gap, one after
    for x, ys in (([], np.array([])), ([5], np.array([1.0])), ([0, 1], np.array([np.nan, np.nan])),
                  ([0, 1], np.array([2.0, 2.0]))):
        out = line_chart(x, [Series("s", ys)])
        assert out.startswith("<svg") and out.endswith("</svg>")


def test_step_axes_get_whole_number_ticks_and_numbers_stay_short():
    assert all(t == int(t) for t in nice_ticks(0, 19, 8, integer=True))
    assert nice_ticks(0, 3, 8, integer=True) == [0, 1, 2, 3]
    assert fmt(1500.0) == "1.5k" and fmt(0.012345) == "0.0123" and fmt(float("nan")) == "—" and fmt(None) == "—"


def test_log_axis_covers_decades():
    svg = line_chart(np.geomspace(0.1, 100, 50), [Series("cdf", np.linspace(0, 1, 50))], log_x=True)
    for label in (">0.1<", ">1<", ">10<", ">100<"):
        assert label in svg
