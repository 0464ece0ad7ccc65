"""What `/show` prints: info, model, template, parameters, context, system.

Ollama's topics (`/show info`, `/show parameters`, `/show system`, `/show template`) and
llamabatch's own (`model`, `context`). Each topic is a function from the session to lines.
"""
from __future__ import annotations

from typing import Any, Callable

from . import parameters
from .session import ChatSession
from ..models.gguf_header import FILE_TYPES

TOPICS = ("info", "model", "template", "parameters", "context", "system")
ALIASES = {"params": "parameters", "param": "parameters", "parameter": "parameters", "modelfile": "info"}
DEFAULT = ("model", "template", "parameters", "context")  # /show alone


def lines_for(session: ChatSession, topic: str) -> list[str] | None:
    """The lines for `topic` ('' = the default set); None for an unknown topic."""
    topic = ALIASES.get(topic.lower(), topic.lower())
    if topic and topic not in TOPICS:
        return None
    out: list[str] = []
    for t in ([topic] if topic else DEFAULT):
        out.extend(SHOW[t](session))
    return out


def usage() -> str:
    return f"usage: /show [{'|'.join(TOPICS)}]"


def _info(session: ChatSession) -> list[str]:
    """Like `ollama show`'s Model block: what the GGUF says about itself, and this chat's context."""
    engine = session.engine
    meta: dict[str, Any] = engine.runner.metadata
    arch = meta.get("general.architecture") or "unknown"
    trained = meta.get(f"{arch}.context_length")
    rows = [
        ("model", engine.model_name),
        ("architecture", arch),
        ("parameters", meta.get("general.size_label") or "unknown"),
        ("quantization", _quantization(meta.get("general.file_type"))),
        ("context length", f"{session.num_ctx} (this chat's slot: {engine.slot_ctx}"
                           + (f"; trained for {trained})" if trained else ")")),
        ("template", session.template.name),
    ]
    return ["info:"] + [f"  {label:<16}{value}" for label, value in rows]


def _quantization(file_type: Any) -> str:
    try:
        return FILE_TYPES.get(int(file_type), f"type {file_type}")  # the runner's metadata values are text
    except (TypeError, ValueError):
        return "unknown"


def _model(session: ChatSession) -> list[str]:
    return [f"model: {session.engine.model_name} ({session.engine.model_path})"]


def _template(session: ChatSession) -> list[str]:
    template = session.template
    lines = [f"template: {template.name}" + (f" ({template.source})" if template.source.startswith("built-in")
                                             else f" (Jinja, {len(template.source)} characters)")]
    if template.fallback_reason:
        lines.append(f"  {template.fallback_reason}")
    if not template.source.startswith("built-in"):
        lines.extend("  " + line for line in template.source.splitlines())
    return lines


def _parameters(session: ChatSession) -> list[str]:
    return parameters.show(session.params, session.num_ctx, session.verbose)


def _context(session: ChatSession) -> list[str]:
    used = session.context_used()
    ctx = session.num_ctx
    room = ctx - session.builder.budget(session.params.max_tokens)
    return [f"context: {used} of {ctx} tokens used ({len(session.conversation.messages)} messages; "
            f"{room} kept free for the reply)"]


def _system(session: ChatSession) -> list[str]:
    return [f"system: {session.conversation.system!r}" if session.conversation.system else "system: none"]


SHOW: dict[str, Callable[[ChatSession], list[str]]] = {
    "info": _info, "model": _model, "template": _template, "parameters": _parameters,
    "context": _context, "system": _system,
}
