"""`bench --html FILE`: one self-contained page from a bench JSON document.

A header (when, versions, machine, model, settings), every chart of chartdata as inline
SVG (svgchart.py) and the same tables the terminal shows (tables.py's rich tables, their
cells copied into HTML tables). No script, no external stylesheet, font or image: the file
opens offline and can be mailed or attached to an issue as it is.
"""
from __future__ import annotations

from html import escape
from typing import Any

from rich.table import Table

from . import chartdata, svgchart
from .tables import (baseline_table, batched_table, deterministic_table, kv_types_table, latency_table, throughput_table,
                     tick_summary_line, ticks_table, trace_table)

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1000px;
       color: #222; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.15em; margin-top: 28px; }
dl.header { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; font-size: 0.9em; }
dl.header dt { color: #555; } dl.header dd { margin: 0; font-family: ui-monospace, monospace; }
div.charts { display: flex; flex-wrap: wrap; gap: 8px 20px; }
figure { margin: 8px 0; } figure.line { width: 470px; } figure.stacked { width: 960px; }
figcaption, p.note { color: #555; font-size: 0.85em; }
svg.chart { max-width: 100%; height: auto; font-size: 12px; }
svg.chart .title { font-size: 14px; font-weight: 600; } svg.chart .grid { stroke: #e4e4e4; }
svg.chart .axis { stroke: #777; } svg.chart .tick, svg.chart .legend { fill: #444; }
svg.chart .label { fill: #333; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 0.85em; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border: 1px solid #ddd; padding: 2px 8px; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.section-end td { border-bottom: 2px solid #999; } tr.emph td { font-weight: 600; }
"""


def render(document: dict[str, Any], last_ticks: int = 0) -> str:
    """The whole page. `last_ticks` as bench --ticks: the tick tables show only that many."""
    levels = document["levels"]
    settings = document.get("settings") or {}
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>llamabatch bench: {escape(_model_name(document))}</title>",
             f"<style>{STYLE}</style>", "</head>", "<body>",
             f"<h1>llamabatch bench: {escape(_model_name(document))}</h1>",
             _header(document), '<h2 id="charts">Charts</h2>']
    parts.append('<div class="charts">')
    for chart in chartdata.charts(document):
        parts.append(f'<figure id="chart-{escape(chart.id)}" class="{chart.kind}">')
        parts.append(svgchart.render(chart))
        if chart.note:
            parts.append(f'<figcaption>{escape(chart.note)}</figcaption>')
        parts.append("</figure>")
    parts.append("</div>")
    parts.append('<h2 id="tables">Tables</h2>')
    base = document.get("baseline")
    n_batch = settings.get("n_batch") or 0
    parts.append(table_html(batched_table(levels, with_speedup=base is not None)))
    parts.append(table_html(latency_table(levels)))
    parts.append(table_html(throughput_table(levels)))
    for level in levels:
        parts.append(table_html(ticks_table(level, last_ticks)))
        parts.append(f'<p class="note">{escape(tick_summary_line(level, n_batch))}</p>')
        if level.get("trace"):  # where the tick's time went (bench --verbose's table)
            parts.append(table_html(trace_table(level)))
    if document.get("default_levels"):
        parts.append(table_html(deterministic_table(document["default_levels"], levels)))
    if document.get("f16_levels"):
        parts.append(table_html(kv_types_table(document["f16_levels"], levels)))
    if base is not None:
        parts.append(table_html(baseline_table(base)))
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def _model_name(document: dict[str, Any]) -> str:
    model = document.get("model") or {}
    return str(model.get("name") or model.get("general_name") or "unknown model")


def _header(document: dict[str, Any]) -> str:
    machine = document.get("machine") or {}
    model = document.get("model") or {}
    s = document.get("settings") or {}
    sampling = s.get("sampling") or {}
    size = model.get("file_size")
    rows = [
        ("created", document.get("created")),
        ("versions", f"llamabatch {document.get('llamabatch_version')}, "
                     f"llama-cpp-python {document.get('llama_cpp_python_version')}"),
        ("machine", f"{machine.get('processor') or machine.get('machine')} ({machine.get('platform')}), "
                    f"{machine.get('cpus_usable')} of {machine.get('cpu_count')} CPUs usable, "
                    f"Python {machine.get('python')}"),
        ("model", f"{model.get('name')}: {model.get('architecture')} {model.get('size_label') or ''}, "
                  f"file type {model.get('file_type')}, "
                  + (f"{size / 2**20:.1f} MiB" if isinstance(size, (int, float)) else "size unknown")),
        ("workload", f"levels B = {', '.join(map(str, s.get('parallel') or []))}; "
                     + (f"--pp {s['pp']}" if s.get("pp") is not None else f"prompts from {s.get('prompts_file')}")
                     + f", --tg {s.get('tg')}, requests per level {s.get('requests_per_level')}"),
        ("engine", f"threads {document.get('threads')}, policy {s.get('policy')}, n_batch {s.get('n_batch')}, "
                   f"chunk_size {s.get('chunk_size')}, n_ctx {s.get('n_ctx')}, cache_prompt {s.get('cache_prompt')}, "
                   f"n_gpu_layers {s.get('n_gpu_layers')}, deterministic {s.get('deterministic')}"),
        ("sampling", ", ".join(f"{k} {v}" for k, v in sampling.items())),
        ("timing", f"{s.get('t_pp_t_tg')}; {s.get('warm_up')}"),
    ]
    items = "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in rows)
    return f'<dl class="header">{items}</dl>'


def table_html(table: Table) -> str:
    """A rich Table (title, headers, cells, section ends, bold rows) as an HTML table."""
    columns = table.columns
    cells = [list(column.cells) for column in columns]
    out = ["<table>"]
    if table.title:
        out.append(f"<caption>{escape(str(table.title))}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{escape(str(c.header))}</th>" for c in columns) + "</tr></thead>")
    out.append("<tbody>")
    for i, row in enumerate(table.rows):
        classes = (["section-end"] if row.end_section else []) + (["emph"] if row.style else [])
        attr = f' class="{" ".join(classes)}"' if classes else ""
        out.append(f"<tr{attr}>" + "".join(_cell(column.justify, values[i]) for column, values in zip(columns, cells))
                   + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _cell(justify: str, value: Any) -> str:
    return f'<td class="num">{escape(str(value))}</td>' if justify == "right" else f"<td>{escape(str(value))}</td>"

