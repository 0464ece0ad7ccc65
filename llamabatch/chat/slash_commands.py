"""The chat's slash commands: parsing and effects.

Every command answers in whole lines through the session's io.info (stderr), so piped
stdout carries replies only. An unknown command or a bad value gets one line of help.
"""
from __future__ import annotations

import shlex
from typing import Callable

from . import parameters, show
from .conversation import Conversation
from ..errors import InvalidRequest
from .session import ChatSession

COMMAND_LIST = "/help /system /set /show /clear /retry /undo /save /load /stats /bye"

HELP = """\
/help                 this list
/system TEXT          set the system prompt (/system alone shows it; /system "" removes it)
/set PARAM VALUE      temperature, top_k, top_p, min_p, max_tokens, seed (or random), repeat_penalty, stop
/set parameter NAME VALUE  Ollama's names: num_ctx, num_predict, temperature, top_k, top_p, min_p,
                      repeat_penalty, seed, stop
/set system TEXT      the same as /system TEXT
/set verbose [on|off] print timing and token stats after each reply (/set quiet: off)
/show [WHAT]          info, model, template, parameters, context, system (/show alone: the middle four)
/clear                start a new conversation (the system prompt stays; the old one stays saved)
/retry                generate the last reply again
/undo                 drop the last exchange
/save FILE            write the conversation as JSON
/load FILE            continue a conversation from a JSON file (saved as a new conversation)
/stats                token and request counts for this session
/bye                  leave (or Ctrl-D)
Multi-line input: start and end it with \"\"\" lines, or press Esc then Enter for a new line.
A message that starts with / goes inside \"\"\" lines."""

QUIT = "quit"
DONE = "done"


def looks_like_command(line: str) -> bool:
    return line.startswith("/")


def run_slash_command(session: ChatSession, line: str) -> str:
    """Carry out one /command. Returns QUIT when the chat should end, else DONE."""
    name, _, rest = line[1:].partition(" ")
    name, rest = name.lower(), rest.strip()
    handler = COMMANDS.get(name)
    if handler is None:
        session.io.info(f"unknown command /{name}; commands: {COMMAND_LIST} (/help explains them)")
        return DONE
    return handler(session, rest) or DONE


def _help(session: ChatSession, rest: str) -> None:
    for line in HELP.splitlines():
        session.io.info(line)


def _bye(session: ChatSession, rest: str) -> str:
    return QUIT


def _system(session: ChatSession, rest: str) -> None:
    if not rest:
        current = session.conversation.system
        session.io.info(f"system prompt: {current!r}" if current else
                        'no system prompt; /system TEXT sets one')
        return
    text = _unquote(rest) if rest[:1] in ("'", '"') else rest
    session.set_system(text)
    session.io.info("system prompt set" if text else "system prompt removed")


def _set(session: ChatSession, rest: str) -> None:
    name, _, value = rest.partition(" ")
    name, value = name.lower(), value.strip()
    if name == "system":
        return _system(session, value)
    if name == "parameter":  # Ollama's /set parameter NAME VALUE
        name, _, value = value.partition(" ")
        name, value = name.lower(), value.strip()
    if name in ("verbose", "quiet"):
        on = _switch(value) if name == "verbose" else (False if not value else None)
        if on is None:
            session.io.info("usage: /set verbose [on|off]  or  /set quiet")
            return
        session.verbose = on
        session.io.info(f"verbose {'on' if on else 'off'}")
        return
    known = name == parameters.NUM_CTX or parameters.field_for(name) is not None
    if not known or not value:
        session.io.info(f"usage: /set PARAM VALUE or /set parameter NAME VALUE, with a name from "
                        f"{', '.join(parameters.NAMES)}; /set verbose, /set system TEXT")
        return
    try:
        if name == parameters.NUM_CTX:
            session.num_ctx = parsed = parameters.parse_num_ctx(value, session.engine.slot_ctx)
        else:
            session.params, parsed = parameters.apply(session.params, name, value)
    except InvalidRequest as exc:
        session.io.info(f"/set {name}: {exc}")
        return
    session.io.info(f"{name} = {'random' if parsed is None else parsed}")


def _switch(value: str) -> bool | None:
    low = value.lower()
    if low in ("", "on", "true", "yes", "1"):
        return True
    if low in ("off", "false", "no", "0"):
        return False
    return None


def _show(session: ChatSession, rest: str) -> None:
    lines = show.lines_for(session, rest)
    for line in lines if lines is not None else [show.usage()]:
        session.io.info(line)


def _clear(session: ChatSession, rest: str) -> None:
    session.clear()
    session.io.info("new conversation" + (" (system prompt kept)" if session.conversation.system else ""))


def _retry(session: ChatSession, rest: str) -> None:
    if session.retry() is None:
        session.io.info("nothing to retry: no message yet")


def _undo(session: ChatSession, rest: str) -> None:
    if not session.undo():
        session.io.info("nothing to undo: no exchange yet")
        return
    session.io.info(f"dropped the last exchange ({len(session.conversation.messages)} messages left)")


def _save(session: ChatSession, rest: str) -> None:
    path = _path_arg(session, rest, "/save FILE")
    if path is None:
        return
    try:
        session.conversation.save(path, model=session.engine.model_name, template=session.template.name)
    except OSError as exc:
        session.io.info(f"/save: cannot write {path}: {exc.strerror or exc}")
        return
    session.io.info(f"saved {len(session.conversation.messages)} messages to {path}")


def _load(session: ChatSession, rest: str) -> None:
    path = _path_arg(session, rest, "/load FILE")
    if path is None:
        return
    try:
        conversation = Conversation.load(path)
    except InvalidRequest as exc:
        session.io.info(f"/load: {exc}")
        return
    session.replace_conversation(conversation)
    session.io.info(f"loaded {len(conversation.messages)} messages from {path}")


def _path_arg(session: ChatSession, rest: str, usage: str) -> str | None:
    path = _unquote(rest) if rest[:1] in ("'", '"') else rest
    if not path:
        session.io.info(f"usage: {usage}")
        return None
    return path


def _unquote(text: str) -> str:
    try:
        parts = shlex.split(text)
    except ValueError:
        return text
    return " ".join(parts)


def _stats(session: ChatSession, rest: str) -> None:
    t = session.totals
    share = f", {100 * t.cached_tokens / t.prompt_tokens:.0f}%" if t.prompt_tokens else ""
    s = session.engine.stats()
    lines = [
        f"replies: {t.replies} ({t.cancelled} cancelled, {t.failed} failed, {t.dropped} exchanges dropped to fit)",
        f"prompt tokens: {t.prompt_tokens} (cached {t.cached_tokens}{share}, evaluated {t.prompt_tokens - t.cached_tokens}"
        f"{f'; {t.restored_tokens} of the cached from the disk prefix store' if t.restored_tokens else ''})",
        f"generated tokens: {t.completion_tokens}",
        f"engine: {s.n_parallel} slot(s) of {s.slot_ctx} tokens, {s.submitted} requests, {s.ticks} ticks, "
        f"up {s.uptime_s:.1f}s",
    ]
    for line in lines:
        session.io.info(line)


COMMANDS: dict[str, Callable[[ChatSession, str], str | None]] = {
    "help": _help, "?": _help, "system": _system, "set": _set, "show": _show, "clear": _clear,
    "retry": _retry, "undo": _undo, "save": _save, "load": _load, "stats": _stats, "bye": _bye, "exit": _bye, "quit": _bye,
}
