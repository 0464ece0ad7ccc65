"""bench --plot, --html and --from-json, from a document recorded by bench itself on the fake
runner: the HTML parsed back (every chart there, every drawn number the JSON's), the
terminal plots checked for their titles and axes, and ASCII-only where they must be."""
from __future__ import annotations

import copy
import json
from html.parser import HTMLParser

import pytest

from cli_harness import invoke
from fake_runner import FakeRunner

LEVELS = (1, 2, 4, 8)


def slow_runner(config):
    # a little time per tick, so the recorded speeds and latencies are not all noise
    return FakeRunner(n_slots=config.n_parallel, slot_ctx=config.slot_ctx, step_delay=0.002)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(json path, document, html written by the run itself, the run's stdout)."""
    folder = tmp_path_factory.mktemp("charts")
    out, html = folder / "bench.json", folder / "run.html"
    result = invoke(["bench", "--pp", "40", "--tg", "12", "--parallel", ",".join(map(str, LEVELS)), "--n-batch", "64",
                     "--json", str(out), "--html", str(html), "--plot"], runner=slow_runner)
    assert result.exit_code == 0, result.stderr
    return out, json.loads(out.read_text()), html.read_text(encoding="utf-8"), result.stdout


class ReportParser(HTMLParser):
    """Collects each chart's series points, its mark, and every table's caption and cells."""

    def __init__(self):
        super().__init__()
        self.charts: dict[str, dict] = {}
        self.chart = self.series = None
        self.tables: list[dict] = []
        self.text_target: list | None = None
        self.tags: set[str] = set()
        self.attr_values: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.attr_values.extend((tag, k, v or "") for k, v in attrs)
        if tag == "svg" and "data-chart" in a:
            self.chart = self.charts.setdefault(a["data-chart"], {"series": {}, "mark": None, "title": None})
        elif self.chart is not None and tag == "g" and "data-series" in a:
            self.series = self.chart["series"].setdefault(a["data-series"], [])
        elif self.chart is not None and tag == "g" and "mark" in (a.get("class") or "").split():
            self.chart["mark"] = (float(a["data-x"]), float(a["data-y"]), a["data-label"])
        elif self.series is not None and tag in ("circle", "rect") and "data-x" in a:
            self.series.append((float(a["data-x"]), float(a["data-y"])))
        elif tag == "table":
            self.tables.append({"caption": "", "cells": []})
        elif tag == "caption":
            self.text_target = ["caption"]
        elif tag in ("td", "th") and self.tables:
            self.tables[-1]["cells"].append("")
            self.text_target = ["cell"]
        elif tag == "title" and self.chart is not None and self.series is None and self.chart["title"] is None:
            self.text_target = ["title"]

    def handle_endtag(self, tag):
        if tag == "svg":
            self.chart = self.series = None
        elif tag == "g":
            self.series = None
        elif tag in ("caption", "td", "th", "title"):
            self.text_target = None

    def handle_data(self, data):
        if self.text_target == ["caption"]:
            self.tables[-1]["caption"] += data
        elif self.text_target == ["cell"]:
            self.tables[-1]["cells"][-1] += data
        elif self.text_target == ["title"]:
            self.chart["title"] = data


def parse(html: str) -> ReportParser:
    parser = ReportParser()
    parser.feed(html)
    parser.close()
    return parser


def expected_auto(document) -> int:
    """n_parallel auto's rule, restated: the smallest B within 5% of the best S_TG."""
    speeds = {level["n_parallel"]: level["batched"]["speed_tg"] for level in document["levels"]}
    return min(b for b, s in speeds.items() if s >= 0.95 * max(speeds.values()))


def test_every_chart_is_in_the_html_and_its_numbers_are_the_jsons(recorded):
    _, doc, html, _ = recorded
    report = parse(html)
    levels = doc["levels"]
    assert [level["n_parallel"] for level in levels] == list(LEVELS)
    assert set(report.charts) == {"stg", "ttft", "tpot"} | {f"ticks-b{b}" for b in LEVELS}
    for chart in report.charts.values():
        assert chart["title"] and chart["series"]

    stg = report.charts["stg"]
    assert stg["series"]["S_TG"] == [(float(lv["n_parallel"]), lv["batched"]["speed_tg"]) for lv in levels]
    auto = expected_auto(doc)
    speed = next(lv["batched"]["speed_tg"] for lv in levels if lv["n_parallel"] == auto)
    assert stg["mark"] == (float(auto), speed, f"auto: B={auto}")

    for metric in ("ttft", "tpot"):
        series = report.charts[metric]["series"]
        name = metric.upper()
        assert series[f"{name} p50"] == [(float(lv["n_parallel"]), lv["latency"][f"median_{metric}_ms"])
                                         for lv in levels]
        assert series[f"{name} p99"] == [(float(lv["n_parallel"]), lv["latency"][f"p99_{metric}_ms"])
                                         for lv in levels]
        assert all(y > 0 for _, y in series[f"{name} p99"])

    for level in levels:
        series = report.charts[f"ticks-b{level['n_parallel']}"]["series"]
        ticks = level["ticks"]
        assert ticks, "a level with no ticks draws nothing to compare"
        for name, key in (("prefill", "prefill_tokens"), ("decode", "decode_tokens"), ("eval ms", "eval_ms")):
            assert series[name] == [(float(t["tick"]), float(t[key])) for t in ticks], name
        runs = [t["ubatches"] for t in ticks]  # the caption says how many graph runs the ticks made
        assert min(runs) >= 1 and f"{sum(runs) / len(runs):.2f} graph runs (ubatches) per tick, at most {max(runs)}" in html
        # every prompt token was prefilled and every token after the first decoded, once
        assert sum(y for _, y in series["prefill"]) == level["batched"]["prefill_tokens"]
        assert sum(y for _, y in series["decode"]) == level["batched"]["decode_tokens"]


def test_the_html_has_the_tables_and_the_header_and_fetches_nothing(recorded):
    _, doc, html, _ = recorded
    report = parse(html)
    captions = [t["caption"] for t in report.tables]
    assert captions[:3] == ["Throughput (llama-batched-bench columns)", "Request latency (vLLM names)",
                            "Request throughput"]
    assert [c for c in captions if c.startswith("Ticks, B=")] == [f"Ticks, B={b} (all {len(lv['ticks'])})"
                                                                  for b, lv in zip(LEVELS, doc["levels"])]
    assert [c for c in captions if c.startswith("Trace, B=")] == [f"Trace, B={b}: mean per tick, by kind"
                                                                  for b in LEVELS]
    batched = report.tables[0]["cells"]
    for level in doc["levels"]:
        assert f"{level['batched']['speed_tg']:.2f}" in batched and f"{level['batched']['t']:.3f}" in batched
    assert doc["machine"]["platform"] in html and doc["model"]["name"] in html
    assert f"threads {doc['threads']}" in html and f"n_batch {doc['settings']['n_batch']}" in html
    # self-contained: no script, no linked stylesheet, image or font, no address but SVG's namespace
    assert "script" not in report.tags and "link" not in report.tags and "img" not in report.tags
    assert not [v for tag, k, v in report.attr_values if k in ("src", "href")]
    assert html.replace('xmlns="http://www.w3.org/2000/svg"', "").count("http") == 0


def test_from_json_redraws_the_same_report_and_tables_without_a_model(recorded, tmp_path):
    path, _, html, run_stdout = recorded
    again = tmp_path / "again.html"
    result = invoke(["bench", "--from-json", str(path), "--html", str(again), "--plot"], runner=slow_runner)
    assert result.exit_code == 0, result.stderr
    assert again.read_text(encoding="utf-8") == html
    # the same tables and plots as the run printed: both come from the one document
    assert result.stdout == run_stdout
    assert result.engines == []  # the factory was there and built no engine


def test_the_auto_mark_follows_n_parallel_autos_rule(recorded, tmp_path):
    _, doc, _, _ = recorded
    doc = copy.deepcopy(doc)
    # 4 is within 5% of the best (16) and 2 is not: auto takes 4, not the fastest
    for level, speed in zip(doc["levels"], (50.0, 150.0, 190.0, 199.0)):
        level["batched"]["speed_tg"] = speed
    doc["levels"].append({**copy.deepcopy(doc["levels"][-1]), "n_parallel": 16})
    doc["levels"][-1]["batched"]["speed_tg"] = 196.0
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    html = tmp_path / "r.html"
    result = invoke(["bench", "--from-json", str(path), "--html", str(html), "--plot"])
    assert result.exit_code == 0, result.stderr
    assert parse(html.read_text(encoding="utf-8")).charts["stg"]["mark"] == (4.0, 190.0, "auto: B=4")
    assert "auto: B=4" in result.stdout and "auto marks B=4" in result.stdout


def test_levels_listed_out_of_order_draw_left_to_right_and_deterministic_runs_beside(recorded, tmp_path):
    doc = copy.deepcopy(recorded[1])
    doc["default_levels"] = copy.deepcopy(doc["levels"])  # as bench --deterministic records them
    for level in doc["default_levels"]:
        level["batched"]["speed_tg"] *= 2
    doc["levels"].reverse()  # as --parallel 8,4,2,1 runs them
    path, html = tmp_path / "doc.json", tmp_path / "r.html"
    path.write_text(json.dumps(doc))
    result = invoke(["bench", "--from-json", str(path), "--html", str(html)])
    assert result.exit_code == 0, result.stderr
    series = parse(html.read_text(encoding="utf-8")).charts["stg"]["series"]
    by_b = sorted(doc["levels"], key=lambda lv: lv["n_parallel"])
    assert series["S_TG deterministic"] == [(float(lv["n_parallel"]), lv["batched"]["speed_tg"]) for lv in by_b]
    assert series["S_TG default"] == [(float(lv["n_parallel"]), 2 * lv["batched"]["speed_tg"]) for lv in by_b]
    assert "Cost of --deterministic" in result.stdout


def test_a_long_timeline_is_drawn_as_means_of_runs_of_ticks():
    from llamabatch.bench.chartdata import STACKED, Chart, Series
    from llamabatch.bench.termplot import bucketed, render_one

    xs = [float(i) for i in range(1, 301)]
    prefill = [400.0 if i % 100 == 1 else 0.0 for i in range(1, 301)]  # a spike every 100 ticks
    decode = [0.0 if p else 16.0 for p in prefill]
    chart = Chart("ticks-b16", "Tick timeline", STACKED, "tick", "tokens per tick",
                  [Series("prefill", xs, prefill), Series("decode", xs, decode)],
                  right=Series("eval ms", xs, [40.0] * 300), right_label="eval ms")
    short = bucketed(chart, columns=80)
    assert len(short.series[0].xs) == 75 and short.title == "Tick timeline (mean per tick, 4 ticks a bar)"
    for long, means in zip(chart.series + [chart.right], short.series + [short.right]):
        assert sum(means.ys) * 4 == pytest.approx(sum(long.ys))  # every tick counted once
    assert bucketed(chart, columns=300) is chart
    text = render_one(chart, width=100, color=False)
    # the decode phase shows: one tick's 16 tokens would round to nothing beside 400-token spikes
    assert "4 ticks a bar" in text
    assert any("#" in line for line in text.splitlines() if not any(w in line for w in ("decode", "prefill", "eval")))


TITLES = ("Decode speed S_TG against B", "TTFT (time to first token) against B",
          "TPOT (time per output token) against B")
AXES = ("S_TG tok/s", "B (slots, log2 axis)", "TTFT ms", "TPOT ms", "tokens per tick", "tick", "eval ms")


def plotted(stdout: str) -> str:
    """The plots: what follows the last table's summary line."""
    start = stdout.index(TITLES[0])
    return stdout[stdout.rfind("\n", 0, start) + 1:]


def test_plots_have_their_titles_axes_and_levels_and_are_ascii_in_a_pipe(recorded):
    _, doc, _, stdout = recorded
    plots = plotted(stdout)
    for text in TITLES + AXES + tuple(f"Tick timeline, B={b}: tokens per tick and eval ms" for b in LEVELS):
        assert text in plots, text
    assert f"auto: B={expected_auto(doc)}" in plots
    assert "decode" in plots and "prefill" in plots and "p50" in plots and "p99" in plots
    assert plots.isascii() and "\x1b" not in plots  # stdout was not a terminal
    # the B axis is labelled with the levels themselves, in order
    axis = next(line for line in plots.splitlines() if line.split() == [str(b) for b in LEVELS])
    assert axis


@pytest.mark.parametrize("tty, no_color, plain", [(True, "1", True), (True, "", False), (False, "", True)])
def test_colour_only_on_a_terminal_without_no_color(recorded, tty, no_color, plain):
    path = recorded[0]
    result = invoke(["bench", "--from-json", str(path), "--plot"], stdout_isatty=tty, env={"NO_COLOR": no_color})
    assert result.exit_code == 0, result.stderr
    plots = plotted(result.stdout)
    assert TITLES[0] in plots and "tokens per tick" in plots
    if plain:
        assert plots.isascii() and "\x1b" not in plots
    else:  # colour escapes and plotext's finer Unicode markers
        assert "\x1b[" in plots and not plots.isascii()


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON"),
    ("[1, 2]", "the top level is not an object"),
    ('{"levels": []}', "levels: missing or empty"),
    pytest.param("[" * 100_000 + "]" * 100_000, "deeper than", id="deep"),  # once a RecursionError traceback
    pytest.param(b"\x00\xff", "not UTF-8", id="not-utf8"),
])
def test_a_file_that_is_not_a_bench_document_is_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = invoke(["bench", "--from-json", str(path), "--plot"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"llamabatch: error: --from-json {path}: ") and message in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["levels"][1]["batched"].pop("speed_tg"), "levels[1].batched.speed_tg: missing"),
    (lambda d: d["levels"][0]["ticks"][0].update(eval_ms="fast"), "levels[0].ticks[0].eval_ms: not a finite number"),
    (lambda d: d["levels"][0].update(n_parallel=0), "levels[0].n_parallel: not an integer >= 1"),
    (lambda d: d.update(baseline={"requests": 3}), "levels[0].speedup: missing"),
    (lambda d: d["levels"][0]["trace"]["all"].pop("mean_fill_ms"), "levels[0].trace.all.mean_fill_ms: missing"),
    # each of these once ended in a traceback (AttributeError, OverflowError, TypeError)
    (lambda d: d.update(settings="x"), "settings: not an object"),
    (lambda d: d["levels"][0].update(n_parallel=10 ** 400), "levels[0].n_parallel: not an integer >= 1"),
    (lambda d: d["levels"][0]["latency"].update(mean_ttft_ms=10 ** 400), "levels[0].latency.mean_ttft_ms: not a finite"),
    (lambda d: d["levels"][0]["ticks"][0].update(ubatches=10 ** 400), "levels[0].ticks[0].ubatches: not a finite"),
    (lambda d: d.update(model=[1]), "model: not an object"),
    (lambda d: d.update(machine="x"), "machine: not an object"),
    (lambda d: d["model"].update(file_size=10 ** 400), "model.file_size: not a finite number"),
    (lambda d: d["settings"].update(sampling=[1]), "settings.sampling: not an object"),
    (lambda d: d["settings"].update(parallel=4), "settings.parallel: not a list"),
    (lambda d: d["settings"].update(n_batch="x"), "settings.n_batch: not a finite number"),
    (lambda d: d.update(default_levels=5), "default_levels: not a list"),
    # found by test_fuzz: a traceback (TypeError) in the trace table of the HTML report
    (lambda d: d["levels"][0]["trace"]["all"].update(mean_drafted_tokens={}),
     "levels[0].trace.all.mean_drafted_tokens: not a finite number"),
    (lambda d: d["levels"][0]["ticks"][0].update(accepted_tokens="7"), "levels[0].ticks[0].accepted_tokens: not a finite"),
    (lambda d: d["levels"][0]["trace"]["all"].update(mean_accepted_tokens=None),
     "levels[0].trace.all.mean_accepted_tokens: not a finite number"),
])
def test_a_damaged_document_names_its_first_bad_field(recorded, tmp_path, edit, field):
    doc = copy.deepcopy(recorded[1])
    edit(doc)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc))
    html = tmp_path / "r.html"
    result = invoke(["bench", "--from-json", str(path), "--html", str(html)])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], result.stderr
    assert not html.exists()


