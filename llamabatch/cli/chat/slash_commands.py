"""The chat's slash commands: parsing and effects.

Every command answers in whole lines through the session's io.info (stderr), so piped
stdout carries replies only. An unknown command or a bad value gets one line of help.
"""
from __future__ import annotations

import shlex
from typing import Callable

from .conversation import Conversation
from ...errors import InvalidRequest
from .session import ChatSession

# /set PARAM VALUE: the sampling settings a person tunes while chatting, and their types
SETTABLE = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "max_tokens": int,
            "seed": int, "repeat_penalty": float}
SHOW_TOPICS = ("model", "template", "parameters", "context", "system")
COMMAND_LIST = "/help /system /set /show /clear /retry /save /load /stats /bye"

HELP = """\
/help                 this list
/system TEXT          set the system prompt (/system alone shows it; /system "" removes it)
/set PARAM VALUE      temperature, top_k, top_p, min_p, max_tokens, seed (or random), repeat_penalty
/set verbose [on|off] print timing and token stats after each reply (/set quiet: off)
/show [WHAT]          model, template, parameters, context, system (all of them without WHAT)
/clear                start a new conversation (the system prompt stays)
/retry                generate the last reply again
/save FILE            write the conversation as JSON
/load FILE            continue a saved conversation
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
    session.conversation.system = text or None
    session.io.info("system prompt set" if text else "system prompt removed")


def _set(session: ChatSession, rest: str) -> None:
    name, _, value = rest.partition(" ")
    name, value = name.lower(), value.strip()
    if name in ("verbose", "quiet"):
        on = _switch(value) if name == "verbose" else (False if not value else None)
        if on is None:
            session.io.info("usage: /set verbose [on|off]  or  /set quiet")
            return
        session.verbose = on
        session.io.info(f"verbose {'on' if on else 'off'}")
        return
    kind = SETTABLE.get(name)
    if kind is None or not value:
        session.io.info(f"usage: /set PARAM VALUE with PARAM one of {', '.join(SETTABLE)}, verbose")
        return
    try:
        parsed = _parse(name, value, kind)
        session.params = session.params.replace(**{name: parsed}).validate()
    except InvalidRequest as exc:
        session.io.info(f"/set {name}: {exc}")
        return
    session.io.info(f"{name} = {'random' if parsed is None else parsed}")


def _parse(name: str, value: str, kind: type):
    if name == "seed" and value.lower() in ("random", "none", "-1"):
        return None
    try:
        return kind(value)
    except ValueError:
        raise InvalidRequest(f"{value!r} is not {'an integer' if kind is int else 'a number'}") from None


def _switch(value: str) -> bool | None:
    low = value.lower()
    if low in ("", "on", "true", "yes", "1"):
        return True
    if low in ("off", "false", "no", "0"):
        return False
    return None


def _show(session: ChatSession, rest: str) -> None:
    topic = rest.lower()
    if topic in ("params", "param", "parameter"):
        topic = "parameters"
    if topic and topic not in SHOW_TOPICS:
        session.io.info(f"usage: /show [{'|'.join(SHOW_TOPICS)}]")
        return
    for t in ([topic] if topic else [t for t in SHOW_TOPICS if t != "system"]):
        for line in SHOW[t](session):
            session.io.info(line)


def _show_model(session: ChatSession) -> list[str]:
    return [f"model: {session.engine.model_name} ({session.engine.model_path})"]


def _show_template(session: ChatSession) -> list[str]:
    template = session.template
    lines = [f"template: {template.name}" + (f" ({template.source})" if template.source.startswith("built-in")
                                             else f" (Jinja, {len(template.source)} characters)")]
    if template.fallback_reason:
        lines.append(f"  {template.fallback_reason}")
    if not template.source.startswith("built-in"):
        lines.extend("  " + line for line in template.source.splitlines())
    return lines


def _show_parameters(session: ChatSession) -> list[str]:
    p = session.params
    values = {name: getattr(p, name) for name in SETTABLE}
    values["seed"] = "random" if p.seed is None else p.seed
    shown = " ".join(f"{k}={v}" for k, v in values.items())
    stops = f" stop={p.stop!r}" if p.stop else ""
    return [f"parameters: {shown}{stops} verbose={'on' if session.verbose else 'off'}"]


def _show_context(session: ChatSession) -> list[str]:
    used = session.context_used()
    ctx = session.engine.slot_ctx
    room = ctx - session.builder.budget(session.params.max_tokens)
    return [f"context: {used} of {ctx} tokens used ({len(session.conversation.messages)} messages; "
            f"{room} kept free for the reply)"]


def _show_system(session: ChatSession) -> list[str]:
    return [f"system: {session.conversation.system!r}" if session.conversation.system else "system: none"]


SHOW: dict[str, Callable[[ChatSession], list[str]]] = {
    "model": _show_model, "template": _show_template, "parameters": _show_parameters,
    "context": _show_context, "system": _show_system,
}


def _clear(session: ChatSession, rest: str) -> None:
    session.conversation.clear()
    session.io.info("new conversation" + (" (system prompt kept)" if session.conversation.system else ""))


def _retry(session: ChatSession, rest: str) -> None:
    if session.retry() is None:
        session.io.info("nothing to retry: no message yet")


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
        f"prompt tokens: {t.prompt_tokens} (cached {t.cached_tokens}{share}, evaluated {t.prompt_tokens - t.cached_tokens})",
        f"generated tokens: {t.completion_tokens}",
        f"engine: {s.n_parallel} slot(s) of {s.slot_ctx} tokens, {s.submitted} requests, {s.ticks} ticks, "
        f"up {s.uptime_s:.1f}s",
    ]
    for line in lines:
        session.io.info(line)


COMMANDS: dict[str, Callable[[ChatSession, str], str | None]] = {
    "help": _help, "?": _help, "system": _system, "set": _set, "show": _show, "clear": _clear,
    "retry": _retry, "save": _save, "load": _load, "stats": _stats, "bye": _bye, "exit": _bye, "quit": _bye,
}
