"""A multi-turn chat over the engine: the transcript, and the prompt tokens for each reply.

Every reply is generated from the whole conversation rendered with the chat template, so the
engine's prefix cache must find the previous turn in the slot for the chat to stay fast.
`PromptBuilder` keeps that working:

- It re-sends exactly the tokens of the previous prompt followed by the tokens the model
  generated for its reply, then only the newly rendered text. Re-tokenizing the reply text
  would not always give the same tokens (Gemma's template strips the reply, and a text can
  have several tokenizations), and every token that differs invalidates the cache from there on.
  It splices only when the template renders the old prompt as a byte-identical prefix of the new
  one (checked with a marker in place of the reply); otherwise it tokenizes the whole rendering.
- When the prompt would leave less than `max_tokens` of the slot for the reply, it drops the
  oldest exchanges (never the system prompt, never the newest user message). Once it has to
  drop, it drops down to half the budget so the next turns reuse the cache again instead of
  re-evaluating the whole window after every single drop.

No terminal or CLI code here: the transcript is plain data and `save`/`load` are JSON files.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..models.chat_template import ChatTemplate, validate_messages
from ..errors import InvalidRequest
from ..files.replaced_file import replacing
from ..files.whole_file import NOT_JSON, NOT_UTF8, UnreadableFile, read_json

TRANSCRIPT_VERSION = 1
CHAT_ROLES = ("system", "user", "assistant")

# Stands in for the last reply when checking that the template extends the previous prompt.
# A private-use character cannot come from the tokenizer's text or the user by accident.
_MARKER = "\ue000llamabatch-reply\ue000"
MAX_STEPS_BACK = 32  # /undo steps that still splice from the slot's tokens (older ones re-tokenize)


class Conversation:
    """The system prompt and the user/assistant messages, in order."""

    def __init__(self, system: str | None = None, messages: Sequence[dict] | None = None):
        self.system = system or None
        self.messages: list[dict] = [{"role": m["role"], "content": m["content"]} for m in (messages or [])]
        self.dropped = 0  # messages dropped from the front to fit the context (the autosave keeps them)

    def full(self) -> list[dict]:
        """What the template renders: the system prompt first (when set), then the messages."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m["role"], "content": m["content"]} for m in self.messages]

    def add(self, role: str, content: str) -> None:
        self.messages.append({"role": role, "content": content})

    @property
    def last_role(self) -> str | None:
        return self.messages[-1]["role"] if self.messages else None

    def pop_reply(self) -> str | None:
        """Remove the last message when it is an assistant reply; return its text."""
        if self.last_role == "assistant":
            return self.messages.pop()["content"]
        return None

    def drop_oldest_exchange(self) -> int:
        """Drop the oldest user message and everything before the next one.

        Returns how many messages went; 0 when only the newest user message (and what follows
        it) is left, which is never dropped.
        """
        users = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        if len(users) < 2:
            return 0
        cut = users[1]
        del self.messages[:cut]
        self.dropped += cut
        return cut

    def undo(self) -> int:
        """Drop the last exchange: the last user message and the reply after it.
        Returns how many messages went (0: there is no exchange to drop)."""
        users = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        if not users:
            return 0
        n = len(self.messages) - users[-1]
        del self.messages[users[-1]:]
        return n

    def clear(self) -> None:
        """A new conversation with the same system prompt."""
        self.messages = []
        self.dropped = 0

    # -- JSON ----------------------------------------------------------------------------

    def to_dict(self, **meta: Any) -> dict:
        """The transcript as JSON data: OpenAI-style messages, system prompt first."""
        return {"version": TRANSCRIPT_VERSION, **meta, "messages": self.full()}

    @classmethod
    def from_dict(cls, data: Any) -> "Conversation":
        """Accept what `to_dict` writes, or a bare list of messages; InvalidRequest otherwise."""
        messages = data.get("messages") if isinstance(data, dict) else data
        if messages == []:
            return cls()
        messages = validate_messages(messages)
        system = None
        if messages and messages[0]["role"] == "system":
            system = messages.pop(0)["content"]
        for i, m in enumerate(messages):
            if m["role"] not in CHAT_ROLES[1:]:
                raise InvalidRequest(f"messages[{i + (1 if system is not None else 0)}]: a chat transcript holds "
                                     f"one leading system message, then user and assistant messages")
        return cls(system, messages)

    def save(self, path: str, **meta: Any) -> None:
        """Write the transcript as JSON (raises OSError)."""
        text = json.dumps(self.to_dict(**meta), ensure_ascii=False, indent=2) + "\n"
        path = os.path.expanduser(path)
        with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:  # never half a transcript
            f.write(text)

    @classmethod
    def load(cls, path: str) -> "Conversation":
        """Read a transcript; InvalidRequest (one line) when it is not one."""
        path = os.path.expanduser(path)
        try:
            data = read_json(path, "transcript")  # bounded, UTF-8, no RecursionError (whole_file)
        except UnreadableFile as exc:
            if exc.kind in (NOT_JSON, NOT_UTF8):
                raise InvalidRequest(f"{path} is not a JSON transcript: {exc.why}") from None
            raise InvalidRequest(f"cannot read {path}: {exc.why}") from None
        try:
            return cls.from_dict(data)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{path}: {exc}") from None


