"""The chat's read-eval loop: read a message or a slash command, answer it, until Ctrl-D or /bye.

It reads and writes only through the session's injected callbacks (`ChatIO`), so it runs the
same on a terminal (prompt-toolkit), on piped stdin (one line = one user turn, replies on
stdout without decoration) and in tests.
"""
from __future__ import annotations

from dataclasses import dataclass

from .session import ChatIO, ChatSession
from .slash_commands import QUIT, looks_like_command, run_slash_command

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
