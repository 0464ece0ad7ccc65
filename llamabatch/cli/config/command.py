"""`llamabatch config show` and `llamabatch config path`."""
from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from ...errors import InvalidRequest
from ...settings.config_file import COMMANDS, Location
from ...settings.file_layer import config_location, file_values_for, resolve_layers
from ...settings.in_effect import command_rows, setting_rows, value_text
from ..exit_status import EXIT_ERROR
from ..env import Environment
from ..engine_options import EngineOptions, environment_of, with_engine_options

config_app = typer.Typer(
    help="The config file and the settings in effect.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _complete_command(incomplete: str) -> list[str]:
    return [c for c in COMMANDS if c.startswith(incomplete)]


@config_app.command("show")
@with_engine_options
def show_command(
    command: Annotated[Optional[str], typer.Option(
        "--command", metavar="COMMAND", autocompletion=_complete_command,
        help=f"Apply this command's table too: {', '.join(COMMANDS)} \\[default: none]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of a table.")] = False,
    *,
    opts: EngineOptions,
    env: Environment,
) -> None:
    """Show the effective settings and where each came from: flag, env, file:line, default.

    Engine and sampling options given here count as flags, so you can check what a command line would use.
    """
    if command is not None and command not in COMMANDS:
        raise InvalidRequest(f"--command must be one of {', '.join(COMMANDS)}, got {command!r}")
    location = config_location(env.config_path)
    file_values = file_values_for(command or "", env.config_path)
    resolved = resolve_layers(opts.values, command or "", env.config_path)
    rows = setting_rows(resolved, opts.values, file_values)
    rows += command_rows(command, env.config_path)
    _say_location(location, env)
    if as_json:
        env.out(json.dumps({
            "command": command,
            "config_file": location.path,
            "settings": {key: {"value": value, "source": source} for key, value, source in rows},
        }, indent=2))
        return
    table = [("KEY", "VALUE", "SOURCE")] + [(key, value_text(key, value, resolved), source) for key, value, source in rows]
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


def _say_location(location: Location, env: Environment) -> None:
    if location.path:
        env.say(f"config file: {location.path} (from {location.reason})")
    else:
        env.say("config file: none (looked for " + ", ".join(location.looked) + ")")