@dataclass
class TurnPrompt:
    """The prompt for one reply."""

    text: str  # the template's rendering of the conversation
    tokens: list[int]  # what is submitted; may hold the previous reply's generated tokens
    n_messages: int  # messages rendered (system prompt included)
    dropped: int = 0  # exchanges dropped so that it fits
    fits: bool = True  # False: even the newest message alone leaves less than max_tokens for the reply
    spliced: bool = False  # built on the previous prompt and reply tokens


@dataclass
class _Sent:
    prompt: TurnPrompt
    reply_text: str | None = None
    reply_tokens: list[int] | None = field(default=None)  # None: they do not spell reply_text


class PromptBuilder:
    """Prompt tokens for each reply of one conversation (see the module docstring)."""

    def __init__(self, template: ChatTemplate, tokenize: Callable[[str], list[int]], slot_ctx: int):
        self.template = template
        self.tokenize = tokenize  # text -> tokens, parsing special-token text, adding BOS
        self.slot_ctx = slot_ctx
        self._leading = tokenize("")  # what the tokenizer puts in front of any text (BOS)
        # What was sent for each reply, newest last: /undo steps back to the one before, so
        # the next prompt is spliced from tokens the slot still holds.
        self._sent: list[_Sent] = []

    @property
    def _last(self) -> _Sent | None:
        return self._sent[-1] if self._sent else None

    @classmethod
    def for_engine(cls, engine: Any) -> "PromptBuilder":
        return cls(engine.chat_template, lambda text: engine.tokenize(text, special=True), engine.slot_ctx)

    def budget(self, max_tokens: int) -> int:
        """Most prompt tokens that still leave room for a reply of max_tokens (at most half the slot)."""
        return self.slot_ctx - min(max_tokens, self.slot_ctx // 2)

    def build(self, conversation: Conversation, max_tokens: int) -> TurnPrompt:
        """The prompt for the next reply; drops the oldest exchanges from `conversation` when needed."""
        budget = self.budget(max_tokens)
        prompt = self._prompt(conversation.full())
        dropped = 0
        while len(prompt.tokens) > budget or (dropped and len(prompt.tokens) > budget // 2):
            if not conversation.drop_oldest_exchange():
                break
            dropped += 1
            prompt = self._prompt(conversation.full())
        prompt.dropped = dropped
        prompt.fits = len(prompt.tokens) <= budget
        return prompt

    def count(self, conversation: Conversation) -> int:
        """Tokens the conversation takes now (as the next prompt, before a new message)."""
        messages = conversation.full()
        return len(self._prompt(messages).tokens) if messages else 0

    def remember(self, prompt: TurnPrompt, reply_text: str, reply_tokens: list[int] | None) -> None:
        """Record what was sent and what came back. Pass reply_tokens only when they spell
        exactly reply_text (not when a stop string was cut from the text)."""
        sent = _Sent(prompt, reply_text, list(reply_tokens) if reply_tokens is not None else None)
        if self._sent and self._sent[-1].prompt.text == prompt.text:
            self._sent[-1] = sent  # /retry: the same prompt, another reply
        else:
            self._sent = self._sent[-(MAX_STEPS_BACK - 1):] + [sent]

    def step_back(self) -> None:
        """Forget the last reply's prompt (/undo): the one before it is the base again."""
        if self._sent:
            self._sent.pop()

    def forget(self) -> None:
        self._sent = []

    def resume(self, prompt: TurnPrompt, reply_text: str, reply_tokens: list[int] | None) -> None:
        """Go on from a saved turn (chat -c with the disk prefix store): `prompt` holds exactly
        the tokens its stored entry holds, so every next prompt starts with them. Without the
        reply's own tokens, the reply text's tokens stand in (the entry still starts the prompt)."""
        if reply_tokens is None:
            reply_tokens = self.tokenize(reply_text)
            if self._leading and reply_tokens[:len(self._leading)] == self._leading:
                reply_tokens = reply_tokens[len(self._leading):]
        self._sent = [_Sent(prompt, reply_text, list(reply_tokens))]

    def resumed_prefix(self) -> list[int] | None:
        """The tokens every next prompt starts with after resume(): the saved prompt and its reply."""
        last = self._last
        if last is None or last.reply_tokens is None:
            return None
        return last.prompt.tokens + last.reply_tokens

    # -- internals -----------------------------------------------------------------------

    def _prompt(self, messages: list[dict]) -> TurnPrompt:
        text = self.template.render(messages, add_generation_prompt=True)
        tokens = self._reuse(messages, text)
        if tokens is not None:
            return TurnPrompt(text, tokens, len(messages), spliced=True)
        return TurnPrompt(text, self.tokenize(text), len(messages))

    def _reuse(self, messages: list[dict], text: str) -> list[int] | None:
        last = self._last
        if last is None:
            return None
        if text == last.prompt.text:  # the same prompt again (/retry)
            return list(last.prompt.tokens)
        n = last.prompt.n_messages
        if (last.reply_tokens is None or len(messages) <= n or messages[n]["role"] != "assistant"
                or messages[n]["content"] != last.reply_text):
            return None
        marked = messages[:n] + [{**messages[n], "content": _MARKER}] + messages[n + 1:]
        head, marker, tail = self.template.render(marked, add_generation_prompt=True).partition(_MARKER)
        if not marker or head != last.prompt.text or _MARKER in tail:
            return None  # this template does not extend the previous prompt byte for byte
        tail_tokens = self.tokenize(tail)
        if self._leading and tail_tokens[:len(self._leading)] == self._leading:
            tail_tokens = tail_tokens[len(self._leading):]
        return last.prompt.tokens + last.reply_tokens + tail_tokens
