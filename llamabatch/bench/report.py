"""bench's recorded results as a document: read one back (`--from-json`), check it, and turn
it into plots (`--plot`) and the HTML report (`--html`).

A document is what `bench --json` writes. One read from a file is checked field by field
before anything is drawn, so a truncated or hand-edited file is one line naming the field,
not a traceback halfway through the tables.
"""
from __future__ import annotations

import math
import os
import shutil
from typing import Any

from ..errors import InvalidRequest, ReportFileError
from ..files.replaced_file import replacing
from ..files.whole_file import NOT_JSON, NOT_UTF8, UnreadableFile, read_json
from . import chartdata, htmlreport

BATCHED_KEYS = ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")
LATENCY_KEYS = ("completed", "failed", "duration", "request_throughput", "output_throughput",
                "total_token_throughput") + tuple(
    f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99"))
SUMMARY_KEYS = ("ticks", "mean_batch_size", "mean_decode_tokens", "mean_prefill_tokens", "mean_active_slots",
                "mean_queue_depth", "mean_eval_ms", "mean_sample_ms", "mean_overhead_ms", "token_fill", "slot_fill",
                "mixed_share", "overhead_share")
TICK_KEYS = ("tick", "batch_size", "decode_tokens", "prefill_tokens", "active_slots", "queue_depth", "eval_ms",
             "sample_ms", "overhead_ms")
TRACE_KEYS = ("ticks", "share_of_wall", "mean_tokens", "mean_decode_tokens", "mean_prefill_tokens", "mean_ubatches",
              "mean_eval_ms", "eval_ms_per_token", "mean_sample_ms", "mean_plan_ms", "mean_fill_ms", "mean_after_ms",
              "mean_wall_ms")
# keys later documents carry and earlier ones lack: checked where present
TICK_OPTIONAL_KEYS = ("ubatches", "drafted_tokens", "accepted_tokens", "preemptions")
TRACE_OPTIONAL_KEYS = ("mean_drafted_tokens", "mean_accepted_tokens", "preemptions")
BASELINE_KEYS = ("requests", "prompt_tokens", "generated_tokens", "seconds", "request_throughput",
                 "output_throughput", "total_token_throughput", "stopped_early")


def load_document(path: str) -> dict[str, Any]:
    """A bench JSON document from `path`, checked. Raises InvalidRequest with one line."""
    try:
        document = read_json(path, "--from-json")  # bounded, UTF-8, no RecursionError (whole_file)
    except UnreadableFile as exc:
        why = f"not JSON ({exc.why})" if exc.kind in (NOT_JSON, NOT_UTF8) else exc.why
        raise InvalidRequest(f"--from-json {path}: {why}") from None
    problem = check_document(document)
    if problem:
        raise InvalidRequest(f"--from-json {path}: not a bench --json document: {problem}")
    return document


def check_document(document: Any) -> str | None:
    """What is wrong with `document` (the first thing found), or None."""
    if not isinstance(document, dict):
        return "the top level is not an object"
    levels = document.get("levels")
    if not isinstance(levels, list) or not levels:
        return "levels: missing or empty"
    for name in ("default_levels", "f16_levels"):
        if document.get(name) is not None and not isinstance(document[name], list):
            return f"{name}: not a list"
    problem = _check_header(document)
    if problem:
        return problem
    for name in ("levels", "default_levels", "f16_levels"):
        for i, level in enumerate(document.get(name) or []):
            problem = _check_level(level, document.get("baseline") is not None and name == "levels")
            if problem:
                return f"{name}[{i}].{problem}"
    if document.get("baseline") is not None:
        problem = _check_numbers(document["baseline"], BASELINE_KEYS)
        if problem:
            return f"baseline.{problem}"
    return None


def _check_header(document: dict[str, Any]) -> str | None:
    """The parts the tables' and the report's header read as objects, lists and numbers: each
    may be missing (older documents), but when there it has its type."""
    for key in ("settings", "model", "machine"):
        if document.get(key) is not None and not isinstance(document[key], dict):
            return f"{key}: not an object"
    settings, model = document.get("settings") or {}, document.get("model") or {}
    for where, record, key, kind in (("settings", settings, "sampling", dict), ("settings", settings, "parallel", list)):
        if record.get(key) is not None and not isinstance(record[key], kind):
            return f"{where}.{key}: not {'an object' if kind is dict else 'a list'}"
    for where, record, key in (("settings", settings, "n_batch"), ("model", model, "file_size")):
        if record.get(key) is not None and not _is_number(record[key]):
            return f"{where}.{key}: not a finite number ({_show(record[key])})"
    return None


def _check_level(level: Any, with_speedup: bool) -> str | None:
    if not isinstance(level, dict):
        return "(not an object)"
    n = level.get("n_parallel")
    if not _is_number(n) or n < 1 or not float(n).is_integer():
        return "n_parallel: not an integer >= 1"
    for key, keys in (("batched", BATCHED_KEYS), ("latency", LATENCY_KEYS), ("tick_summary", SUMMARY_KEYS)):
        problem = _check_numbers(level.get(key), keys)
        if problem:
            return f"{key}.{problem}"
    ticks = level.get("ticks")
    if not isinstance(ticks, list):
        return "ticks: missing"
    for i, tick in enumerate(ticks):
        problem = _check_numbers(tick, TICK_KEYS)
        if problem:
            return f"ticks[{i}].{problem}"
        # graph runs and guesses per tick: documents from before the engine counted them have none
        problem = _check_optional_numbers(tick, TICK_OPTIONAL_KEYS)
        if problem:
            return f"ticks[{i}].{problem}"
    trace = level.get("trace")  # bench --verbose's breakdown; documents before it have none
    if trace is not None:
        if not isinstance(trace, dict):
            return "trace: not an object"
        for kind, row in trace.items():
            problem = _check_numbers(row, TRACE_KEYS) or _check_optional_numbers(row, TRACE_OPTIONAL_KEYS)
            if problem:
                return f"trace.{kind}.{problem}"
    if with_speedup and not _is_number(level.get("speedup")):
        return "speedup: missing (the document has a baseline)"
    return None


def _check_numbers(record: Any, keys: tuple[str, ...]) -> str | None:
    if not isinstance(record, dict):
        return "(missing or not an object)"
    for key in keys:
        if key not in record:
            return f"{key}: missing"
        if not _is_number(record[key]):
            return f"{key}: not a finite number ({_show(record[key])})"
    return None


def _check_optional_numbers(record: dict, keys: tuple[str, ...]) -> str | None:
    """Each of `keys` absent or a number (null only for ubatches, which the chart skips;
    the tables format the guess counts as numbers)."""
    for key in keys:
        if key not in record or (key == "ubatches" and record[key] is None):
            continue
        if not _is_number(record[key]):
            return f"{key}: not a finite number ({_show(record[key])})"
    return None


def _is_number(value: Any) -> bool:
    """A number a float holds (what the tables, charts and report compute with): an integer of
    400 digits is JSON, but float() of it is an OverflowError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _show(value: Any) -> str:
    """A bad value for the message, cut short: it may be a 400-digit number or a long text."""
    if isinstance(value, int) and abs(value) >= 10 ** 20:
        return f"an integer of about {value.bit_length() * 3 // 10 + 1} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- output -----------------------------------------------------------------------------------

def plot_unavailable() -> str | None:
    """Why --plot cannot draw here (plotext, an optional extra, is not installed), or None."""
    import importlib.util

    if importlib.util.find_spec("plotext") is None:
        return "--plot needs plotext, which is not installed: pip install 'llamabatch[plot]'"
    return None


def plot_style(stdout_isatty: bool) -> tuple[bool, int]:
    """(colour and Unicode?, width) for the terminal plots: colour only on a terminal and
    without NO_COLOR (https://no-color.org: set and not empty); elsewhere plain ASCII."""
    color = stdout_isatty and not os.environ.get("NO_COLOR")
    width = shutil.get_terminal_size((100, 24)).columns - 1 if stdout_isatty else 100
    return color, max(60, min(width, 140))


def plots(document: dict[str, Any], *, color: bool, width: int) -> str:
    from . import termplot  # imports plotext: only when plots are asked for

    return termplot.render(chartdata.charts(document), width=width, color=color)


def write_html(path: str, document: dict[str, Any], last_ticks: int = 0) -> None:
    """The report, written whole: to a temporary name next to `path`, then renamed, so a
    failure never leaves half a page behind. ReportFileError (one line naming --html) when it fails."""
    text = htmlreport.render(document, last_ticks)
    try:
        with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise ReportFileError(f"--html {path}: {exc.strerror or exc}") from None


def writable(path: str) -> bool:
    """Whether a file can be written at `path` (checked before a model is loaded)."""
    folder = os.path.dirname(os.path.abspath(path))
    return not (os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK) or (
        os.path.exists(path) and not os.access(path, os.W_OK)))
