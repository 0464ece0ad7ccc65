"""Sampler chains: a request's SamplingParams as a llama.cpp sampler chain, and sampling a
logits row of the context with one."""
from __future__ import annotations

import ctypes
import math
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp as C

from ...errors import InvalidRequest
from ...constraints.gbnf_guard import grammar_problem, size_problem
from ...params import SamplingParams
from ...constraints.schema_prepare import prepared_schema_text
from ...constraints.tool_grammar import LarkGrammar
from ..backend import first_error, log_mark
from .greedy_pick import GreedyPick
from .llama_grammar_limits import llama_grammar_problem
from .mask_grammar import Matcher, MaskGrammars, available as mask_library_available
from .schema_expansion import schema_expansion_problem
from .stderr_capture import grammar_complaint, stderr_captured
from ..vocab import Vocabulary

# The bias a -inf logit_bias becomes under a grammar: far below any real logit (they span tens),
# finite, and small enough that dividing by a tiny temperature stays finite in float32 for long.
GRAMMAR_BAN = -1e4


class Sampler:
    """A request's sampler chain (and, for min_tokens, a twin that cannot pick end-of-generation);
    for a chain that is only a logit bias and greedy, the same pick done on the row in place."""

    def __init__(self, chain: Any, no_eog_chain: Any, seed: int, greedy: GreedyPick | None = None,
                 no_eog_greedy: GreedyPick | None = None, matcher: Matcher | None = None,
                 grammar_backend: str | None = None):
        self.chain = chain
        self.no_eog_chain = no_eog_chain
        self.seed = seed
        self.greedy = greedy
        self.no_eog_greedy = no_eog_greedy
        self.matcher = matcher  # the grammar as a token mask (mask_grammar.py), or None
        self.grammar_backend = grammar_backend  # "llguidance" or "llama" for a constrained request
        self.forced: list[int] = []  # tokens the grammar forced after the last sampled one


