"""`llamabatch chat`: an interactive multi-turn chat that reuses the prefix cache.

`chat_loop` is the REPL itself; it reads through injected callbacks (`ChatIO`), so it runs
the same on a terminal (prompt-toolkit), on piped stdin (one line = one user turn, replies
on stdout without decoration) and in tests.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, TextIO

import typer

from . import parameters
from .autosave import Autosave
from .conversation import Conversation
from .listing import print_list
from .slash_commands import QUIT, looks_like_command, run_slash_command
from .session import ChatIO, ChatSession
from .store import Store, StoreError, Stored, default_path
from ..env import Environment
from ..common import EXIT_ERROR, EXIT_USAGE, fail, open_engine, resolve_options
from ..options import SharedOptions, with_shared_options

MULTILINE = '"""'


def chat_loop(session: ChatSession) -> None:
    """Read messages and commands until Ctrl-D (end of input) or /bye."""
    io = session.io
    while True:
        try:
            message = read_message(io)
        except KeyboardInterrupt:
            if not io.interactive:
                raise  # a script's Ctrl-C stops the chat (exit 130)
            io.notice("Use Ctrl-D or /bye to exit.")  # on a terminal it only clears the line
            continue
        except EOFError:
            return
        if message is None:
            continue
        try:
            if is_command(message):
                if run_slash_command(session, message.text) == QUIT:
                    return
                continue
            session.say(message.text)
        except KeyboardInterrupt:  # Ctrl-C before a reply started streaming: back to the prompt
            io.notice("interrupted")


@dataclass
class Message:
    """What the person typed. A block between \"\"\" lines is `literal`: never a command,
    even when it starts with /."""

    text: str
    literal: bool = False


def is_command(message: Message) -> bool:
    return not message.literal and looks_like_command(message.text)


def read_message(io: ChatIO) -> Message | None:
    """One line, or the lines between \"\"\" lines; None for a blank line."""
    line = io.read(io.prompt)
    if not line.strip():
        return None
    if not line.lstrip().startswith(MULTILINE):
        return Message(line)
    first = line.lstrip()[len(MULTILINE):]
    if first.rstrip().endswith(MULTILINE):  # """all on one line"""
        return _block(first.rstrip()[:-len(MULTILINE)])
    lines = [first] if first else []
    while True:
        try:
            more = io.read(io.continuation)
        except EOFError:  # input ended inside the block: send what there is
            break
        if more.rstrip().endswith(MULTILINE):
            lines.append(more.rstrip()[:-len(MULTILINE)])
            break
        lines.append(more)
    return _block("\n".join(lines).strip("\n"))


def _block(text: str) -> Message | None:
    if not text.strip():
        return None
    return Message(text, literal=True)


# -- input and output ---------------------------------------------------------------------


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


# -- the command --------------------------------------------------------------------------


