"""What every command shares at run time: the --debug flag, error-to-exit-code mapping,
and building an Engine from resolved options."""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

import typer

from ..engine import Engine
from ..errors import InvalidRequest, LlamaBatchError, ModelLoadError
from .options import Resolved, SharedOptions


class State:
    debug = False
    config_path: str | None = None  # the global --config FILE


state = State()

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def say(message: str) -> None:
    """A line for people: always stderr, never mixed into data on stdout."""
    print(message, file=sys.stderr, flush=True)


def fail(message: str, code: int = EXIT_ERROR) -> "typer.Exit":
    say(f"llamabatch: error: {message}")
    return typer.Exit(code)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn library errors into one line on stderr and an exit code (--debug: the traceback)."""
    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        if state.debug:
            raise
        raise fail("interrupted", EXIT_INTERRUPTED) from None
    except InvalidRequest as exc:
        if state.debug:
            raise
        raise fail(str(exc), EXIT_USAGE) from None
    except (LlamaBatchError, OSError) as exc:
        if state.debug:
            raise
        raise fail(str(exc), EXIT_ERROR) from None


def resolve_options(opts: SharedOptions) -> Resolved:
    """Flags > LLAMABATCH_* env > config file > defaults. Bad values exit 2 with one line."""
    from .config.layer import resolve_layers

    with cli_errors():
        return resolve_layers(opts)


def open_engine(resolved: Resolved) -> Engine:
    """Load the model; a model that can't load is one line and exit 1."""
    try:
        return Engine(resolved.engine, default_params=resolved.sampling)
    except ModelLoadError as exc:
        if state.debug:
            raise
        raise fail(str(exc), EXIT_ERROR) from None


def setup_logging(debug: bool) -> None:
    state.debug = debug
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
