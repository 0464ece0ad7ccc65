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
from ..prefix_store.folder_check import unusable_because
from ..settings.file_layer import resolve_layers, resolve_settings
from ..settings.resolved import Resolved
from .env import Environment
from .engine_options import EngineOptions

if TYPE_CHECKING:
    from ..core.engine import Engine

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
    model named by them resolved (settings.file_layer.resolve_settings), once, before any
    input is read. Bad values raise InvalidRequest (exit 2); an unknown model name is a
    ModelLoadError (one line, exit 1); a store's default stops (Ollama's) become the default
    `stop` when no layer sets one. A model named nowhere is the command's own default: for
    run, serve-stdin and chat the chat-tuned one when installed (models.default_model)."""
    from ..models.default_model import default_model

    default = None
    if resolve_layers(opts.values, opts.command, environment.config_path).sources.get("model") == "default":
        default = default_model(opts.command, lambda line: environment.say(f"llamabatch: {line}"))
    if default is None:
        return resolve_settings(opts.values, opts.command, environment.config_path)
    # passed as the flag would be, so that the other layers and the model's resolution stay
    # settings'; the source then says where it really came from
    resolved = resolve_settings({**opts.values, "model": default}, opts.command, environment.config_path)
    resolved.sources["model"] = "default (chat-tuned)"
    return resolved


def open_engine(resolved: Resolved, environment: Environment, max_slots: int | None = None, *,
                isolated: bool = False, watchdog_s: float | None = None) -> "Engine":
    """Build the command's engine with the environment's factory (loads the model;
    ModelLoadError is one line and exit 1): n_parallel "auto" measured, bounded by
    `max_slots` (e.g. the number of input lines); `isolated`: in a supervised child process;
    `watchdog_s`: the supervised engine's watchdog floor (None: its default; 0: off).
    A chat-template fallback is said once on stderr, when chat messages first need it, and a
    prefix store folder that can never work (a file, a device) before the engine opens."""
    store = resolved.engine.prefix_store
    why = unusable_because(store) if store and resolved.engine.prefix_store_max_bytes else None
    if why:  # the store would fail every save in silence: say so, and run without it
        environment.say(f"llamabatch: warning: prefix store {store} can't be used ({why}): running without it")
        resolved = resolved.replace(engine=resolved.engine.replace(prefix_store=None))
    engine = environment.engine_factory.open(resolved, max_slots=max_slots, isolated=isolated, watchdog_s=watchdog_s)
    engine.on_notice = lambda line: environment.say(f"llamabatch: {line}")
    return engine


def setup_logging(debug: bool, stream: TextIO) -> None:
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=stream,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s")
