"""The `llamabatch` command: a thin Typer front end over the engine.

Commands are plain functions in their own subpackages (cli/run/, cli/serve/, cli/serve_stdin/,
cli/chat/, cli/bench/, cli/config/, cli/models/); this module registers them, so nothing
imports back from here. `main()` is the one place exceptions become exit codes (exit_status.py).

Every command line and every shell completion imports this tree first, so a command module
imports its implementation (the engine, jobs, chat) inside the command, when it runs:
`llamabatch --help` and a Tab stay near a quarter of a second (tests/test_cli_start.py).
"""
from __future__ import annotations

import functools
import logging
import sys
from typing import Annotated, Any, Callable, Optional, Sequence, TextIO

import typer
import typer.main
from typer.exceptions import TyperException

from .. import __version__
from .bench.command import bench_command
from .chat.command import chat_command
from .exit_status import exit_code_for, sigterm_raises
from .engine_options import environment_of
from .config.command import config_app
from .env import Environment
from .models.command import models_command
from .run.command import run_command
from .run.report import report_command
from .run.ray_flag import with_bare_ray_flag
from .serve_stdin.command import serve_stdin
from .serve.command import serve_command

app = typer.Typer(
    name="llamabatch",
    help="Continuous batching for many prompts on one local GGUF model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(ctx: typer.Context, value: bool) -> None:
    if value:
        environment_of(ctx).out(f"llamabatch {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and llama.cpp logs on stderr.")] = False,
    config: Annotated[Optional[str], typer.Option(
        "--config", metavar="FILE",
        help="Config file to read (also $LLAMABATCH_CONFIG) \\[default: ./llamabatch.toml, "
             "else ~/.config/llamabatch/config.toml]")] = None,
) -> None:
    """Continuous batching for many prompts on one local GGUF model."""
    env = ctx.ensure_object(Environment)  # main() passes one; CliRunner gets the real streams
    env.debug = debug
    env.config_path = config
    setup_logging(debug, env.stderr)


app.command("run")(run_command)
app.command("report")(report_command)
app.command("serve-stdin")(serve_stdin)
app.command("serve")(serve_command)
app.command("chat")(chat_command)
app.command("bench")(bench_command)
app.command("models")(models_command)
app.add_typer(config_app, name="config")


@functools.cache
def _command() -> Callable[..., Any]:
    """The click command Typer builds from `app`, built once per process: building it reads
    every command's signature and annotations (about 15 ms), which `app(...)` would redo on
    every call of main() in one process (an embedding program, the test suite). Typer's own
    __call__ adds only its pretty-exception hook, which `pretty_exceptions_enable=False` turns off."""
    return typer.main.get_command(app)


def main(argv: Sequence[str] | None = None, env: Environment | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]) in `env` (default: the real
    streams) and return its exit code: 0 ok, 1 error, 2 usage, 130 interrupted, 143 terminated.

    Library errors raised anywhere in a command end here as one line on stderr; --debug
    re-raises them with their traceback instead."""
    env = env if env is not None else Environment()
    with sigterm_raises():  # SIGTERM ends a command like Ctrl-C, with exit 143
        return _main(argv, env)


def _main(argv: Sequence[str] | None, env: Environment) -> int:
    try:
        given = list(argv) if argv is not None else sys.argv[1:]
        env.argv = tuple(given)
        args = with_bare_ray_flag(given)
        result = _command()(args=args, prog_name="llamabatch", standalone_mode=False, obj=env)
        return result if isinstance(result, int) else 0  # click returns an Exit's code here
    except typer.Exit as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # Typer turns Ctrl-C into Exit(130)
            return _report(env, exc.__cause__)
        return exc.exit_code
    except TyperException as exc:  # usage errors: click's own words, exit 2
        exc.show(file=env.stderr)  # type: ignore[attr-defined]
        return exc.exit_code  # type: ignore[attr-defined]
    except BaseException as exc:
        return _report(env, exc)


def _report(env: Environment, exc: BaseException) -> int:
    mapped = exit_code_for(exc)
    if mapped is None or env.debug:
        raise exc
    code, message = mapped
    print(f"llamabatch: error: {message}", file=env.stderr, flush=True)
    return code


def setup_logging(debug: bool, stream: TextIO) -> None:
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=stream,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
