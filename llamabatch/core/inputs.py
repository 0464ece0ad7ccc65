"""Input preparation: a prompt and its params become a Sequence ready to queue.

Text is tokenized, chat messages are rendered with the chat template and tokenized with
special tokens, token ids are checked against the vocabulary; the params are validated,
the seed chosen and the runner's sampler chain built. All of it runs on the caller's
thread at submit time and raises LlamaBatchError for bad input, so it is tested without
an engine thread.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, Sequence as Seq, Union

from ..constraints.tool_grammar import ToolGrammar
from ..errors import ContextOverflow, InvalidRequest
from ..files.json_line import find_surrogate, surrogate_at
from ..params import SamplingParams, random_seed, template_variables
from .byte_bound import too_long
from .overflow_words import bytes_overflow, prompt_overflow, trained_context
from .plan import Runner
from .sequence import Sequence
from .thinking_prompt import ThinkingPrompts, constrained_after

Prompt = Union[str, Seq[int], Seq[dict]]


def is_chat(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


class ChatTemplates(Protocol):
    """Where an engine's chat template comes from and how chat messages are checked
    (in_process/engine_parts.py, over models/chat_template.py); core only renders with them."""

    def choose(self, runner: Runner, choice: str | None, has_token: Callable[[str], bool]) -> Any:
        """The template for this runner's model: `choice` (a built-in name or a Jinja file),
        else the GGUF's own, else a fallback whose `fallback_reason` says why."""

    def validate(self, messages: Seq[dict]) -> list[dict]:
        """The messages, checked (InvalidRequest for a bad one)."""


