"""`bench --plot`: chartdata's charts drawn in the terminal with plotext.

Two styles. On a terminal without NO_COLOR: colours and plotext's finer Unicode markers.
Anywhere else (a pipe, a file, a log, NO_COLOR set): no escape codes at all and only ASCII
characters (the frame's box-drawing characters mapped to + - |, ASCII markers), so the
plots read the same in a CI log or an e-mail.
"""
from __future__ import annotations

import math
from typing import Sequence

import plotext as plt

from .chartdata import LINE, Chart, Series, log2

# plotext's frame and tick characters -> ASCII
_BOX_TO_ASCII = str.maketrans({"┌": "+", "┐": "+", "└": "+", "┘": "+", "─": "-", "│": "|", "┤": "+",
                               "├": "+", "┬": "+", "┴": "+", "┼": "+",
                               # the legend's which-axis symbols: left and right
                               "Γ": "L", "⅃": "R", "⅂": "R"})
_ASCII_MARKERS = ("*", "o", "+", "x")
_ASCII_BARS = ("=", "#")  # prefill, decode
_COLORS = ("blue+", "orange+", "green+", "red+")


def render(charts: Sequence[Chart], *, width: int, color: bool) -> str:
    """Every chart as text, one after the other. color=False: ASCII only, no escape codes."""
    return "\n\n".join(render_one(chart, width=width, color=color) for chart in charts)


def render_one(chart: Chart, *, width: int, color: bool) -> str:
    plt.clear_figure()
    plt.plotsize(width, 20 if chart.kind == LINE else 16)
    plt.theme("pro" if color else "clear")
    if chart.kind == LINE:
        _line(chart, color)
    else:
        chart = bucketed(chart, columns=width - 20)
        _stacked(chart, color)
    plt.title(chart.title)
    plt.xlabel(chart.x_label)
    plt.ylabel(chart.y_label)
    text = plt.build()
    plt.clear_figure()
    if not color:
        text = plain(text)
    if chart.note:
        text += "\n" + (chart.note if color else _ascii(chart.note))
    return text


def plain(text: str) -> str:
    """No escape codes, ASCII only: box drawing mapped, anything else left over becomes '?'."""
    return _ascii(plt.uncolorize(text).translate(_BOX_TO_ASCII))


def _ascii(text: str) -> str:
    return text.encode("ascii", "replace").decode("ascii")


def _line(chart: Chart, color: bool) -> None:
    for i, s in enumerate(chart.series):
        plt.plot([log2(x) for x in s.xs], s.ys, label=s.name, color=_COLORS[i % len(_COLORS)] if color else None,
                 marker="hd" if color else _ASCII_MARKERS[i % len(_ASCII_MARKERS)])
    if chart.mark is not None:
        plt.scatter([log2(chart.mark.x)], [chart.mark.y], label=chart.mark.label, marker="A",
                    color="red+" if color else None)
    plt.xticks([log2(x) for x in chart.x_ticks], [_label(x) for x in chart.x_ticks])
    ys = [y for s in chart.series for y in s.ys]
    plt.ylim(0, _headroom(max(ys, default=0.0)))


def _stacked(chart: Chart, color: bool) -> None:
    # Stacked by overdrawing: each bar is the running total up to its series, tallest first,
    # so every series keeps a character (and colour) of its own in the legend and the bars.
    xs = chart.series[0].xs
    totals = [0.0] * len(xs)
    cumulative = []
    for s in chart.series:
        totals = [t + y for t, y in zip(totals, s.ys)]
        cumulative.append(totals)
    for i in reversed(range(len(chart.series))):
        plt.bar(xs, cumulative[i], label=chart.series[i].name, width=1.0,
                color=_COLORS[i % len(_COLORS)] if color else None,
                marker="sd" if color else _ASCII_BARS[i % len(_ASCII_BARS)])
    plt.ylim(0, _headroom(max(totals, default=0.0)))
    plt.xticks(*_integer_ticks(xs))
    if chart.right is not None:
        plt.plot(chart.right.xs, chart.right.ys, yside="right", label=chart.right.name,
                 color="red+" if color else None, marker="hd" if color else "*")
        plt.ylim(0, _headroom(max(chart.right.ys, default=0.0)), yside="right")
        plt.ylabel(chart.right_label, yside="right")


def _integer_ticks(xs: Sequence[float], most: int = 8) -> tuple[list[float], list[str]]:
    """At most `most` evenly spread whole tick numbers (plotext would print 3.0, 5.0, ...)."""
    if not xs:
        return [], []
    lo, hi = int(min(xs)), int(max(xs))
    step = max(1, math.ceil((hi - lo) / (most - 1))) if hi > lo else 1
    ticks = list(range(lo, hi + 1, step))
    return [float(t) for t in ticks], [str(t) for t in ticks]


def bucketed(chart: Chart, columns: int) -> Chart:
    """A tick timeline with more ticks than the plot has columns, as the mean per tick of
    runs of consecutive ticks: drawn one bar per tick, bars would overlap and a long decode
    phase (a few tokens a tick) would round to nothing beside a prefill spike."""
    n = len(chart.series[0].xs)
    if n <= max(1, columns):
        return chart
    size = math.ceil(n / max(1, columns))

    def mean_of(s: Series) -> Series:
        runs = [range(i, min(i + size, n)) for i in range(0, n, size)]
        return Series(s.name, [s.xs[r[0]] for r in runs], [sum(s.ys[j] for j in r) / len(r) for r in runs])

    return Chart(chart.id, f"{chart.title} (mean per tick, {size} ticks a bar)", chart.kind, chart.x_label,
                 chart.y_label, [mean_of(s) for s in chart.series],
                 right=mean_of(chart.right) if chart.right else None, right_label=chart.right_label,
                 note=chart.note)


def _label(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _headroom(top: float) -> float:
    """An upper y limit a little above the data (plotext needs top > 0)."""
    return top * 1.1 if top > 0 and math.isfinite(top) else 1.0
