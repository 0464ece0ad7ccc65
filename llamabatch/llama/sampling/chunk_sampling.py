"""Sampling a tick's logits rows in the llama context: a chunk's row with its chain (and its
n-request siblings' chains), or a verified chunk's rows in order, keeping the guesses the chain
samples too (speculative decoding). Logprobs come from the row, or from a copy taken before a
grammar's mask clears it."""
from __future__ import annotations

from typing import Any

import numpy as np
from llama_cpp import llama_cpp as C

from ...core.plan import StepResult
from .logprobs import LogprobReporter
from .mask_grammar import GrammarStopped
from .samplers import sample_row


class ChunkSampler:
    def __init__(self, ctx: Any, n_vocab: int, logprobs: LogprobReporter, deterministic: bool):
        self.ctx, self.n_vocab, self.logprobs, self.deterministic = ctx, n_vocab, logprobs, deterministic

    def sample(self, chunk: Any, row: int, result: StepResult) -> None:
        # the chunk's own sampler, then those of an n-request's other samples, which take
        # their first token from the same row, each with its own chain and seed. A grammar's
        # mask clears the row in place (mask_grammar.py; the samples of one request share the
        # grammar, so its first mask is theirs too): logprobs are the model's own, so with
        # logprobs wanted they come from a copy taken first. Forced tokens are evaluated without
        # being sampled, so they have no logprobs: then, and in deterministic mode (whose ticks
        # are shaped for one decode token a slot), none are forced.
        targets = ((chunk.slot, chunk.sampler), *chunk.siblings)
        masked = any(sampler.matcher is not None for _, sampler in targets)
        raw = self.row_copy(row) if masked and chunk.logprobs is not None else None
        force = chunk.logprobs is None and not self.deterministic
        for slot, sampler in targets:
            try:
                tok = sample_row(sampler, self.ctx, row, chunk.suppress_eog, self.n_vocab, force=force)
            except GrammarStopped as exc:  # that request's grammar, not the tick: it alone ends
                result.failed[slot] = (str(exc), exc.code)
                continue
            result.sampled[slot] = tok
            if sampler.forced:
                result.forced[slot] = sampler.forced
            if chunk.logprobs is not None:
                result.logprobs[slot] = (self.logprobs.from_row(self.ctx, row, tok, chunk.logprobs) if raw is None else
                                         self.logprobs.from_logits(raw, tok, chunk.logprobs, np.empty_like(raw), None))

    def verify(self, chunk: Any, last_row: int, result: StepResult) -> None:
        """Sample a verified chunk's rows in order (plan.Chunk.n_draft): each row is sampled
        with the request's chain exactly as in a tick of its own, and its guess is kept when
        the sampled token is the guess; the first other token ends the chunk's output.

        This keeps every answer: a greedy chain's pick is a point mass; a chain that draws at
        random draws once per emitted token from its own generator, as without guesses, so
        the tokens are the ones `--speculative off` draws from the same logits, and a guess
        x is kept with probability p(x) (p: the whole chain, bias, penalties, top-k/p,
        min-p, temperature, a grammar's mask); when it is not, the token is distributed as
        p with x removed, renormalized: the accept rule of speculative sampling with a
        point-mass draft (Leviathan et al. 2023), in the coupling that changes no draw."""
        guesses = chunk.tokens[len(chunk.tokens) - chunk.n_draft:]
        sampler = chunk.sampler
        raw_needed = sampler.matcher is not None and chunk.logprobs is not None
        records = []
        for i in range(chunk.n_draft + 1):
            row = last_row - chunk.n_draft + i
            raw = self.row_copy(row) if raw_needed else None
            last = i == chunk.n_draft
            try:
                tok = sample_row(sampler, self.ctx, row, False, self.n_vocab,
                                 force=last and chunk.logprobs is None and not self.deterministic)
            except GrammarStopped as exc:  # that request's grammar, not the tick: it alone ends
                result.failed[chunk.slot] = (str(exc), exc.code)
                return
            record = None
            if chunk.logprobs is not None:
                record = (self.logprobs.from_row(self.ctx, row, tok, chunk.logprobs) if raw is None else
                          self.logprobs.from_logits(raw, tok, chunk.logprobs, np.empty_like(raw), None))
            if i < chunk.n_draft and tok == guesses[i]:
                records.append(record)
                continue
            break
        result.sampled[chunk.slot] = tok
        result.accepted[chunk.slot] = len(records)
        if chunk.logprobs is not None:
            result.logprobs[chunk.slot] = record
            result.accepted_logprobs[chunk.slot] = records
        if sampler.forced and i == chunk.n_draft:
            result.forced[chunk.slot] = sampler.forced

    def row_copy(self, row: int) -> "np.ndarray":
        return np.ctypeslib.as_array(C.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,)).copy()
