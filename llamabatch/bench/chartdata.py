"""What `bench --plot` and `bench --html` draw, as plain data: one `Chart` per picture.

Both renderers (termplot.py for the terminal, svgchart.py for the HTML report) draw the
same list, built here from a bench JSON document alone, so a report made later from
`--from-json` shows exactly what the run showed. The charts:

* S_TG against B, with the slot count `n_parallel auto` would pick from this curve marked
  (autoslots' own rule: the smallest count within 5% of the best decode speed);
* TTFT and TPOT percentiles (median, p99) against B;
* one tick timeline per level: tokens per tick split into prefill and decode, with the
  tick's llama_decode time (eval ms) on a second axis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..llama.autoslots import NEAR_BEST, pick

LINE = "line"  # y against B, B on a log2 axis (levels are usually powers of two)
STACKED = "stacked"  # bars per tick, the series stacked, plus an optional line on a right axis


@dataclass
class Series:
    name: str
    xs: list[float]
    ys: list[float]


@dataclass
class Mark:
    """One point called out on a line chart (the auto choice)."""

    x: float
    y: float
    label: str


@dataclass
class Chart:
    id: str  # stable, for tests and anchors: "stg", "ttft", "tpot", "ticks-b8"
    title: str
    kind: str  # LINE or STACKED
    x_label: str
    y_label: str
    series: list[Series]
    right: Series | None = None  # STACKED: drawn as a line against a right-hand axis
    right_label: str = ""
    mark: Mark | None = None
    x_ticks: list[float] = field(default_factory=list)  # LINE: the levels, labelled as they are
    note: str = ""  # one line under the chart


def auto_pick(levels: Sequence[dict[str, Any]]) -> int | None:
    """The B `n_parallel auto` would choose from this run's S_TG curve: autoslots.pick, the
    rule it applies to its own calibration (decode tokens per second at each slot count),
    bounded by the largest level measured. None when no level decoded anything."""
    measured = {int(level["n_parallel"]): float(level["batched"]["speed_tg"]) for level in levels}
    if not measured or max(measured.values()) <= 0:
        return None
    return pick(measured, max(measured))


def stg_chart(levels: Sequence[dict[str, Any]], default_levels: Sequence[dict[str, Any]] = ()) -> Chart:
    """default_levels: bench --deterministic's runs of the default engine, drawn beside."""
    bs = [float(level["n_parallel"]) for level in levels]
    speeds = [float(level["batched"]["speed_tg"]) for level in levels]
    series = [Series("S_TG", bs, speeds)]
    if default_levels:
        series[0].name = "S_TG deterministic"
        series.append(Series("S_TG default", [float(lv["n_parallel"]) for lv in default_levels],
                             [float(lv["batched"]["speed_tg"]) for lv in default_levels]))
    chart = Chart("stg", "Decode speed S_TG against B", LINE, "B (slots, log2 axis)", "S_TG tok/s",
                  series, x_ticks=sorted(set(bs)))
    chosen = auto_pick(levels)
    if chosen is not None:
        y = speeds[bs.index(float(chosen))]
        chart.mark = Mark(float(chosen), y, f"auto: B={chosen}")
        chart.note = (f"auto marks B={chosen}: the smallest B within {1 - NEAR_BEST:.0%} of the best S_TG "
                      f"({max(speeds):.1f} tok/s), the rule n_parallel auto applies to its calibration")
    return chart


def latency_chart(levels: Sequence[dict[str, Any]], metric: str) -> Chart:
    """metric: "ttft" or "tpot"; median and p99 in ms against B."""
    bs = [float(level["n_parallel"]) for level in levels]
    name = metric.upper()
    series = [Series(f"{name} {label}", bs, [float(level["latency"][f"{stat}_{metric}_ms"]) for level in levels])
              for label, stat in (("p50", "median"), ("p99", "p99"))]
    what = "time to first token" if metric == "ttft" else "time per output token"
    return Chart(metric, f"{name} ({what}) against B", LINE, "B (slots, log2 axis)", f"{name} ms",
                 series, x_ticks=sorted(set(bs)))


def timeline_chart(level: dict[str, Any]) -> Chart:
    ticks = level["ticks"]
    xs = [float(t["tick"]) for t in ticks]
    b = level["n_parallel"]
    s = level["tick_summary"]
    return Chart(f"ticks-b{b}", f"Tick timeline, B={b}: tokens per tick and eval ms", STACKED, "tick",
                 "tokens per tick",
                 [Series("prefill", xs, [float(t["prefill_tokens"]) for t in ticks]),
                  Series("decode", xs, [float(t["decode_tokens"]) for t in ticks])],
                 right=Series("eval ms", xs, [float(t["eval_ms"]) for t in ticks]), right_label="eval ms",
                 note=(f"{len(ticks)} ticks; {s['mixed_share']:.0%} mixed prefill with decode; "
                       f"mean eval {s['mean_eval_ms']:.2f} ms per tick" + _graph_runs(ticks)))


def _graph_runs(ticks: Sequence[dict[str, Any]]) -> str:
    """How many graph runs (ubatches) llama_decode made per tick, where the document records it
    (documents written before the engine counted them do not)."""
    runs = [t["ubatches"] for t in ticks if isinstance(t.get("ubatches"), int) and t["ubatches"] > 0]
    if not runs or len(runs) < len(ticks):
        return ""
    return f", {sum(runs) / len(runs):.2f} graph runs (ubatches) per tick, at most {max(runs)}"


def charts(document: dict[str, Any]) -> list[Chart]:
    """Every chart of a bench document, in the order both renderers show them."""
    # B ascending, so lines run left to right whatever order --parallel listed the levels in
    levels = sorted(document["levels"], key=lambda level: level["n_parallel"])
    default_levels = sorted(document.get("default_levels") or [], key=lambda level: level["n_parallel"])
    out = [stg_chart(levels, default_levels), latency_chart(levels, "ttft"), latency_chart(levels, "tpot")]
    seen: dict[int, int] = {}
    for level in levels:
        chart = timeline_chart(level)
        seen[level["n_parallel"]] = seen.get(level["n_parallel"], 0) + 1
        if seen[level["n_parallel"]] > 1:  # --parallel 4,4: each run keeps a chart of its own
            chart.id += f"-{seen[level['n_parallel']]}"
        out.append(chart)
    return out


def log2(x: float) -> float:
    """Where B sits on a log2 axis (B >= 1 always: levels are validated as integers >= 1)."""
    return math.log2(x) if x > 0 else 0.0
