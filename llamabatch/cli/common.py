"""What every command shares at run time: the exit codes and the one
mapping from exceptions to them (`exit_code_for`, used by `app.main`), and the two calls
every engine-running command makes: resolve its options (settings layer), open its engine
(the Environment's factory)."""
from __future__ import annotations

import contextlib
import logging
import signal
from typing import TYPE_CHECKING, Iterator, TextIO

import typer

from ..errors import InvalidRequest, LlamaBatchError
from .. import engines
from ..settings.file_layer import resolve_command_settings
from ..settings.resolved import Resolved
from .env import Environment
from .engine_options import EngineOptions

if TYPE_CHECKING:
    from ..api import EngineAPI

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143: what service managers and `timeout` expect after SIGTERM


class Terminated(BaseException):
    """SIGTERM arrived where a command has no handling of its own: it ends like a Ctrl-C
    (finally blocks close the engine, which cancels what is in flight), with exit 143.
    A BaseException, so no `except Exception` swallows it."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While the block runs, SIGTERM raises Terminated in the main thread (run and serve-stdin
    install their own handlers for their main phase, which finish in-flight work first)."""
    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (an embedding host): keep the default
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class CliError(Exception):
    """End the command: `message` on stderr as one line, then exit `code`."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_ERROR) -> CliError:
    """`raise fail("...", EXIT_USAGE)`: one line, that exit code (see exit_code_for)."""
    return CliError(message, code)


def exit_code_for(exc: BaseException) -> tuple[int, str] | None:
    """The one exception -> (exit code, one line for stderr) mapping: 2 for bad input or
    usage, 1 for everything else that went wrong, 130 for Ctrl-C, 143 for SIGTERM. None: a bug, which keeps
    its traceback. (--debug re-raises them all; see app.main.)"""
    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, (KeyboardInterrupt, typer.Abort)):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, Terminated):
        return EXIT_TERMINATED, "terminated"
    if isinstance(exc, InvalidRequest):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, (LlamaBatchError, OSError)):
        return EXIT_ERROR, str(exc)
    return None


def resolve_options(opts: EngineOptions, environment: Environment) -> Resolved:
    """Flags > LLAMABATCH_* env > config file (--config from `environment`) > defaults, the
    model named by them resolved (settings.file_layer.resolve_command_settings), once, before
    any input is read. Bad values raise InvalidRequest (exit 2); an unknown model name is a
    ModelLoadError (one line, exit 1)."""
    return resolve_command_settings(opts.values, opts.command, environment.config_path,
                                    lambda line: environment.say(f"llamabatch: {line}"))


def open_engine(resolved: Resolved, environment: Environment, max_slots: int | None = None, *,
                isolated: bool = False, watchdog_s: float | None = None) -> "EngineAPI":
    """The command's engine, from the environment's factory (llamabatch.engines.open_engine:
    the model loaded, n_parallel "auto" decided, bounded by `max_slots`; `isolated`: in a
    supervised child process; `watchdog_s`: its watchdog floor). Its notices (a chat-template
    fallback, an unusable prefix store) are lines on stderr."""
    return engines.open_engine(resolved, factory=environment.engine_factory, max_slots=max_slots,
                               isolated=isolated, watchdog_s=watchdog_s,
                               on_notice=lambda line: environment.say(f"llamabatch: {line}"))


def setup_logging(debug: bool, stream: TextIO) -> None:
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=stream,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