def test_from_json_verbose_prints_the_trace_and_says_when_a_document_has_none(recorded, tmp_path):
    path = recorded[0]
    result = invoke(["bench", "--from-json", str(path), "--verbose"])
    assert result.exit_code == 0, result.stderr
    assert all(f"Trace, B={b}: mean per tick, by kind" in result.stdout for b in LEVELS)
    doc = copy.deepcopy(recorded[1])
    for level in doc["levels"]:
        del level["trace"]  # as documents recorded before the trace existed
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    result = invoke(["bench", "--from-json", str(old), "--verbose"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == (f"llamabatch: error: --verbose: --from-json {old} has no trace "
                                     "(recorded before bench traced its ticks)")
    html = tmp_path / "old.html"
    assert invoke(["bench", "--from-json", str(old), "--html", str(html)]).exit_code == 0
    assert "Trace, B=" not in html.read_text(encoding="utf-8") and "Ticks, B=8" in html.read_text(encoding="utf-8")


@pytest.mark.parametrize("args, message", [
    (["--from-json", "/nonexistent/bench.json"], "--from-json /nonexistent/bench.json: No such file or directory"),
    (["--from-json", "x.json", "--json", "y.json"], "--json and --from-json together"),
    (["--html", "/nonexistent/dir/r.html"], "--html /nonexistent/dir/r.html: cannot write there"),
    (["--embed", "--plot"], "--plot, --html and --from-json draw generation levels; they do not apply to --embed"),
])
def test_bad_report_options_are_one_line_before_anything_runs(args, message):
    result = invoke(["bench", *args], runner=slow_runner)
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == "" and result.engines == []


def test_plot_without_plotext_says_how_to_get_it(recorded, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotext" else real(name, *a))
    result = invoke(["bench", "--from-json", str(recorded[0]), "--plot"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == ("llamabatch: error: --plot needs plotext, which is not installed: "
                                     "pip install 'llamabatch[plot]'")
