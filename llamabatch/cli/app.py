"""The `llamabatch` command: a thin Typer front end over the engine."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from .. import __version__
from .common import setup_logging, state

app = typer.Typer(
    name="llamabatch",
    help="Continuous batching for many prompts on one local GGUF model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llamabatch {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and llama.cpp logs on stderr.")] = False,
    config: Annotated[Optional[str], typer.Option(
        "--config", metavar="FILE",
        help="Config file to read (also $LLAMABATCH_CONFIG) \\[default: ./llamabatch.toml, "
             "else ~/.config/llamabatch/config.toml]")] = None,
) -> None:
    """Continuous batching for many prompts on one local GGUF model."""
    setup_logging(debug)
    state.config_path = config


def _register() -> None:
    # Each command lives in its own module; importing registers it on `app`.
    from .bench import command as _bench  # noqa: F401
    from .chat import command as _chat  # noqa: F401
    from .run import command as _run  # noqa: F401
    from .serve import command as _serve  # noqa: F401
    from .config.command import config_app

    app.add_typer(config_app, name="config")


_register()


def main() -> None:
    app()
