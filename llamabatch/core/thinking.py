"""Thinking models: an answer that starts with a reasoning block (`<think>` ... `</think>`), split
from the answer as it is generated, and bounded by a token budget.

A chat template (or the model's vocabulary) that names one of THINKING_MARKERS marks a block of
reasoning. The block is open when the answer starts if the rendered prompt ends inside it (a
template that writes `<think>\\n` in its generation prompt, as DeepSeek-R1 distills' do); else the
model may open it itself as the first thing it writes. ReasoningSplit reads the answer's text
piece by piece into its reasoning and its content (the answer after the block, leading
whitespace dropped), counts the tokens generated inside the block, and says when the budget has
run out: the engine then writes CLOSE_TEXT itself (core/scheduling/output_step.py) and the answer follows.

Pure state: no model, no threads, tested on plain strings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# (opener, closer) pairs, the first whose opener a template's text or the vocabulary has wins.
THINKING_MARKERS = (("<think>", "</think>"), ("<seed:think>", "</seed:think>"),
                    ("<|START_THINKING|>", "<|END_THINKING|>"))
# Template variables that turn thinking off in the templates that offer it (Qwen3, SmolLM3, ours).
THINKING_OFF = {"enable_thinking": False}


def markers_in(text: str | None) -> tuple[str, str] | None:
    """The (opener, closer) a template's text names, or None."""
    for opener, closer in THINKING_MARKERS:
        if text and opener in text and closer in text:
            return opener, closer
    return None


def ends_inside(prompt_text: str, markers: tuple[str, str]) -> bool:
    """Whether the prompt leaves a block open: its last opener has no closer after it."""
    opened = prompt_text.rfind(markers[0])
    return opened >= 0 and prompt_text.rfind(markers[1]) < opened


def close_text(markers: tuple[str, str]) -> str:
    """What the engine writes to end a block (a budget run out, or budget 0 on a prompt that opened one)."""
    return f"\n{markers[1]}\n\n"


@dataclass(frozen=True)
class Thinking:
    """How one request's answer may reason: the markers, whether the prompt opened the block,
    the budget (None: unbounded) and the tokens of close_text."""

    opener: str
    closer: str
    inside: bool
    budget: int | None
    close_tokens: tuple[int, ...]


_START, _INSIDE, _AFTER, _CONTENT = range(4)


@dataclass(eq=False)
class ReasoningSplit:
    """One answer's text, read into reasoning and content (see the module's docstring)."""

    thinking: Thinking
    state: int = _START
    held: str = ""  # text not given out yet: a possible marker, or whitespace at an edge
    tokens: int = 0  # tokens generated inside the block (the engine's closing ones not counted)
    closing: bool = False  # the engine has written close_text (the budget ran out)
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    opened: bool = False  # a block was opened (by the prompt or the model)

    def __post_init__(self) -> None:
        if self.thinking.inside:
            self.state, self.opened = _INSIDE, True

    @property
    def in_block(self) -> bool:
        return self.state == _INSIDE

    def count(self) -> None:
        """A generated token joins the answer: counted while the block is open."""
        if self.state == _INSIDE and not self.closing:
            self.tokens += 1

    def guess_room(self) -> int | None:
        """How many guessed tokens (speculative decoding) may join the answer now without crossing
        the budget: none while the model may still open the block, None where no budget bounds it."""
        budget = self.thinking.budget
        if budget is None or self.closing or self.state in (_AFTER, _CONTENT):
            return None
        return 0 if self.state == _START else max(0, budget - self.tokens - 1)

    def must_close(self) -> bool:
        """Whether the budget has run out inside the block (the engine writes the closer once)."""
        budget = self.thinking.budget
        return self.state == _INSIDE and not self.closing and budget is not None and self.tokens >= budget

    def feed(self, text: str) -> tuple[str, str]:
        """(content, reasoning) of the next piece of the answer's text."""
        out_content, out_reasoning = [], []
        buf = self.held + text
        self.held = ""
        while buf:
            if self.state == _START:
                rest = buf.lstrip()
                if not rest or (self.thinking.opener.startswith(rest) and rest != self.thinking.opener):
                    self.held = buf  # whitespace, or maybe the opener: not known yet
                    break
                if rest.startswith(self.thinking.opener):
                    self.state, self.opened, buf = _INSIDE, True, rest[len(self.thinking.opener):]
                    continue
                self.state = _CONTENT
            elif self.state == _INSIDE:
                if not self.reasoning and not out_reasoning:
                    buf = buf.lstrip()  # the block's leading whitespace
                    if not buf:
                        break
                end = buf.find(self.thinking.closer)
                if end >= 0:
                    out_reasoning.append(buf[:end].rstrip())
                    buf, self.state = buf[end + len(self.thinking.closer):], _AFTER
                    continue
                keep = _held_tail(buf, self.thinking.closer)
                out_reasoning.append(buf[:len(buf) - keep])
                self.held = buf[len(buf) - keep:]
                break
            elif self.state == _AFTER:
                buf = buf.lstrip()  # the answer's leading whitespace
                if buf:
                    self.state = _CONTENT
                continue
            else:
                out_content.append(buf)
                break
        return self._given("".join(out_content), "".join(out_reasoning))

    def finish(self) -> tuple[str, str]:
        """What is still held at the end of the answer: an unclosed block's text is reasoning,
        except the start of the closer the engine was writing when max_tokens cut it."""
        held, self.held = self.held, ""
        if self.state == _INSIDE:
            return self._given("", "" if self.closing else held)
        if self.state == _START:
            return self._given(held, "")
        return "", ""

    def _given(self, content: str, reasoning: str) -> tuple[str, str]:
        if content:
            self.content.append(content)
        if reasoning:
            self.reasoning.append(reasoning)
        return content, reasoning

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def content_text(self) -> str:
        return "".join(self.content)


def _held_tail(text: str, closer: str) -> int:
    """How many characters at the end of `text` wait: a possible start of the closer, and the
    whitespace before it (dropped if the closer follows)."""
    n = 0
    for size in range(min(len(closer) - 1, len(text)), 0, -1):
        if closer.startswith(text[-size:]):
            n = size
            break
    return n + len(text[:len(text) - n]) - len(text[:len(text) - n].rstrip())