class InputPreparer:
    """Turns (prompt, params) into a Sequence for one runner.

    `default_params` fill in for a request that gives none; `default_seed` (EngineConfig.seed)
    for params without a seed, else a random one; `chat_template` is the engine's choice
    (a built-in name or a Jinja file; None = the GGUF's own or a fallback), `chat_templates`
    where templates come from (None: chat messages are refused, one request at a time).
    """

    def __init__(self, runner: Runner, slot_ctx: int, default_params: SamplingParams, *,
                 default_seed: int | None = None, chat_template: str | None = None,
                 on_notice: Callable[[str], None] | None = None, chat_templates: ChatTemplates | None = None):
        self.runner = runner
        self.chat_templates = chat_templates
        self.slot_ctx = slot_ctx
        self.default_params = default_params  # checked once, by the engine that makes this one
        self.default_seed = default_seed
        self.on_notice = on_notice or (lambda _line: None)
        self._template_choice = chat_template
        self._template = None
        self._template_lock = threading.Lock()
        self.thinking = ThinkingPrompts(self)

    @property
    def chat_template(self):
        """The template chat messages are rendered with: the GGUF's own, or a built-in.

        Chosen on first use; a fallback (no usable GGUF template) is said once through
        `on_notice`.
        """
        with self._template_lock:
            if self._template is None:
                self._template = self._choose_template()
                if self._template.fallback_reason:
                    self.on_notice(self._template.fallback_reason)
        return self._template

    def _choose_template(self):
        return self._templates().choose(self.runner, self._template_choice, self._is_one_token)

    def _templates(self) -> ChatTemplates:
        if self.chat_templates is None:
            raise InvalidRequest("chat messages need a chat template, and this engine has none: "
                                 "build it with llamabatch.engines (or llamabatch.Engine)")
        return self.chat_templates

    def _is_one_token(self, text: str) -> bool:
        """Whether `text` is one (special) token of the vocabulary, as chat markers are."""
        try:
            with_bos = len(self.runner.tokenize(text, special=True))
            return with_bos == 1 + len(self.runner.tokenize("", special=True))
        except Exception:  # a fake or odd tokenizer: treat the marker as absent
            return False

    def render_chat(self, messages: Seq[dict], params: SamplingParams | None = None) -> str:
        checked = self._templates().validate(messages)
        variables = template_variables(params) if params is not None else None
        return self.chat_template.render(checked, add_generation_prompt=True, variables=variables or None)

    def prompt_tokens(self, prompt: Prompt, params: SamplingParams | None = None) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("prompt is empty")
            bad = surrogate_at(prompt)
            if bad:  # it can't be encoded as UTF-8 for the tokenizer
                raise InvalidRequest(f"prompt {bad}")
            self._refuse_untokenizably_long(prompt)
            tokens = self.runner.tokenize(prompt, special=False)
        elif is_chat(prompt):
            bad = find_surrogate(list(prompt), "messages")
            if bad:
                raise InvalidRequest(bad)
            text = self.render_chat(prompt, params)
            self._refuse_untokenizably_long(text)
            tokens = self.runner.tokenize(text, special=True)
        elif isinstance(prompt, (list, tuple)):
            if not prompt:
                raise InvalidRequest("prompt is empty")
            n_vocab = self.runner.n_vocab
            for t in prompt:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= n_vocab:
                    raise InvalidRequest(f"prompt token {t!r} is not a token id of this model")
            tokens = list(prompt)
        else:
            raise InvalidRequest(f"prompt must be text, token ids or chat messages, got {type(prompt).__name__}")
        if len(tokens) >= self.slot_ctx:  # the same words as the dry run's (overflow_words.py)
            raise ContextOverflow(prompt_overflow(len(tokens), self.slot_ctx, trained=self.trained_context(),
                                                  pool=self.runner.capabilities.pool_cells is not None))
        return tokens

    def trained_context(self) -> int | None:
        """The model's trained context, from the runner's metadata (None: it does not say)."""
        return trained_context(self.runner.metadata)

    def _refuse_untokenizably_long(self, text: str) -> None:
        """ContextOverflow for a text with more bytes than a full slot of the vocabulary's
        longest tokens could spell: it fails fast, without tokenizing megabytes on the
        submitting thread (core/byte_bound.py)."""
        size = too_long(self.runner, text, self.slot_ctx)
        if size is not None:
            raise ContextOverflow(bytes_overflow(size, self.slot_ctx, self.runner.longest_token_bytes(),
                                                 trained=self.trained_context()))

    def prediction_tokens(self, prediction: str | None, n_prompt: int) -> list[int] | None:
        """The tokens of a request's `prediction` (without the BOS the tokenizer puts first),
        or None. A prediction longer than the room the prompt leaves in the slot is refused:
        the answer could never repeat it (docs/speculative.md)."""
        if not prediction:
            return None
        if too_long(self.runner, prediction, self.slot_ctx) is not None:
            raise ContextOverflow(f"prediction is longer than a slot's {self.slot_ctx} tokens can hold")
        tokens = self.runner.tokenize(prediction, special=False)
        bos = self.runner.tokenize("", special=False)
        if bos and tokens[:len(bos)] == bos:
            tokens = tokens[len(bos):]
        room = self.slot_ctx - n_prompt
        if len(tokens) > room:
            raise ContextOverflow(f"prediction has {len(tokens)} tokens but the slot has room for {room} "
                                  f"after the prompt's {n_prompt} ({self.slot_ctx} a slot)")
        return tokens or None

    def params_for(self, prompt: Prompt, params: SamplingParams | None) -> SamplingParams:
        params = self.default_params if params is None else params.validate()  # the defaults were checked once
        if is_chat(prompt) and self.chat_template.stop:
            # formats without special tokens (the plain transcript) need their own stops
            params = params.replace(stop=[*params.stop, *(s for s in self.chat_template.stop if s not in params.stop)])
        if isinstance(params.grammar, ToolGrammar) and is_chat(prompt):  # calls in the syntax the template teaches
            params = params.replace(grammar=params.grammar.for_syntax(self.chat_template.tool_syntax))
        return params

    def seed_for(self, params: SamplingParams) -> int:
        if params.seed is not None:
            return params.seed
        return self.default_seed if self.default_seed is not None else random_seed()

    def prepare(self, request_id: int, prompt: Prompt, params: SamplingParams | None) -> Sequence:
        """The Sequence for this request, its sampler built last (nothing to free on failure).
        Raises LlamaBatchError (InvalidRequest, ContextOverflow) for bad input."""
        params = self.params_for(prompt, params)
        tokens = self.prompt_tokens(prompt, params)
        thinking, tokens = self.thinking.decide(prompt, is_chat(prompt), tokens, params)
        if thinking is not None:
            params = constrained_after(thinking, params)
        seed = self.seed_for(params)
        if params.n > self.runner.n_slots:
            raise InvalidRequest(f"n={params.n} is more than the {self.runner.n_slots} slots (n_parallel): "
                                 "the samples of one prompt generate side by side, one slot each")
        if params.n == 1:
            prediction = self.prediction_tokens(params.prediction, len(tokens))
            sampler = self.runner.build_sampler(params, seed)
            return Sequence(request_id, tokens, params, seed, sampler,
                            grammar_backend=getattr(sampler, "grammar_backend", None), prediction=prediction,
                            thinking=thinking)
        if not self.runner.capabilities.can_fork:
            # the samples get the prompt by a KV fork (plan.Fork), which needs the full-size SWA
            # cache (kept only while cache_prompt is on) and a model whose memory can be trimmed
            raise InvalidRequest(f"n={params.n} needs a KV fork of the prompt, which this engine cannot do "
                                 "(cache_prompt is off, or the model's memory is recurrent/hybrid)")
        # n samples, seeds seed, seed+1, ...: sample i is what a single request with seed+i gives
        seqs: list[Sequence] = []
        try:
            for i in range(params.n):
                sample_seed = (seed + i) % 2**32
                seqs.append(Sequence(request_id, tokens, params, sample_seed,
                                     self.runner.build_sampler(params, sample_seed), index=i, thinking=thinking))
        except BaseException:
            for s in seqs:
                self.runner.free_sampler(s.sampler)
            raise
        for s in seqs:
            s.group = seqs
            s.grammar_backend = getattr(s.sampler, "grammar_backend", None)
            first = seqs[0].clock  # one timeout for all
            s.clock.submitted_at, s.clock.deadline = first.submitted_at, first.deadline
        return seqs[0]
