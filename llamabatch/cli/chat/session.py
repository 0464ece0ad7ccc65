"""One chat session: the conversation, the sampling settings, and generating each reply.

Knows nothing about terminals: everything it shows goes through the injected `ChatIO`
callbacks, so the same code serves prompt-toolkit, piped stdin and tests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from .autosave import Autosave
from .conversation import Conversation, PromptBuilder, TurnPrompt
from .store import Stored
from ...params import SamplingParams
from ...results import Result
from .ollama_stats import stats_lines


@dataclass
class ChatIO:
    """How the chat talks to the person (or script) at the other end.

    read(prompt) returns one line; it raises EOFError at the end of input and
    KeyboardInterrupt for Ctrl-C at the prompt. write() gets reply text as it streams
    (stdout); info() and notice() get whole lines for people (stderr; notices are dim).
    A KeyboardInterrupt raised while a reply streams (Ctrl-C, or a test's write())
    cancels that reply.
    """

    read: Callable[[str], str]
    write: Callable[[str], None]
    info: Callable[[str], None]
    notice: Callable[[str], None]
    interactive: bool = False  # a terminal: prompts, a greeting, a blank line after replies
    prompt: str = ">>> "
    continuation: str = "... "


@dataclass
class SessionTotals:
    replies: int = 0
    cancelled: int = 0
    failed: int = 0
    dropped: int = 0  # exchanges dropped to fit the context
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class ChatSession:
    def __init__(self, engine: Any, params: SamplingParams, io: ChatIO, *, system: str | None = None,
                 verbose: bool = False, load_s: float = 0.0, autosave: Autosave | None = None):
        self.engine = engine
        self.params = params
        self.io = io
        self.verbose = verbose
        self.conversation = Conversation(system)
        self.builder = PromptBuilder.for_engine(engine)
        self.totals = SessionTotals()
        self.last_result: Result | None = None
        self._load_s = load_s  # shown as "load duration" once, with the first reply
        self._warmup: Any = None
        self.autosave = autosave  # None: --no-save

    @property
    def num_ctx(self) -> int:
        """Tokens the conversation may use: the slot, or less after /set parameter num_ctx."""
        return self.builder.slot_ctx

    @num_ctx.setter
    def num_ctx(self, n: int) -> None:
        self.builder.slot_ctx = min(n, self.engine.slot_ctx)

    @property
    def template(self):
        return self.engine.chat_template

    # -- turns -----------------------------------------------------------------------------

    def say(self, text: str) -> Result:
        """A user message and the reply to it. A reply that fails leaves no trace of the turn."""
        self.conversation.add("user", text)
        try:
            result = self.reply()
        except KeyboardInterrupt:  # before the reply started: the turn did not happen
            self._drop_unanswered(text)
            raise
        if result.finish_reason == "error":
            self._drop_unanswered(text)
        else:
            self._save(result)
        return result

    def retry(self) -> Result | None:
        """Generate the last reply again; None when there is no user message to answer."""
        if not any(m["role"] == "user" for m in self.conversation.messages):
            return None
        old = self.conversation.pop_reply()
        try:
            result = self.reply()
        except KeyboardInterrupt:
            self._restore_reply(old)
            raise
        if result.finish_reason == "error":
            self._restore_reply(old)
        else:
            self._save(result)
        return result

    def undo(self) -> bool:
        """Drop the last exchange (/undo). The slot keeps the tokens before it, so the next
        reply evaluates only what is new from there. False: nothing to drop."""
        if not self.conversation.undo():
            return False
        self.builder.step_back()
        self._save()
        return True

    def set_system(self, text: str | None) -> None:
        self.conversation.system = text or None
        self._save()

    def clear(self) -> None:
        """A new conversation with the same system prompt (the old one stays saved)."""
        self.conversation.clear()
        if self.autosave is not None:
            self.autosave.start_over()

    def _restore_reply(self, old: str | None) -> None:
        if old is not None and self.conversation.last_role == "user":
            self.conversation.add("assistant", old)

    def _drop_unanswered(self, text: str) -> None:
        # (an overflow may have dropped older messages meanwhile; this one is always last)
        if self.conversation.messages[-1:] == [{"role": "user", "content": text}]:
            self.conversation.messages.pop()

    def reply(self) -> Result:
        """Stream a reply to the conversation as it stands and add it to the conversation."""
        self._wait_for_warmup()
        prompt = self.builder.build(self.conversation, self.params.max_tokens)
        if prompt.dropped:
            self.totals.dropped += prompt.dropped
            self.io.notice(f"context full: dropped the {_count(prompt.dropped, 'oldest exchange')} "
                           f"to fit the {self.engine.slot_ctx}-token context")
        start = time.perf_counter()
        handle = self.engine.submit(prompt.tokens, self.request_params())
        shown = self._stream(handle)
        result = self._wait(handle)
        total_s = time.perf_counter() - start
        if len(result.text) > shown:  # what the engine made between Ctrl-C and the cancel
            self.io.write(result.text[shown:])
        if result.text or shown:
            self.io.write("\n\n" if self.io.interactive else "\n")
        self.last_result = result
        self._account(result)
        if result.finish_reason == "error":
            self.io.info(f"error: {result.error}")
            return result
        self.conversation.add("assistant", result.text)
        self._remember(prompt, result)
        if result.finish_reason == "cancelled":
            self.io.notice("reply cancelled; what it got to stays in the conversation")
        if self.verbose:
            for line in stats_lines(result, total_s, self._load_s):
                self.io.info(line)
        self._load_s = 0.0
        return result

    def request_params(self) -> SamplingParams:
        """The session's sampling settings plus the stop strings the template needs.
        (The engine adds those itself only for message prompts; chat submits tokens.)"""
        extra = [s for s in self.template.stop if s not in self.params.stop]
        params = self.params.replace(n=1) if self.params.n != 1 else self.params  # one reply per turn, whatever [sampling] n says
        return params.replace(stop=[*params.stop, *extra]) if extra else params

    # -- conversation changes -----------------------------------------------------------------

    def replace_conversation(self, conversation: Conversation, stored: Stored | None = None) -> None:
        """Start from a loaded transcript (a new saved conversation) or a `stored` one (which
        goes on being saved as itself): evaluate it once now, in the background, so the next
        reply finds it in the prefix cache while the person types."""
        self._wait_for_warmup()
        self.conversation = conversation
        self.builder.forget()
        if self.autosave is not None:
            if stored is not None:
                self.autosave.attach(stored)
            else:
                self.autosave.start_over()
                self.autosave.sync(conversation)
        messages = conversation.full()
        if not messages:
            return
        text = self.template.render(messages, add_generation_prompt=False)
        tokens = self.engine.tokenize(text, special=True)
        if 1 < len(tokens) <= self.builder.budget(self.params.max_tokens):
            self._warmup = self.engine.submit(tokens, SamplingParams(max_tokens=1, temperature=0), stream=False)

    def context_used(self) -> int:
        return self.builder.count(self.conversation)

    # -- internals ---------------------------------------------------------------------------

    def _stream(self, handle: Any) -> int:
        shown = 0
        try:
            for delta in handle:
                if delta.text:
                    shown += len(delta.text)  # counted first: a Ctrl-C inside write() must not repeat it
                    self.io.write(delta.text)
        except KeyboardInterrupt:
            handle.cancel()
        return shown

    @staticmethod
    def _wait(handle: Any) -> Result:
        while True:
            try:
                return handle.result()
            except KeyboardInterrupt:  # a second Ctrl-C: the cancel is already on its way
                handle.cancel()

    def _wait_for_warmup(self) -> None:
        if self._warmup is not None:
            self._wait(self._warmup)
            self._warmup = None

    def _save(self, result: Result | None = None) -> None:
        if self.autosave is not None:
            self.autosave.sync(self.conversation, result)

    def _remember(self, prompt: TurnPrompt, result: Result) -> None:
        # Generated tokens spell the text exactly unless a stop string was cut off it.
        tokens = result.token_ids if result.stop is None else None
        self.builder.remember(prompt, result.text, tokens)

    def _account(self, result: Result) -> None:
        t = self.totals
        if result.finish_reason == "error":
            t.failed += 1
            return
        t.replies += 1
        t.cancelled += result.finish_reason == "cancelled"
        t.prompt_tokens += result.usage.prompt_tokens
        t.cached_tokens += result.usage.cached_tokens
        t.completion_tokens += result.usage.completion_tokens


def _count(n: int, noun: str) -> str:
    return f"{noun}" if n == 1 else f"{n} {noun}s"
