"""bench's own values, checked before any model is loaded: every bad one is one line
(InvalidRequest, exit 2 from the CLI)."""
from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest
from . import benchkit, report


def check_modes(plot: bool, embed: bool, html_file: str | None, from_json: str | None) -> None:
    """--plot needs plotext; --embed draws nothing."""
    if plot and report.plot_unavailable():
        raise InvalidRequest(report.plot_unavailable())
    if embed and (plot or html_file is not None or from_json is not None):
        raise InvalidRequest("--plot, --html and --from-json draw generation levels; they do not apply to --embed")


def check_own_options(parallel: str, pp: int, tg: int, requests: int | None, prompts: str | None,
                      json_file: str | None, ticks: int,
                      html_file: str | None = None) -> tuple[list[int], list[tuple[int, str]] | None]:
    """The levels of --parallel and the lines of --prompts FILE (None: synthetic prompts)."""
    levels = benchkit.parse_levels(parallel)
    prompt_lines = benchkit.read_prompt_file(prompts) if prompts is not None else None
    for name, value, least in (("--pp", pp, 1), ("--tg", tg, 1), ("--requests", requests, 1), ("--ticks", ticks, 0)):
        if value is not None and value < least:
            raise InvalidRequest(f"{name} must be an integer >= {least}, got {value}")
    if json_file is not None and not report.writable(json_file):
        raise InvalidRequest(f"--json {json_file}: cannot write there")
    if html_file is not None and not report.writable(html_file):
        raise InvalidRequest(f"--html {html_file}: cannot write there")
    return levels, prompt_lines


def load_recorded(path: str, json_file: str | None, html_file: str | None, ticks: int,
                  verbose: bool) -> dict[str, Any]:
    """--from-json FILE's document, checked, with the options that go with it."""
    if json_file is not None:
        raise InvalidRequest("--json and --from-json together: --from-json runs nothing, so there is nothing new "
                             "to write")
    if ticks < 0:
        raise InvalidRequest(f"--ticks must be an integer >= 0, got {ticks}")
    if html_file is not None and not report.writable(html_file):
        raise InvalidRequest(f"--html {html_file}: cannot write there")
    document = report.load_document(path)
    if verbose and not all(isinstance(level.get("trace"), dict) for level in document["levels"]):
        raise InvalidRequest(f"--verbose: --from-json {path} has no trace (recorded before bench traced its ticks)")
    return document
