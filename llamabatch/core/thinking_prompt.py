"""Which requests think, decided at submit time from the prompt (core/thinking.py says how an
answer's reasoning is then split and bounded).

A request thinks where its chat template (or the vocabulary: `<think>` one token) marks a
reasoning block and either the rendered prompt ends inside one (the template opened it, so the
answer starts inside it) or, for chat messages, the model may open one as it starts. Token-id
prompts (the `chat` command renders its own) think only where they end inside a block of
THINKING_MARKERS. A reasoning_budget of 0 on a prompt that opened a block closes it at once, in
the prompt: no reasoning token is generated. A constraint (json_schema, a tool grammar, a GBNF
grammar) then applies from the end of the block (constraints/thinking_grammar.py).
"""
from __future__ import annotations

from typing import Any

from ..constraints.thinking_grammar import thinking_grammar
from ..params import SamplingParams
from .thinking import THINKING_MARKERS, Thinking, close_text, ends_inside

_TAIL_TOKENS = 32  # of a prompt's tokens, read back as text to find an open or empty block


class ThinkingPrompts:
    """The thinking decisions of one InputPreparer (its runner and chat template)."""

    def __init__(self, inputs: Any):
        self.inputs = inputs
        self._close_tokens: dict[tuple[str, bool], tuple[int, ...]] = {}
        self._in_vocab: bool | None = None  # whether `<think>` is one token: asked once

    def markers(self, chat: bool, tail: str) -> tuple[str, str] | None:
        """The markers of the engine's template (or of the vocabulary) for chat messages; for a
        token-id prompt, the pair whose block its tail leaves open (no template is chosen for it)."""
        if not chat:
            return next((pair for pair in THINKING_MARKERS if ends_inside(tail, pair)), None)
        inputs = self.inputs
        found = getattr(inputs.chat_template, "thinking", None)
        if found is not None:
            return found
        opener, closer = THINKING_MARKERS[0]
        if self._in_vocab is None:
            self._in_vocab = inputs._is_one_token(opener)
        return (opener, closer) if self._in_vocab else None

    def decide(self, prompt: Any, chat: bool, tokens: list[int],
               params: SamplingParams) -> tuple[Thinking | None, list[int]]:
        """(how the answer thinks or None, the prompt's tokens: with the block closed for budget 0).
        `chat`: the prompt is chat messages (else text or token ids)."""
        if not chat and not (isinstance(prompt, (list, tuple)) and prompt):
            return None, tokens
        text = self._text(tokens[-_TAIL_TOKENS:])
        markers = self.markers(chat, text)
        if markers is None:
            return None, tokens
        inside = ends_inside(text, markers)
        if not chat and not inside:
            return None, tokens
        budget = params.reasoning_budget
        # under a mask the closer is text (llguidance lets a vocabulary's special tokens match only
        # as themselves, as for tool_grammar's openers): written as text tokens, the mask takes it
        spelled = self.close_tokens(markers, special=params.json_schema is None and not params.grammar)
        closed = text.rstrip().endswith(markers[1])  # the template wrote an empty block (enable_thinking false)
        if inside and budget == 0:
            tokens, inside = tokens + list(self.close_tokens(markers)), False
        if not inside and (closed or budget == 0):
            budget = 0  # no reasoning: a block the model opens anyway is closed at once
        return Thinking(markers[0], markers[1], inside, budget, spelled), tokens

    def close_tokens(self, markers: tuple[str, str], special: bool = True) -> tuple[int, ...]:
        """close_text's tokens; `special`: a closer that is one token of the vocabulary as that
        token, else spelled in two halves (llama.cpp matches a user-defined token even in text)."""
        key = (close_text(markers), special)
        if key not in self._close_tokens:
            text = key[0]
            cut = text.index(markers[1]) + len(markers[1]) // 2
            parts = (text,) if special else (text[:cut], text[cut:])
            self._close_tokens[key] = tuple(t for part in parts for t in self._tokens(part))
        return self._close_tokens[key]

    def _tokens(self, text: str) -> list[int]:
        runner = self.inputs.runner
        tokens = runner.tokenize(text, special=True, add_special=False)
        bos = runner.tokenize("", special=True, add_special=False)
        return tokens[len(bos):] if bos and tokens[:len(bos)] == bos else tokens

    def _text(self, tokens: list[int]) -> str:
        runner = self.inputs.runner
        return b"".join(runner.token_piece(t) for t in tokens).decode("utf-8", "replace")  # special ones shown


def constrained_after(thinking: Thinking, params: SamplingParams) -> SamplingParams:
    """The params with their constraint moved after the reasoning block; as they are where the
    answer cannot reason (budget 0: the constraint holds from the first token)."""
    if thinking.budget == 0 and not thinking.inside:
        return params
    if params.json_schema is None and not params.grammar:
        return params
    grammar = thinking_grammar(thinking.opener, thinking.closer, thinking.inside, params.json_schema, params.grammar)
    return params.replace(grammar=grammar, json_schema=None)
