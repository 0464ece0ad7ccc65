"""Draft tokens from the text itself, for speculative decoding (docs/speculative.md).

A slot that is generating can put guesses of its next tokens after its decode token in the
same llama_decode; the runner samples every one of those rows and keeps the guesses up to the
first one the request's own sampling would not have produced (plan.Chunk.n_draft). Guesses
come from two places, no draft model:

- the request's `prediction` (OpenAI's Predicted Outputs): the answer is expected to repeat
  it, so the drafter follows it with a pointer, and after the answer departs from it (an
  edited word) finds the place again by the last tokens of the answer, near the pointer;
- otherwise prompt lookup: the latest earlier place in the prompt and the answer so far
  where the answer's last 2-4 tokens occur, and what followed it there (extraction, quoting,
  code edits repeat spans of their input).

How many guesses a slot gets each tick is the scheduler's (speculation.py): from the rows
the tick has to spare and from how many of this slot's guesses were right lately, which
the drafter keeps as an acceptance rate.
"""
from __future__ import annotations

import bisect
from typing import Sequence as Seq

LOOKUP_NGRAMS = (4, 3, 2)  # prompt lookup: the longest suffix of the answer found earlier wins
PREDICTION_NGRAMS = (4, 3, 2, 1)  # finding the place in a prediction again after an edit
RESYNC_BEHIND = 8  # a prediction's place is looked for from this many tokens before the pointer
RESYNC_AHEAD = 64  # ... to this many after it (an edit deletes or inserts a few words, not pages)
RESYNC_NEAR = 4  # one token alone is too common to trust farther from the pointer than this
PRIOR_PREDICTION = 0.8  # acceptance assumed before any verification: a prediction is mostly right
PRIOR_LOOKUP = 0.5
DECAY = 0.5  # weight of the past in the acceptance rate, per verification (0.7 ramped a quote up over ~7 ticks, 0.5 over ~4)


class Drafter:
    """One sequence's source of draft tokens and its recent acceptance rate."""

    def __init__(self, prompt: Seq[int], prediction: Seq[int] | None = None):
        self.prediction = list(prediction) if prediction else None
        self.at = 0  # the prediction's next expected token (index into it)
        self.lost = False  # the answer left the prediction and its place was not found again
        self.context: list[int] = list(prompt)  # prompt + answer so far, for prompt lookup
        self.n_prompt = len(prompt)
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> end index of its latest occurrence
        self._indexed = 0  # context[:_indexed] has every n-gram ending in it indexed
        self._pred_index: dict[tuple[int, ...], list[int]] | None = None
        self.rate = PRIOR_PREDICTION if self.prediction else PRIOR_LOOKUP
        self.drafted = 0
        self.accepted = 0
        self._unverified: int | None = None  # the first guess last offered, unless it was verified

    # -- what the answer did -----------------------------------------------------------

    def extend(self, tokens: Seq[int]) -> None:
        """Answer tokens that joined the output (sampled, accepted drafts or forced). A guess
        offered but not verified (the tick had no rows for it) is checked against the first of
        them: the rate learns from guesses it did not pay for, so it recovers after a bad run."""
        if self._unverified is not None and tokens:
            self._learn(1.0 if tokens[0] == self._unverified else 0.0)
            self._unverified = None
        self.context.extend(tokens)
        if self.prediction is not None:
            for tok in tokens:
                self._follow(tok)

    def observe(self, drafted: int, accepted: int) -> None:
        """A verification's outcome: `accepted` of `drafted` guesses were right (then one was
        wrong, unless all were right). The rate is per guess: rights over tries."""
        self.drafted += drafted
        self.accepted += accepted
        self._unverified = None
        tries = accepted + (1 if accepted < drafted else 0)
        if tries:
            self._learn(accepted / tries)

    def _learn(self, rate: float) -> None:
        self.rate = DECAY * self.rate + (1 - DECAY) * rate

    # -- guesses -----------------------------------------------------------------------

    def propose(self, k: int) -> list[int]:
        """Up to k guesses of the tokens after the answer so far ([] when there is none)."""
        if k <= 0:
            return []
        guess = self.prediction[self.at:self.at + k] if self.prediction is not None and not self.lost else []
        guess = guess or self._lookup(k)
        self._unverified = guess[0] if guess else None  # until observe() says it was verified
        return guess

    def _follow(self, tok: int) -> None:
        pred = self.prediction
        assert pred is not None
        if not self.lost and self.at < len(pred) and pred[self.at] == tok:
            self.at += 1
            return
        self.lost = True
        found = self._resync()
        if found is not None:
            self.at, self.lost = found, False

    def _resync(self) -> int | None:
        """Where in the prediction the answer goes on: after an occurrence of the answer's last
        2-4 tokens near the pointer (the nearest; the longer on a tie), else of its last token
        a few tokens from the pointer; None if neither is there."""
        if self._pred_index is None:
            self._pred_index = _index_all(self.prediction or [], max(PREDICTION_NGRAMS))
        answer = len(self.context) - self.n_prompt
        best: tuple[int, int, int] | None = None  # (distance, -n, place)
        for n in PREDICTION_NGRAMS:
            if n > answer:
                continue
            reach = (RESYNC_BEHIND, RESYNC_AHEAD) if n > 1 else (RESYNC_NEAR, RESYNC_NEAR)
            ends = self._pred_index.get(tuple(self.context[-n:]), ())
            lo = bisect.bisect_left(ends, self.at - reach[0] - 1)
            for end in ends[lo:bisect.bisect_right(ends, self.at + reach[1] - 1, lo=lo)]:
                option = (abs(end + 1 - self.at), -n, end + 1)
                best = option if best is None or option < best else best
        return None if best is None else best[2]

    def _lookup(self, k: int) -> list[int]:
        """Prompt lookup: what followed the latest earlier occurrence of the answer's last
        4, 3 or 2 tokens in the prompt and answer so far."""
        ctx = self.context
        last = len(ctx) - 1
        # index every n-gram that ends before the last token (the suffix itself must not match)
        for end in range(self._indexed, last):
            for n in LOOKUP_NGRAMS:
                if end + 1 >= n:
                    self._latest[tuple(ctx[end + 1 - n:end + 1])] = end
        self._indexed = max(self._indexed, last)
        for n in LOOKUP_NGRAMS:
            if n > len(ctx):
                continue
            end = self._latest.get(tuple(ctx[-n:]))
            if end is not None:
                return ctx[end + 1:end + 1 + k]
        return []


def _index_all(tokens: list[int], top: int) -> dict[tuple[int, ...], list[int]]:
    """n-gram (n = 1..top) -> the end index of each of its occurrences, ascending."""
    index: dict[tuple[int, ...], list[int]] = {}
    for end in range(len(tokens)):
        for n in range(1, top + 1):
            if end + 1 >= n:
                index.setdefault(tuple(tokens[end + 1 - n:end + 1]), []).append(end)
    return index
