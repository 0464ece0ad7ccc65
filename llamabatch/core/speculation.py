"""How many draft tokens each generating slot verifies this tick (docs/speculative.md).

Guesses (core/drafts.py) ride on a tick's one llama_decode as extra rows of their slot's
decode chunk. They only take rows the tick has to spare: the batch policy first gives every
decode slot its token and every prefill chunk its share, and guesses get what is left of
n_batch, never a row that work would have had.

Rows are not free on a CPU: each costs about as much compute as a decode token, and a tick's
graph runs each cost a pass over the weights. So guesses are placed where they pay: a tick
with guesses must make more tokens per millisecond than the same tick without them. Each
slot's guesses are worth what its recent acceptance rate says (the j-th guess joins the
output with probability rate^j), and the tick's cost is estimated by TickCost from its graph
runs, rows and rows with logits, fitted to the engine's own ticks. With a KV stream per slot
llama.cpp evaluates only equal row counts of consecutive slots in one graph run
(kernel_paths/ubatch_split.py), so the choices weighed are both: one common number of guess rows for
every decode slot (a slot with fewer real guesses pads with filler rows, which cost a row but
save a graph run), and each slot its own guesses, no fillers (what the unified cache prefers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence as Seq

import numpy as np

from .plan import Chunk
from .sequence import Sequence

MAX_DRAFT = 16  # guesses one slot verifies in one tick
REQUIRED_GAIN = 1.15  # a tick with guesses must promise this many times the tokens per ms of one without


@dataclass
class Candidate:
    """A decode chunk that may carry guesses: its slot, its rows without guesses, the guesses
    its drafter offers (already cut to what the slot may take) and their acceptance rate."""

    slot: int
    base: int
    guesses: list[int]
    rate: float


class TickCost:
    """A tick's llama_decode and sampling time ≈ run_ms × graph runs + row_ms × rows +
    logit_ms × rows with logits (each such row also runs the output layer and is sampled),
    fitted to recent ticks by least squares with forgetting and a pull towards the prior, so
    the estimate follows this machine and model as the engine runs."""

    PULL = 0.05  # how hard the fit is pulled to the prior (keeps a fit of decode ticks alone sound)

    def __init__(self, run_ms: float = 8.0, row_ms: float = 0.8, logit_ms: float = 0.4, memory: float = 0.98):
        self.memory = memory
        self.prior = np.array([run_ms, row_ms, logit_ms])
        self.coef = self.prior.copy()
        self._xx = np.zeros((3, 3))
        self._xy = np.zeros(3)

    @property
    def coef(self) -> np.ndarray:
        return self._coef

    @coef.setter
    def coef(self, value: np.ndarray) -> None:
        self._coef = value
        # ms() runs for every option `choose` weighs, several per tick: plain floats, not a numpy dot
        self._terms = (float(value[0]), float(value[1]), float(value[2]))

    @property
    def run_ms(self) -> float:
        return self._terms[0]

    def observe(self, runs: int, rows: int, logit_rows: int, ms: float) -> None:
        if runs <= 0 or rows <= 0 or ms <= 0:
            return
        x = np.array([runs, rows, logit_rows], dtype=float)
        self._xx = self.memory * self._xx + np.outer(x, x)
        self._xy = self.memory * self._xy + x * ms
        # ridge towards the prior, in proportion to the data: (X'X + R) c = X'y + R prior
        ridge = self.PULL * np.diag(np.diag(self._xx)) + 1e-3 * np.eye(3)
        try:
            coef = np.linalg.solve(self._xx + ridge, self._xy + ridge @ self.prior)
        except np.linalg.LinAlgError:
            return
        if (coef > 0).all():  # a degenerate fit keeps the last sound estimate
            self.coef = coef

    def ms(self, runs: int, rows: int, logit_rows: int) -> float:
        run_ms, row_ms, logit_ms = self._terms
        return run_ms * runs + row_ms * rows + logit_ms * logit_rows


def expected(rate: float, n: int) -> float:
    """Expected guesses kept of n offered, each right with probability `rate` after the last was."""
    if n <= 0 or rate <= 0:
        return 0.0
    if rate >= 1:
        return float(n)
    return rate * (1 - rate ** n) / (1 - rate)


def choose(cands: Seq[Candidate], others: Seq[tuple[int, int]], spare: int, cost: TickCost,
           runs_of: Callable[[list[tuple[int, int]]], int], free: int = 0,
           prefilling: bool = False) -> dict[int, int]:
    """slot -> rows of guesses (real ones first, then fillers) for this tick: the choice of
    most expected tokens per estimated millisecond, within `spare` rows. `others`: the tick's
    other chunks as (slot, rows); `runs_of(runs)` counts the graph runs of (slot, rows) runs;
    `free`: guess rows a slot has at no cost (deterministic mode pads every decode token
    with a row, which a guess may take), placed wherever there is a guess; `prefilling`:
    the tick carries a prompt chunk, so only the free rows are taken (see below)."""
    if spare <= 0 or not any(c.guesses for c in cands):
        return {}
    base_rows = sum(n for _, n in others) + sum(c.base for c in cands)
    base_logits = len(others) + len(cands)  # about: a decode chunk and a prompt's last chunk have one each
    base_tokens = float(len(cands))

    def runs(lengths: dict[int, int]) -> int:
        return runs_of(sorted([*others, *((c.slot, c.base + lengths.get(c.slot, 0)) for c in cands)]))

    def score(lengths: dict[int, int], n_runs: int) -> float:
        gain = sum(expected(c.rate, min(lengths.get(c.slot, 0), len(c.guesses))) for c in cands)
        guesses = sum(max(0, n - free) for n in lengths.values())
        return (base_tokens + gain) / cost.ms(n_runs, base_rows + guesses, base_logits + guesses)

    best = {c.slot: min(free, len(c.guesses)) for c in cands if free and c.guesses}
    if sum(best.values()) > spare:
        best = {}
    if prefilling:
        # While prompts are being prefilled the ticks happen for their sake whatever the
        # guesses do, so a kept guess saves one decode row later, not a tick, and every guess
        # costs a row now: a loss at any acceptance rate below 1 (mixed prompt lengths at 4
        # slots ran at 0.90-0.95 of --speculative off with guesses beside prompt chunks).
        return {slot: n for slot, n in best.items() if n > 0}
    # guesses must promise a clear gain: the estimate's errors (a fitted cost, a recent rate)
    # would otherwise make break-even ticks that lose as often as they win
    best_score = score(best, runs(best)) * REQUIRED_GAIN
    # every slot the same number of rows (fillers after a slot's real guesses): one graph run
    # with a KV stream per slot, whatever that number, until a slot's chunk outgrows a ubatch
    top = min(max(len(c.guesses) for c in cands), spare // len(cands))
    if top >= 1:
        uniform = [{c.slot: n for c in cands} for n in range(1, top + 1)]
        first, last = runs(uniform[0]), runs(uniform[-1])
        for lengths in uniform:
            n_runs = first if first == last else runs(lengths)
            s = score(lengths, n_runs)
            if s > best_score * 1.0001:
                best, best_score = lengths, s
    # every slot its own guesses, no fillers
    for lengths in _each_own(cands, spare):
        s = score(lengths, runs(lengths))
        if s > best_score * 1.0001:
            best, best_score = lengths, s
    return {slot: n for slot, n in best.items() if n > 0}


def _each_own(cands: Seq[Candidate], spare: int) -> list[dict[int, int]]:
    """Options without fillers: every slot its own guesses, the least likely cut first while
    they exceed `spare`; and cut back together to each shorter length."""
    lengths = {c.slot: len(c.guesses) for c in cands}
    rate = {c.slot: c.rate for c in cands}
    while sum(lengths.values()) > spare:
        # the last guess of the slot whose last guess is least likely to be kept goes first
        slot = min((s for s in lengths if lengths[s] > 0), key=lambda s: rate[s] ** lengths[s])
        lengths[slot] -= 1
    out = [dict(lengths)]
    for cap in sorted({n for n in lengths.values() if n > 0}, reverse=True)[1:]:
        out.append({s: min(n, cap) for s, n in lengths.items()})
    return out


def thinking_room(seq: Sequence) -> int:
    """Guesses a request may take before its thinking budget runs out (where the engine writes
    the block's closer itself, core/thinking.py): none may cross that token."""
    room = seq.answer.reasoning_split.guess_room() if seq.answer.reasoning_split is not None else None
    return (1 << 30) if room is None else room


class Speculation:
    """The scheduler's part of speculative decoding: guesses onto this tick's decode chunks,
    and what a verification gave back."""

    def __init__(self, runs_of: Callable[[list[tuple[int, int]]], int],
                 valid: Callable[[Any, list[int]], int] | None = None, cost: TickCost | None = None,
                 max_draft: int = MAX_DRAFT, free: int = 0, max_rows: int | None = None):
        self.runs_of = runs_of  # graph runs llama_decode makes of (slot, rows) runs (the runner's)
        self.valid = valid  # (sampler, guesses) -> how many its grammar allows (the runner's)
        self.cost = cost or TickCost()
        self.max_draft = max_draft  # guesses one slot verifies in one tick
        self.free = free  # guess rows a slot has at no cost (choose)
        self.max_rows = max_rows  # rows one slot's chunk may take, its own tokens and guesses (None: any)

    @staticmethod
    def drafts_for(seq: Sequence) -> bool:
        """Whether a request drafts at all: unless it said "speculative": false."""
        return seq.params.speculative

    def add_guesses(self, chunks: list[Chunk], seq_of: Callable[[int], Sequence], spare: int,
                    chunk_size: int, slot_ctx: int) -> None:
        """Append guesses to the decode chunks that end a generating slot's pending tokens,
        within `spare` rows (chunks in, chunks changed in place: tokens and n_draft)."""
        cands, others = [], []
        for chunk in chunks:
            seq = seq_of(chunk.slot)
            room = self._room(chunk, seq, chunk_size, slot_ctx)
            if room <= 0:
                others.append((chunk.slot, len(chunk.tokens)))
                continue
            guesses = seq.drafter.propose(room)
            if guesses and self.valid is not None:
                guesses = guesses[:self.valid(seq.sampler, guesses)]  # none the grammar forbids
            cands.append(Candidate(chunk.slot, len(chunk.tokens), guesses, seq.drafter.rate))
        prefilling = any(not c.is_decode for c in chunks)
        lengths = choose(cands, others, spare, self.cost, self.runs_of, self.free, prefilling)
        for chunk in chunks:
            n = lengths.get(chunk.slot, 0)
            if n:
                cand = next(c for c in cands if c.slot == chunk.slot)
                real = cand.guesses[:n]
                # a filler repeats the last token: a row that keeps the graph run whole, rarely right
                chunk.tokens = chunk.tokens + real + [chunk.tokens[-1]] * (n - len(real))
                chunk.n_draft = n

    def _room(self, chunk: Chunk, seq: Sequence, chunk_size: int, slot_ctx: int) -> int:
        """How many guesses this chunk may carry: 0 unless it is a generating slot's decode
        chunk with all its pending tokens, a drafter, its token sampled inline, min_tokens met;
        then no more than its answer, slot and chunk can still take."""
        if (not chunk.is_decode or not chunk.wants_logits or chunk.sample_apart or seq.drafter is None
                or len(seq.answer.output) < seq.params.min_tokens):
            return 0
        rows_left = chunk_size if self.max_rows is None else self.max_rows
        return min(self.max_draft, seq.params.max_tokens - len(seq.answer.output) - 1, slot_ctx - seq.num_tokens - 1,
                   chunk_size - len(chunk.tokens), rows_left - len(chunk.tokens), thinking_room(seq))