class SamplerFactory:
    """Builds and frees chains for one model's vocabulary and slot size (penalty windows
    longer than a slot are clamped to it)."""

    def __init__(self, vocab: Vocabulary, slot_ctx: int, grammar_backend: str = "auto"):
        self.vocab = vocab
        self.n_vocab = vocab.n_tokens
        self.slot_ctx = slot_ctx
        self.grammar_backend = grammar_backend
        if grammar_backend != "llama" and not mask_library_available():
            if grammar_backend == "llguidance":
                raise InvalidRequest("grammar_backend llguidance needs the llguidance package: pip install llguidance")
            self.grammar_backend = "llama"
        self.masks = MaskGrammars(vocab, self.grammar_backend) if self.grammar_backend != "llama" else None

    def build(self, params: SamplingParams, seed: int) -> Sampler:
        # A grammar decides where output ends: once it is complete it allows only EOG, and
        # banning EOG there (ignore_eos, min_tokens) leaves no valid token at all, which makes
        # llama.cpp's grammar throw and abort the whole process. So constrained requests
        # never ban EOG; an EOG they sample ends them with "stop".
        constrained = bool(params.grammar) or params.json_schema is not None
        matcher = self.masks.matcher_for(params.grammar, params.json_schema) if self.masks and constrained else None
        if matcher is None and isinstance(params.grammar, LarkGrammar):  # llama.cpp's sampler reads GBNF only
            raise InvalidRequest("tool calls, and a constraint after a reasoning block, are masks of llguidance: use "
                                 "--grammar-backend auto or llguidance (or tool_choice none, reasoning_budget 0)")
        backend = ("llguidance" if matcher else "llama") if constrained else None
        block_eog = params.ignore_eos and not constrained
        twin = params.min_tokens > 0 and not params.ignore_eos and not constrained
        masked = matcher is not None  # the grammar is the mask, not a sampler of the chain
        chain = self._chain(params, seed, block_eog=block_eog, with_grammar=not masked)
        no_eog = self._chain(params, seed, block_eog=True, with_grammar=not masked) if twin else None
        if not _only_bias_and_greedy(params, masked):
            return Sampler(chain, no_eog, seed, matcher=matcher, grammar_backend=backend)
        return Sampler(chain, no_eog, seed, GreedyPick(self._bias(params, block_eog)),
                       GreedyPick(self._bias(params, True)) if twin else None, matcher=matcher, grammar_backend=backend)

    def _bias(self, p: SamplingParams, block_eog: bool) -> dict[int, float]:
        """The chain's logit bias: the request's, softened under a grammar, and EOG banned."""
        bias = dict(p.logit_bias)
        if p.grammar or p.json_schema is not None:
            # Under a grammar, a -inf bias on every token the grammar allows (EOG once it is
            # complete, or the one character it wants) leaves no token at all, and llama.cpp's
            # grammar then throws and aborts the process (found by benchmarks/fuzz_sampling.py).
            # So there a ban is a very strong dislike: picked only when nothing else is allowed.
            bias = {t: max(b, GRAMMAR_BAN) for t, b in bias.items()}
        if block_eog:
            bias.update({t: -math.inf for t in self.vocab.eog_ids})
        return bias

    def _chain(self, p: SamplingParams, seed: int, block_eog: bool, with_grammar: bool = True) -> Any:
        sparams = C.llama_sampler_chain_default_params()
        sparams.no_perf = True
        chain = C.llama_sampler_chain_init(sparams)
        add = lambda s: C.llama_sampler_chain_add(chain, s)  # noqa: E731
        try:
            grammar = p.grammar if with_grammar else None
            if p.json_schema is not None and with_grammar:
                schema = prepared_schema_text(p.json_schema)  # closed to its listed properties, checked
                grammar = _converted(schema)
            if grammar:
                # what would crash llama.cpp's sampler or tie it up: the grammar as converted
                # from a schema is checked here, a request's own GBNF text also at validate()
                what = "json_schema's grammar" if p.json_schema is not None else "grammar"
                problem = llama_grammar_problem(grammar, self.vocab, what) or grammar_problem(grammar, what)
                if problem:
                    raise InvalidRequest(problem)
                mark = log_mark()
                with stderr_captured() as said:  # the parser prints its complaint with fprintf(stderr)
                    g = C.llama_sampler_init_grammar(self.vocab.ptr, grammar.encode(), b"root")
                if not g:
                    raise InvalidRequest(f"grammar does not parse ({grammar_complaint(said) or first_error(mark)})")
                add(g)
            bias = self._bias(p, block_eog)
            if bias:
                bad = [t for t in bias if t >= self.n_vocab]
                if bad:
                    raise InvalidRequest(f"logit_bias token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
                arr = (C.llama_logit_bias * len(bias))(*[C.llama_logit_bias(t, b) for t, b in bias.items()])
                add(C.llama_sampler_init_logit_bias(self.n_vocab, len(bias), arr))
            if p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
                # this llama.cpp takes n_vocab first; -1 means the whole slot (llama.cpp itself
                # would read -1 as 0, i.e. penalties off). A window longer than the slot can't hold
                # more tokens than the slot does, and llama.cpp allocates the whole window up front.
                last_n = self._window(p.penalty_last_n)
                add(C.llama_sampler_init_penalties(self.n_vocab, last_n, p.repeat_penalty, p.frequency_penalty,
                                                   p.presence_penalty))
            if p.dry_multiplier > 0:
                breakers = [b.encode() for b in p.dry_sequence_breakers]
                arr = (ctypes.c_char_p * len(breakers))(*breakers)
                # -1 is "the whole slot" (llama.cpp's own init reads -1 as 0: DRY silently off), and a
                # longer window is clamped to the slot as for the penalties above.
                add(C.llama_sampler_init_dry(self.vocab.ptr, p.dry_multiplier, p.dry_base,
                                             min(p.dry_allowed_length, self.slot_ctx),
                                             self._window(p.dry_penalty_last_n), arr, len(breakers)))
            if p.greedy:
                add(C.llama_sampler_init_greedy())
            elif p.mirostat == 2:
                add(C.llama_sampler_init_temp(p.temperature))
                add(C.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
            else:
                if p.top_n_sigma > 0:
                    add(C.llama_sampler_init_top_n_sigma(p.top_n_sigma))
                if p.top_k > 0:
                    add(C.llama_sampler_init_top_k(min(p.top_k, self.n_vocab)))  # int32 in C
                if p.typical_p < 1.0:
                    add(C.llama_sampler_init_typical(p.typical_p, 1))
                if p.top_p < 1.0:
                    add(C.llama_sampler_init_top_p(p.top_p, 1))
                if p.min_p > 0:
                    add(C.llama_sampler_init_min_p(p.min_p, 1))
                if p.xtc_probability > 0:
                    add(C.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 1, seed))
                add(C.llama_sampler_init_temp(p.temperature))
                add(C.llama_sampler_init_dist(seed))
        except BaseException:
            C.llama_sampler_free(chain)
            raise
        return chain

    def _window(self, last_n: int) -> int:
        """A penalty window in tokens: -1 and anything longer than a slot mean the whole slot."""
        return self.slot_ctx if last_n < 0 else min(last_n, self.slot_ctx)

    @staticmethod
    def free(sampler: Sampler | None) -> None:
        if sampler is None:
            return
        C.llama_sampler_free(sampler.chain)
        if sampler.no_eog_chain:
            C.llama_sampler_free(sampler.no_eog_chain)


def _converted(schema: str) -> str:
    """The GBNF text llama-cpp-python's converter makes of a schema, refused (InvalidRequest)
    where writing it out would cost too much (the text it writes is checked by the caller)."""
    problem = size_problem("json_schema", schema) or schema_expansion_problem(schema)
    if problem:
        raise InvalidRequest(problem)
    try:
        return llama_cpp.llama_grammar.json_schema_to_gbnf(schema)
    except Exception as exc:  # the converter raises many kinds for bad schemas
        raise InvalidRequest(f"json_schema cannot be turned into a grammar: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def _only_bias_and_greedy(p: SamplingParams, masked: bool = False) -> bool:
    """Whether the chain _chain builds for `p` is a logit bias (maybe none) and greedy (a
    grammar applied as a mask before it is not part of the chain)."""
    return (p.greedy and (masked or (not p.grammar and p.json_schema is None)) and p.repeat_penalty == 1.0
            and not p.presence_penalty and not p.frequency_penalty and not p.dry_multiplier > 0)


def sample_row(sampler: Sampler, ctx: Any, row: int, suppress_eog: bool, n_vocab: int, force: bool = False) -> int:
    """Sample the context's logits row `row` with the request's chain (or its greedy pick),
    after its grammar's mask, if it has one, has cleared the forbidden tokens in place. With
    `force`, the tokens the grammar then allows as the only continuation are consumed and
    left in `sampler.forced` (the chain is told of them, as of sampled ones)."""
    tok = _sample_row(sampler, ctx, row, suppress_eog, n_vocab)
    sampler.forced = []
    if sampler.matcher is not None:
        sampler.matcher.accept(tok)
        if force:
            sampler.forced = sampler.matcher.forced(may_end=not suppress_eog)
            for t in sampler.forced:
                C.llama_sampler_accept(sampler.chain, t)
    return tok


def accept_written(sampler: Sampler, tokens: list[int]) -> None:
    """Tokens the engine wrote into the answer unsampled (a thinking budget's closer): the grammar
    mask and the chains take them as sampled ones. llama.cpp's own grammar sampler would abort the
    process on a token it forbids, so a request constrained by it ends instead (InvalidRequest)."""
    if sampler.grammar_backend == "llama":
        raise InvalidRequest("the reasoning budget ran out, but the request's grammar (llama.cpp's sampler) "
                             "cannot take the end of the reasoning block: use --grammar-backend auto")
    for tok in tokens:
        if sampler.matcher is not None:
            sampler.matcher.accept(tok)
        C.llama_sampler_accept(sampler.chain, tok)
        if sampler.no_eog_chain:
            C.llama_sampler_accept(sampler.no_eog_chain, tok)


def _sample_row(sampler: Sampler, ctx: Any, row: int, suppress_eog: bool, n_vocab: int) -> int:
    twin = suppress_eog and sampler.no_eog_chain
    pick = sampler.no_eog_greedy if twin else sampler.greedy
    if sampler.matcher is not None:  # the logits llama_sampler_sample reads are this very row
        sampler.matcher.mask_row(np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, row), shape=(n_vocab,)))
    if pick is not None:
        tok = pick.pick(np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, row), shape=(n_vocab,)))
        if tok is not None:  # greedy and a bias keep no state: nothing to accept
            return tok
    if twin:
        # min_tokens not reached: the twin that cannot pick EOG samples every token of
        # this phase (so its own history is whole), and the main chain is told each
        # token so its penalties and mirostat state stay in step for later.
        tok = C.llama_sampler_sample(sampler.no_eog_chain, ctx, row)
        C.llama_sampler_accept(sampler.chain, tok)
        return tok
    return C.llama_sampler_sample(sampler.chain, ctx, row)
