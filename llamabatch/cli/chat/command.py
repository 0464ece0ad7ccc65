"""`llamabatch chat`: an interactive multi-turn chat that reuses the prefix cache.

The conversation, its store and the read-eval loop are the library's (llamabatch/chat/); this
module turns the command line into a session over the terminal or the pipes (chat_io.py).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ...errors import InvalidRequest
from ..engine_setup import open_engine, resolve_options
from ..exit_status import EXIT_ERROR
from ..env import Environment
from ..engine_options import EngineOptions, with_engine_options

if TYPE_CHECKING:
    from ...chat.session import ChatSession


@with_engine_options
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
    tools: Annotated[Optional[str], typer.Option("--tools", metavar="FILE", help="Offer the model the tools of FILE (an OpenAI tools JSON array); each call a reply makes is named, and you answer with its result.")] = None,
    no_save: Annotated[bool, typer.Option("--no-save", help="Do not record this chat in the conversation database, nor its KV in the disk prefix store (unless --prefix-store is given).")] = False,
    *,
    opts: EngineOptions,
    env: Environment,
) -> None:
    """Chat with the model: a multi-turn REPL that evaluates only what is new each turn.

    On a terminal: history across runs, \"\"\" lines or Esc-Enter for multi-line input, Ctrl-C stops a reply, Ctrl-D or /bye exits, /help lists the commands.

    With stdin piped, each line is one user turn and each reply goes to stdout as it is.

    Every turn is saved as it happens in $XDG_STATE_HOME/llamabatch/conversations.db (SQLite); -c continues the last conversation.

    Chat uses one slot (all of --n-ctx) unless --n-parallel is set. Without --n-ctx, each slot holds the model's trained context where the KV memory allowed holds that much (else what it holds, never under 4096 tokens); past that, the oldest exchanges are dropped, and the chat says so.
    """
    # The chat library (prompt_toolkit, SQLite) loads when a chat starts: `chat --help` never does
    from ...chat.autosave import Autosave
    from ...chat.context_size import chat_context, context_words
    from ...chat.conversation import Conversation
    from ...chat.conversation_list import print_list
    from ...chat.repl import chat_loop
    from ...chat.saved import conversation_meta, open_store, read_stored, resume_stored
    from ...chat.session import ChatSession
    from ...chat.store import Store, default_path
    from .chat_io import pipe_io, terminal_io

    if list_ or search is not None:
        store = Store(create=False)
        try:
            print_list(store, search, env.out, env.say)
        finally:
            store.close()
        return
    if continue_ + (resume is not None) + (load is not None) > 1:
        raise InvalidRequest("use one of --continue, --resume ID and --load FILE")
    resolved = resolve_options(opts, env)  # n_parallel defaults to 1 here (settings.layers.COMMAND_DEFAULTS)
    if no_save and resolved.sources.get("prefix_store") != "flag":
        # "record nothing of this chat": the engine's own saves of a prefix two turns share would
        # still write the conversation's KV to disk; an explicit --prefix-store keeps it on
        resolved = resolved.replace(engine=resolved.engine.replace(prefix_store=None))
    from ...chat.chat_tools import read_tools_file

    offered = read_tools_file(tools) if tools is not None else None  # a bad file: one line, before the model loads
    stored = read_stored(continue_, resume)
    loaded = Conversation.load(load) if load is not None else None  # a bad file: one line, exit 2
    store, broken = (None, None) if no_save else open_store()
    started = time.perf_counter()
    resolved, ctx_why = chat_context(resolved, env.engine_factory)  # n_ctx auto: up to the model's context
    engine = open_engine(resolved, env)
    load_s = time.perf_counter() - started
    try:
        interactive = env.stdin_isatty and prompt is None
        io = terminal_io(env) if interactive else pipe_io(env.stdin, env.stdout, env.stderr)
        engine.on_notice = io.notice  # a template fallback is said once, dim like other notices
        template = engine.chat_template  # an unusable --chat-template fails here, before any turn
        session = ChatSession(engine, resolved.sampling, io, system=system, verbose=verbose, load_s=load_s,
                              tools=offered)
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
            io.notice(f"{engine.model_name} · template {template.name} · {context_words(engine.slot_ctx, ctx_why)} · "
                      f"/help for commands, Ctrl-D or /bye to exit")
        chat_loop(session)
    finally:
        engine.close()
        if store is not None:
            store.close()


def one_shot(session: ChatSession, prompt: str, env: Environment) -> None:
    """`chat PROMPT`: one reply on stdout. Piped stdin is the material, PROMPT the instruction
    after it (as simonw/llm does)."""
    material = "" if env.stdin_isatty else env.stdin.read()
    text = f"{material.rstrip()}\n\n{prompt}" if material.strip() else prompt
    result = session.say(text)
    if result.finish_reason == "error":
        raise typer.Exit(EXIT_ERROR)
