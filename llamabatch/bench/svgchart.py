"""chartdata's charts as inline SVG, for the self-contained HTML report (no library, no script).

Every drawn value also sits in data attributes (data-chart on the <svg>, data-series on
each series' group, data-x / data-y on every point and bar, with the exact float), so a
test or a script can read the numbers back from the report and compare them with the JSON.
"""
from __future__ import annotations

import math
from html import escape
from typing import Sequence

from .chartdata import LINE, Chart, log2

# line charts sit two to a row in the report, timelines take the whole row
LINE_SIZE, STACKED_SIZE = (470, 300), (960, 280)
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 44, 50
STACKED_RIGHT = 64  # room for the eval ms axis
PALETTE = ("#4477aa", "#ee7733", "#228833", "#aa3377")
RIGHT_COLOR = "#cc3311"
MARK_COLOR = "#cc3311"


def render(chart: Chart) -> str:
    """One chart as an <svg> element (text, no XML declaration: it goes inside HTML)."""
    return _line(chart) if chart.kind == LINE else _stacked(chart)


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 x 10^k) up to at least `top`."""
    if not (top > 0 and math.isfinite(top)):
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def _num(value: float) -> str:
    """A tick label: no trailing .0, at most 3 significant decimals."""
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.3g}"


def _attr(value: float) -> str:
    return repr(float(value))  # exact: the test compares with the JSON


class _Frame:
    """Maps data to pixels inside the plot area, and draws its axes."""

    def __init__(self, size: tuple[int, int], x_lo: float, x_hi: float, y_ticks: list[float], right: int = RIGHT):
        self.width, self.height = size
        height = self.height
        self.x_lo, self.x_hi = x_lo, x_hi if x_hi > x_lo else x_lo + 1
        self.y_ticks = y_ticks
        self.y_top = y_ticks[-1] or 1.0
        self.x0, self.x1 = LEFT, self.width - right
        self.y0, self.y1 = height - BOTTOM, TOP

    def x(self, value: float) -> float:
        return self.x0 + (value - self.x_lo) / (self.x_hi - self.x_lo) * (self.x1 - self.x0)

    def y(self, value: float, top: float | None = None) -> float:
        return self.y0 - value / (top or self.y_top) * (self.y0 - self.y1)

    def grid(self, y_label: str) -> list[str]:
        out = []
        for t in self.y_ticks:
            y = self.y(t)
            out.append(f'<line class="grid" x1="{self.x0}" x2="{self.x1}" y1="{y:.1f}" y2="{y:.1f}"/>')
            out.append(f'<text class="tick" x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{_num(t)}</text>')
        out.append(f'<line class="axis" x1="{self.x0}" x2="{self.x1}" y1="{self.y0}" y2="{self.y0}"/>')
        out.append(f'<line class="axis" x1="{self.x0}" x2="{self.x0}" y1="{self.y0}" y2="{self.y1}"/>')
        out.append(f'<text class="label" transform="translate(16 {(self.y0 + self.y1) / 2:.1f}) rotate(-90)" '
                   f'text-anchor="middle">{escape(y_label)}</text>')
        return out

    def x_axis(self, ticks: Sequence[tuple[float, str]], x_label: str) -> list[str]:
        out = []
        for value, label in ticks:
            x = self.x(value)
            out.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{self.y0}" y2="{self.y0 + 5}"/>')
            out.append(f'<text class="tick" x="{x:.1f}" y="{self.y0 + 18}" text-anchor="middle">{escape(label)}</text>')
        out.append(f'<text class="label" x="{(self.x0 + self.x1) / 2:.1f}" y="{self.height - 10}" '
                   f'text-anchor="middle">{escape(x_label)}</text>')
        return out


def _open(chart: Chart, size: tuple[int, int]) -> list[str]:
    width, height = size
    return [f'<svg class="chart" data-chart="{escape(chart.id)}" xmlns="http://www.w3.org/2000/svg" '
            f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">',
            f'<title>{escape(chart.title)}</title>',
            f'<text class="title" x="8" y="18">{escape(chart.title)}</text>']


def _legend(entries: Sequence[tuple[str, str, str]], right_edge: float) -> list[str]:
    """(name, colour, shape: "line" or "box"), in a row under the title, ending at right_edge."""
    out, x = [], right_edge
    for name, color, shape in reversed(entries):
        x -= 12 + 7 * len(name) + 18
        if shape == "box":
            out.append(f'<rect x="{x}" y="{TOP - 10}" width="12" height="10" fill="{color}"/>')
        else:
            out.append(f'<line x1="{x}" x2="{x + 12}" y1="{TOP - 5}" y2="{TOP - 5}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text class="legend" x="{x + 16}" y="{TOP - 1}">{escape(name)}</text>')
    return out


def _line(chart: Chart) -> str:
    xs = [log2(x) for x in chart.x_ticks] or [0.0]
    pad = 0.25 * (max(xs) - min(xs) or 1)  # the end points keep off the frame
    ys = [y for s in chart.series for y in s.ys]
    frame = _Frame(LINE_SIZE, min(xs) - pad, max(xs) + pad, nice_ticks(max(ys, default=0.0)))
    out = _open(chart, LINE_SIZE) + frame.grid(chart.y_label)
    out += frame.x_axis([(log2(x), _num(x)) for x in chart.x_ticks], chart.x_label)
    for i, s in enumerate(chart.series):
        color = PALETTE[i % len(PALETTE)]
        points = " ".join(f"{frame.x(log2(x)):.1f},{frame.y(y):.1f}" for x, y in zip(s.xs, s.ys))
        out.append(f'<g class="series" data-series="{escape(s.name)}">')
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in zip(s.xs, s.ys):
            out.append(f'<circle cx="{frame.x(log2(x)):.1f}" cy="{frame.y(y):.1f}" r="3.5" fill="{color}" '
                       f'data-x="{_attr(x)}" data-y="{_attr(y)}"><title>{escape(s.name)} at B={_num(x)}: '
                       f'{y:.2f}</title></circle>')
        out.append('</g>')
    if chart.mark is not None:
        m = chart.mark
        cx, cy = frame.x(log2(m.x)), frame.y(m.y)
        out.append(f'<g class="mark" data-x="{_attr(m.x)}" data-y="{_attr(m.y)}" data-label="{escape(m.label)}">')
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="8" fill="none" stroke="{MARK_COLOR}" stroke-width="2"/>')
        out.append(f'<text class="mark-label" x="{cx:.1f}" y="{cy + 22:.1f}" text-anchor="middle" '
                   f'fill="{MARK_COLOR}">{escape(m.label)}</text>')
        out.append('</g>')
    out += _legend([(s.name, PALETTE[i % len(PALETTE)], "line") for i, s in enumerate(chart.series)], frame.x1)
    out.append('</svg>')
    return "\n".join(out)


def _stacked(chart: Chart) -> str:
    xs = chart.series[0].xs
    totals = [sum(v) for v in zip(*(s.ys for s in chart.series))] or [0.0]
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    frame = _Frame(STACKED_SIZE, lo - 0.5, hi + 0.5, nice_ticks(max(totals)), right=STACKED_RIGHT)
    out = _open(chart, STACKED_SIZE) + frame.grid(chart.y_label)
    step = max(1, math.ceil((hi - lo) / 8)) if hi > lo else 1
    out += frame.x_axis([(float(t), str(t)) for t in range(int(lo), int(hi) + 1, step)], chart.x_label)
    bar = max(0.5, (frame.x1 - frame.x0) / max(1.0, hi - lo + 1) * 0.85)
    base = [0.0] * len(xs)
    for i, s in enumerate(chart.series):
        color = PALETTE[i % len(PALETTE)]
        out.append(f'<g class="series" data-series="{escape(s.name)}" fill="{color}">')
        for j, (x, y) in enumerate(zip(s.xs, s.ys)):
            top, bottom = frame.y(base[j] + y), frame.y(base[j])
            out.append(f'<rect x="{frame.x(x) - bar / 2:.2f}" y="{top:.2f}" width="{bar:.2f}" '
                       f'height="{bottom - top:.2f}" data-x="{_attr(x)}" data-y="{_attr(y)}"/>')
            base[j] += y
        out.append('</g>')
    legend = [(s.name, PALETTE[i % len(PALETTE)], "box") for i, s in enumerate(chart.series)]
    if chart.right is not None:
        r = chart.right
        right_ticks = nice_ticks(max(r.ys, default=0.0))
        top = right_ticks[-1] or 1.0
        for t in right_ticks:
            out.append(f'<text class="tick" x="{frame.x1 + 6}" y="{frame.y(t, top) + 4:.1f}">{_num(t)}</text>')
        out.append(f'<line class="axis" x1="{frame.x1}" x2="{frame.x1}" y1="{frame.y0}" y2="{frame.y1}"/>')
        out.append(f'<text class="label" transform="translate({frame.width - 14} {(frame.y0 + frame.y1) / 2:.1f}) '
                   f'rotate(90)" text-anchor="middle">{escape(chart.right_label)}</text>')
        points = " ".join(f"{frame.x(x):.1f},{frame.y(y, top):.1f}" for x, y in zip(r.xs, r.ys))
        out.append(f'<g class="series right" data-series="{escape(r.name)}">')
        out.append(f'<polyline points="{points}" fill="none" stroke="{RIGHT_COLOR}" stroke-width="1.5"/>')
        for x, y in zip(r.xs, r.ys):
            out.append(f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y, top):.1f}" r="1.5" fill="{RIGHT_COLOR}" '
                       f'data-x="{_attr(x)}" data-y="{_attr(y)}"/>')
        out.append('</g>')
        legend.append((r.name, RIGHT_COLOR, "line"))
    out += _legend(legend, frame.x1)
    out.append('</svg>')
    return "\n".join(out)
