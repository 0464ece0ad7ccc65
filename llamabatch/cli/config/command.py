"""`llamabatch config show` and `llamabatch config path`."""
from __future__ import annotations

import json
import os
from typing import Annotated, Any, Optional

import typer

from ...settings.config_file import COMMANDS, ENGINE_RULES, Location
from ...settings.config_file import SAMPLING_KEYS as FILE_SAMPLING_KEYS
from ...settings.file_layer import config_location, current_config, file_values_for, resolve_layers
from ..common import EXIT_ERROR, EXIT_USAGE, fail
from ..env import Environment
from ..options import SHARED_OPTIONS, Resolved, SharedOptions, env_name, environment_of, with_shared_options

config_app = typer.Typer(
    help="The config file and the settings in effect.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

# What a None default means, in words.
_UNSET = {
    "model": "(bundled Gemma 3 270M)",
    "chat_template": "(the model's own)",
    "seed": "(random per request)",
}
_WIDEST_VALUE = 60


def _complete_command(incomplete: str) -> list[str]:
    return [c for c in COMMANDS if c.startswith(incomplete)]


@config_app.command("show")
@with_shared_options
def show_command(
    command: Annotated[Optional[str], typer.Option(
        "--command", metavar="COMMAND", autocompletion=_complete_command,
        help=f"Apply this command's table too: {', '.join(COMMANDS)} \\[default: none]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of a table.")] = False,
    *,
    opts: SharedOptions,
    env: Environment,
) -> None:
    """Show the effective settings and where each came from: flag, env, file:line, default.

    Shared options given here count as flags, so you can check what a command line would use.
    """
    if command is not None and command not in COMMANDS:
        raise fail(f"--command must be one of {', '.join(COMMANDS)}, got {command!r}", EXIT_USAGE)
    shared = SharedOptions(opts.values, command or "")
    location = config_location(env.config_path)
    file_values = file_values_for(command or "", env.config_path)
    resolved = resolve_layers(shared.values, shared.command, env.config_path)
    rows = _rows(resolved, shared, file_values)
    rows += _command_rows(command, env.config_path)
    _say_location(location, env)
    if as_json:
        env.out(json.dumps({
            "command": command,
            "config_file": location.path,
            "settings": {key: {"value": value, "source": source} for key, value, source in rows},
        }, indent=2))
        return
    table = [("KEY", "VALUE", "SOURCE")] + [(key, _text(key, value, resolved), source) for key, value, source in rows]
    widths = [max(len(row[i]) for row in table) for i in range(2)]
    for key, value, source in table:
        env.out(f"{key:<{widths[0]}}  {value:<{widths[1]}}  {source}".rstrip())


@config_app.command("path")
def path_command(ctx: typer.Context) -> None:
    """Print the config file that would be read (exit 1 when there is none)."""
    env = environment_of(ctx)
    location = config_location(env.config_path)
    if location.path is None:
        env.say("llamabatch: no config file; looked for, in order:")
        for place in location.looked:
            env.say(f"  {place}")
        env.say("  (or name one with --config FILE or $LLAMABATCH_CONFIG)")
        raise typer.Exit(EXIT_ERROR)
    env.out(location.path)


def _rows(resolved: Resolved, opts: SharedOptions, file_values: dict[str, tuple[Any, str]]) -> list[tuple[str, Any, str]]:
    rows = []
    for key, source in resolved.sources.items():
        if key in ENGINE_RULES:
            value = getattr(resolved.engine, key)
        elif key in ("grammar_file", "json_schema"):
            value = _given(key, source, opts, file_values)  # the path or text given, not what was read from it
        else:
            value = getattr(resolved.sampling, key)
        rows.append((key, value, source))
    order = {key: i for i, key in enumerate(SHARED_OPTIONS)}
    rows.sort(key=lambda row: order.get(row[0], len(order)))  # shared keys first, then file-only sampling keys
    return rows


def _given(key: str, source: str, opts: SharedOptions, file_values: dict[str, tuple[Any, str]]) -> Any:
    if source == "flag":
        return opts[key]
    if source.startswith("env "):
        return os.environ.get(env_name(key))
    if source == "default":
        return None
    return file_values[key][0]


def _command_rows(command: str | None, config_path: str | None) -> list[tuple[str, Any, str]]:
    """A command's own keys, where the file sets them (their defaults live in the command)."""
    config = current_config(config_path)
    if not command or config is None:
        return []
    return [(key, setting.value, setting.where(config.path))
            for key, setting in config.commands.get(command, {}).items()
            if key not in ENGINE_RULES and key not in FILE_SAMPLING_KEYS]


def _text(key: str, value: Any, resolved: Resolved) -> str:
    if value is None:
        if key == "n_ctx":
            return f"(auto: {resolved.engine.total_ctx})"
        if key == "threads":
            return f"(auto: {resolved.engine.n_threads})"
        return _UNSET.get(key, "(none)")
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, dict)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= _WIDEST_VALUE else text[: _WIDEST_VALUE - 1] + "…"


def _say_location(location: Location, env: Environment) -> None:
    if location.path:
        env.say(f"config file: {location.path} (from {location.reason})")
    else:
        env.say("config file: none (looked for " + ", ".join(location.looked) + ")")