@with_shared_options
def chat_command(
    prompt: Annotated[Optional[str], typer.Argument(
        metavar="PROMPT", show_default=False,
        help="One-shot: print the reply to PROMPT and exit. Piped stdin is then the material PROMPT is about.")] = None,
    system: Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="After each reply, print Ollama-style stats (with cached tokens) on stderr.")] = False,
    continue_: Annotated[bool, typer.Option("--continue", "-c", help="Continue the most recent saved conversation.")] = False,
    resume: Annotated[Optional[int], typer.Option("--resume", metavar="ID", help="Continue saved conversation ID (--list shows them).")] = None,
    load: Annotated[Optional[str], typer.Option("--load", metavar="FILE", help="Continue a JSON transcript written by /save (saved as a new conversation).")] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the saved conversations, newest first, and exit.")] = False,
    search: Annotated[Optional[str], typer.Option("--search", metavar="TEXT", help="List the saved conversations with messages containing every word of TEXT, and exit.")] = None,
    no_save: Annotated[bool, typer.Option("--no-save", help="Do not record this chat in the conversation database, nor its KV in the disk prefix store (unless --prefix-store is given).")] = False,
    *,
    opts: SharedOptions,
    env: Environment,
) -> None:
    """Chat with the model: a multi-turn REPL that evaluates only what is new each turn.

    On a terminal: history across runs, \"\"\" lines or Esc-Enter for multi-line input, Ctrl-C stops a reply, Ctrl-D or /bye exits, /help lists the commands.

    With stdin piped, each line is one user turn and each reply goes to stdout as it is.

    Every turn is saved as it happens in $XDG_STATE_HOME/llamabatch/conversations.db (SQLite); -c continues the last conversation.

    Chat uses one slot (all of --n-ctx) unless --n-parallel is set.
    """
    if list_ or search is not None:
        store = Store(create=False)
        try:
            print_list(store, search, env.out, env.say)
        finally:
            store.close()
        return
    if continue_ + (resume is not None) + (load is not None) > 1:
        raise fail("use one of --continue, --resume ID and --load FILE", EXIT_USAGE)
    resolved = resolve_options(opts, env)  # n_parallel defaults to 1 here (settings.layers.COMMAND_DEFAULTS)
    if no_save and resolved.sources.get("prefix_store") != "flag":
        # "record nothing of this chat": the engine's own saves of a prefix two turns share would
        # still write the conversation's KV to disk; an explicit --prefix-store keeps it on
        resolved = resolved.replace(engine=resolved.engine.replace(prefix_store=None))
    stored = read_stored(continue_, resume)
    loaded = Conversation.load(load) if load is not None else None  # a bad file: one line, exit 2
    store, broken = (None, None) if no_save else open_store()
    started = time.perf_counter()
    engine = open_engine(resolved, env)
    load_s = time.perf_counter() - started
    try:
        interactive = env.stdin_isatty and prompt is None
        io = terminal_io(env) if interactive else pipe_io(env.stdin, env.stdout, env.stderr)
        engine.on_notice = io.notice  # a template fallback is said once, dim like other notices
        template = engine.chat_template  # an unusable --chat-template fails here, before any turn
        session = ChatSession(engine, resolved.sampling, io, system=system, verbose=verbose, load_s=load_s)
        if not no_save:
            session.autosave = Autosave(store, meta=lambda: conversation_meta(session), notice=io.notice,
                                        fallback_dir=default_path().parent, broken=broken)
        if stored is not None:
            resume_stored(session, stored, system)
        elif loaded is not None:
            session.replace_conversation(loaded)
            io.notice(f"loaded {len(loaded.messages)} messages from {load}")
        if prompt is not None:
            one_shot(session, prompt, env)
            return
        if interactive:
            io.notice(f"{engine.model_name} · template {template.name} · {engine.slot_ctx}-token context · "
                      f"/help for commands, Ctrl-D or /bye to exit")
        chat_loop(session)
    finally:
        engine.close()
        if store is not None:
            store.close()


def open_store() -> tuple[Store | None, str | None]:
    """The conversation database, or (None, why) when it cannot be used: the chat goes on and
    saves to a JSON file instead (the database is left as it is)."""
    try:
        return Store(), None
    except StoreError as exc:
        return None, str(exc)


def read_stored(continue_: bool, resume: int | None) -> Stored | None:
    """The conversation --continue or --resume ID names; one line and exit 1 when there is none."""
    if not continue_ and resume is None:
        return None
    store = Store(create=False)
    try:
        chosen = store.latest_id() if continue_ else resume
        stored = store.read(chosen) if chosen is not None else None
    finally:
        store.close()
    if stored is None:
        raise fail("no saved conversation to continue yet" if chosen is None else
                   f"no saved conversation {chosen} (llamabatch chat --list shows them)")
    return stored


def resume_stored(session: ChatSession, stored: Stored, system: str | None) -> None:
    conversation = Conversation(stored.system, stored.messages)
    session.replace_conversation(conversation, stored)  # evaluates it once, in the background
    if system is not None:
        session.set_system(system)
    other = f" (started with {stored.model})" if stored.model and stored.model != session.engine.model_name else ""
    session.io.notice(f"continuing conversation {stored.id}: {len(stored.messages)} messages{other}")


def one_shot(session: ChatSession, prompt: str, env: Environment) -> None:
    """`chat PROMPT`: one reply on stdout. Piped stdin is the material, PROMPT the instruction
    after it (as simonw/llm does)."""
    material = "" if env.stdin_isatty else env.stdin.read()
    text = f"{material.rstrip()}\n\n{prompt}" if material.strip() else prompt
    result = session.say(text)
    if result.finish_reason == "error":
        raise typer.Exit(EXIT_ERROR)


def conversation_meta(session: ChatSession) -> dict:
    """What a new conversation row records besides its messages."""
    return {"model": session.engine.model_name, "template": session.template.name,
            "settings": {"num_ctx": session.num_ctx, **parameters.settings(session.params)}}
