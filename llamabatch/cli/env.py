"""The environment a command runs in: its streams, whether they are terminals, how it
builds an engine, and the global flags.

`main()` builds the real one from sys.stdin/stdout/stderr. Tests build their own (httpie's
`Environment` idea): text streams over bytes, terminal flags of their choosing and an engine
factory over the scripted fake runner (engines/factory.py), so run, serve-stdin and chat
run in milliseconds. Commands receive it (engine_options.with_engine_options passes it as `env`)
(commands without engine options take it from their click context: engine_options.environment_of)
and never reach for sys.std* or a module global: they write with `env.say` and `env.out`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from ..engines import EngineFactory


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@dataclass
class Environment:
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdin_isatty: bool | None = None  # None: ask the stream
    stdout_isatty: bool | None = None
    stderr_isatty: bool | None = None
    # None: the real one, built where an engine is opened (so a command that opens none, --help
    # and shell completion among them, never imports the engine); tests: one over the fake runner
    engine_factory: EngineFactory | None = None
    debug: bool = False  # --debug: tracebacks instead of one-line errors, llama.cpp logs on stderr
    config_path: str | None = None  # the global --config FILE
    argv: tuple[str, ...] = ()  # the command line as given (main sets it), e.g. for run's resume hint

    def __post_init__(self) -> None:
        for name in ("stdin", "stdout", "stderr"):
            if getattr(self, f"{name}_isatty") is None:
                setattr(self, f"{name}_isatty", _isatty(getattr(self, name)))

    def say(self, message: str) -> None:
        """A line for people: always stderr, never mixed into data on stdout."""
        print(message, file=self.stderr, flush=True)

    def out(self, text: str) -> None:
        """Data or a command's answer: stdout."""
        print(text, file=self.stdout, flush=True)

    def fileno(self, name: str) -> int | None:
        """The OS file descriptor behind stdin/stdout/stderr, or None (an in-memory stream)."""
        try:
            return getattr(self, name).fileno()
        except (AttributeError, OSError, ValueError):
            return None
