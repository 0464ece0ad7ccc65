"""How a command ends: the exit codes, the one mapping from exceptions to them
(`exit_code_for`, used by `app.main`), and SIGTERM ending a command like Ctrl-C (exit 143)."""
from __future__ import annotations

import contextlib
import signal
from typing import Iterator

import typer

from ..errors import InvalidRequest, LlamaBatchError

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
