"""One chat session: the conversation, the sampling settings, and generating each reply.

Knows nothing about terminals: everything it shows goes through the injected `ChatIO`
callbacks, so the same code serves prompt-toolkit, piped stdin and tests.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from .autosave import Autosave
from .chat_tools import TemplateWithTools, call_notices, tools_grammar
from .conversation import Conversation, PromptBuilder, TurnPrompt
from .store import Stored
from ..params import SamplingParams
from ..results import Result
from .ollama_stats import stats_lines
from .turn_kv import TurnKV, text_digest


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
    restored_tokens: int = 0  # of cached_tokens, from the disk prefix store
    completion_tokens: int = 0


class ChatSession:
    def __init__(self, engine: Any, params: SamplingParams, io: ChatIO, *, system: str | None = None,
                 verbose: bool = False, load_s: float = 0.0, autosave: Autosave | None = None, tools: Any = None):
        self.engine = engine
        self.tools = tools  # chat --tools: a ToolRequest offered with every turn (chat_tools.py)
        self.params = params
        self.io = io
        self.verbose = verbose
        self.conversation = Conversation(system)
        self.builder = PromptBuilder.for_engine(engine)
        if tools is not None:
            self.builder.template = TemplateWithTools(engine.chat_template, tools)
        self.totals = SessionTotals()
        self.last_result: Result | None = None
        self._load_s = load_s  # shown as "load duration" once, with the first reply
        self._warmup: Any = None
        self._warmup_restored = 0  # tokens the resume's warm-up restored from disk: the next reply's cache holds them
        self.autosave = autosave  # None: --no-save
        self.kv = TurnKV.for_engine(engine)  # each turn's prompt KV in the disk prefix store (turn_kv)
        self._turn_kv: dict | None = None  # the last reply's row data for it
        self._entries: list[tuple[list[int], str]] = []  # recent prompts' entries (a /retry's prompt is saved already)

    @property
    def num_ctx(self) -> int:
        """Tokens the conversation may use: the slot, or less after /set parameter num_ctx."""
        return self.builder.slot_ctx

    @num_ctx.setter
    def num_ctx(self, n: int) -> None:
        self.builder.slot_ctx = min(n, self.engine.slot_ctx)

    @property
    def template(self):
        return self.builder.template if self.tools is not None else self.engine.chat_template

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
                           f"to fit the {self.num_ctx:,}-token context")
        params = self.request_params()
        if self._keeps_kv() and self.kv.wanted(prompt.tokens):
            params = params.replace(store_prefix=True)  # saved with the turn: -c restores it
        self._turn_kv = None
        start = time.perf_counter()
        handle = self.engine.submit(prompt.tokens, params)
        shown = self._stream(handle)
        result = self._wait(handle)
        total_s = time.perf_counter() - start
        if len(result.text) > shown:  # what the engine made between Ctrl-C and the cancel
            self.io.write(result.text[shown:])
        if result.text or shown:
            self.io.write("\n\n" if self.io.interactive else "\n")
        self.last_result = result
        restored = self._restored(result)
        self._account(result, restored)
        if result.finish_reason == "error":
            self.io.info(f"error: {result.error}")
            return result
        self.conversation.add("assistant", result.text)
        if self.tools is not None:
            for line in call_notices(result.text, self.engine.chat_template.tool_syntax):
                self.io.notice(line)
        self._remember(prompt, result)
        if params.store_prefix:
            self._turn_kv = self._kv_row(prompt, result)
        if result.finish_reason == "cancelled":
            self.io.notice("reply cancelled; what it got to stays in the conversation")
        if self.verbose:
            for line in stats_lines(result, total_s, self._load_s, restored):
                self.io.info(line)
        self._load_s = 0.0
        return result

    def request_params(self) -> SamplingParams:
        """The session's sampling settings plus the stop strings the template needs.
        (The engine adds those itself only for message prompts; chat submits tokens.)"""
        extra = [s for s in self.template.stop if s not in self.params.stop]
        params = self.params.replace(n=1) if self.params.n != 1 else self.params  # one reply per turn, whatever [sampling] n says
        if self.tools is not None:
            params = params.replace(grammar=tools_grammar(self.tools, self.engine.chat_template.tool_syntax), json_schema=None)
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
        if stored is not None:
            self._resume_kv(conversation, stored)
        tokens = self.builder.resumed_prefix()  # the saved turn's tokens: restored, not evaluated
        if tokens is None:
            text = self.template.render(messages, add_generation_prompt=False)
            tokens = self.engine.tokenize(text, special=True)
        if 1 < len(tokens) <= self.builder.budget(self.params.max_tokens):
            self._warmup = self.engine.submit(tokens, SamplingParams(max_tokens=1, temperature=0), stream=False)

    def context_used(self) -> int:
        return self.builder.count(self.conversation)

    # -- internals ---------------------------------------------------------------------------

    def _stream(self, handle: Any) -> int:
        shown = 0
        thinking = False  # a thinking answer's reasoning is shown between the markers the model wrote
        try:
            for delta in handle:
                if delta.reasoning:
                    self.io.write(("" if thinking else "<think>\n") + delta.reasoning)
                    thinking = True
                if delta.text and thinking:
                    self.io.write("\n</think>\n\n")
                    thinking = False
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
            warmed = self._wait(self._warmup)
            self._warmup = None
            self._warmup_restored = warmed.usage.restored_tokens if warmed.finish_reason != "error" else 0

    def _save(self, result: Result | None = None) -> None:
        if self.autosave is not None:
            gone = self.autosave.sync(self.conversation, result, self._turn_kv if result is not None else None)
            self.kv.remove(gone)  # entries of older turns, and of exchanges /undo dropped

    def _keeps_kv(self) -> bool:
        # only where the conversation row can name the entry: otherwise nothing would resume from it
        return self.kv.enabled and self.autosave is not None and self.autosave.keeps_kv

    def _kv_row(self, prompt: TurnPrompt, result: Result) -> dict | None:
        """The reply row's kv_entry and kv_resume: the entry its prompt was saved as, the
        prompt text's digest, and the reply's tokens when they spell its text."""
        entry = result.stored_prefix
        if entry is None:  # the store holds this very prompt already (/retry): the same entry
            entry = next((name for tokens, name in self._entries if tokens == prompt.tokens), None)
        if entry is None:
            return None
        self._entries = [(t, n) for t, n in self._entries if n != entry][-3:] + [(prompt.tokens, entry)]
        return {"kv_entry": entry, "kv_resume": {"prompt_sha256": text_digest(prompt.text),
                                                 "reply_tokens": _reply_tokens(result)}}

    def _resume_kv(self, conversation: Conversation, stored: Stored) -> None:
        """Go on from the stored conversation's last reply's entry, when it matches the
        conversation as it renders now and the store still holds it (turn_kv)."""
        if not self.kv.enabled or not stored.kv_entries or not stored.kv_entries[-1]:
            return
        resume = stored.kv_resume[-1] if stored.kv_resume else None
        messages = conversation.full()
        if not isinstance(resume, dict) or messages[-1]["role"] != "assistant":
            return
        n = len(messages) - 1
        text = self.template.render(messages[:n], add_generation_prompt=True)
        if resume.get("prompt_sha256") != text_digest(text):
            return  # it renders otherwise (dropped exchanges, another template): evaluated in full
        tokens = self.kv.tokens_of(stored.kv_entries[-1])
        if not tokens:
            return  # evicted, or not this model's: evaluated in full
        reply_tokens = resume.get("reply_tokens")
        if not (isinstance(reply_tokens, list) and all(isinstance(t, int) for t in reply_tokens)):
            reply_tokens = None
        self.builder.resume(TurnPrompt(text, tokens, n), messages[-1]["content"], reply_tokens)
        self._entries = [(tokens, stored.kv_entries[-1])]

    def _remember(self, prompt: TurnPrompt, result: Result) -> None:
        self.builder.remember(prompt, result.text, _reply_tokens(result))

    def _restored(self, result: Result) -> int:
        """Of the reply's cached tokens, those read from the disk prefix store: by its own
        request, or (the first reply after chat -c) by the warm-up that put them in the slot."""
        extra, self._warmup_restored = self._warmup_restored, 0
        return min(result.usage.cached_tokens, result.usage.restored_tokens + extra)

    def _account(self, result: Result, restored: int) -> None:
        t = self.totals
        if result.finish_reason == "error":
            t.failed += 1
            return
        t.replies += 1
        t.cancelled += result.finish_reason == "cancelled"
        t.prompt_tokens += result.usage.prompt_tokens
        t.cached_tokens += result.usage.cached_tokens
        t.restored_tokens += restored
        t.completion_tokens += result.usage.completion_tokens


def _count(n: int, noun: str) -> str:
    return f"{noun}" if n == 1 else f"{n} {noun}s"


def _reply_tokens(result: Result) -> list[int] | None:
    """The reply's generated tokens, when they spell its text exactly (a stop string cut off
    the text is still among them): what the next prompt continues from."""
    return result.token_ids if result.stop is None else None
