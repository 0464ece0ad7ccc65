"""The chat's ends on this machine: a terminal (prompt-toolkit: history across runs, Esc-Enter,
bracketed paste, dim notices) or plain streams (piped stdin, replies on stdout as they are)."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, TextIO

from ...chat.session import ChatIO
from ..env import Environment


def history_path() -> Path:
    """$XDG_STATE_HOME/llamabatch/chat_history (XDG's default: ~/.local/state)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "llamabatch" / "chat_history"


def terminal_reader(history: Path | None, *, input: Any = None, output: Any = None,
                    warn: Callable[[str], None] = lambda line: None):
    """read(prompt) over a prompt-toolkit session: history across runs, Esc-Enter for a new
    line, bracketed paste (a pasted block arrives as one message). `warn`: a line for people
(the history file cannot be kept)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    bindings = KeyBindings()

    @bindings.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    store: Any = InMemoryHistory()
    if history is not None:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(history if history.exists() else history.parent, os.W_OK):
                raise PermissionError(13, "not writable")
            store = FileHistory(str(history))
        except OSError as exc:  # FileHistory would fail later, at the first Enter
            warn(f"llamabatch: chat history not kept ({history}: {exc.strerror or exc})")
    session: Any = PromptSession(history=store, key_bindings=bindings, input=input, output=output,
                                 enable_history_search=False)
    return lambda prompt: session.prompt(prompt)


def line_reader(stream: TextIO):
    """read(prompt) over a plain stream: one line per call, EOFError at the end."""
    def read(prompt: str) -> str:
        line = stream.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

    return read


def stream_writer(stream: TextIO):
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def line_printer(stream: TextIO, style: str = ""):
    """Print whole lines; `style` is an ANSI SGR code used only when the stream is a terminal."""
    color = bool(style) and stream.isatty() and not os.environ.get("NO_COLOR")

    def show(line: str) -> None:
        stream.write(f"\x1b[{style}m{line}\x1b[0m\n" if color else line + "\n")
        stream.flush()

    return show


def terminal_io(env: Environment) -> ChatIO:
    # With stdout redirected, prompt-toolkit draws on stderr and replies still go to stdout.
    from prompt_toolkit.output import create_output

    output = create_output(stdout=env.stdout if env.stdout_isatty else env.stderr)
    # Ctrl-C cancels a streaming reply, so it must raise KeyboardInterrupt even when this
    # process was started with SIGINT ignored (a parent that ignores it, a shell's background
    # job): prompt-toolkit puts back whatever handler it found after each prompt, and an
    # inherited SIG_IGN then made Ctrl-C do nothing while a reply streamed.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return ChatIO(read=terminal_reader(history_path(), output=output, warn=env.say), write=stream_writer(env.stdout),
                  info=line_printer(env.stderr), notice=line_printer(env.stderr, "2"), interactive=True)


def pipe_io(stdin: TextIO, stdout: TextIO, stderr: TextIO) -> ChatIO:
    for stream in (stdin, stdout):  # bytes that are not UTF-8 must not end the chat
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    return ChatIO(read=line_reader(stdin), write=stream_writer(stdout), info=line_printer(stderr),
                  notice=line_printer(stderr, "2"), interactive=False)
