"""The accept rule that keeps speculative decoding from changing what a sampled request gets.

A guess x (one token, a point mass) for a row whose distribution under the request's whole
chain (bias, penalties, top-k/p, min-p, temperature, a grammar's mask) is p: keep x with
probability p(x); otherwise sample from p with x removed, renormalized. The token that comes
out is distributed exactly as p (Leviathan et al. 2023, and Chen et al. 2023, with a draft
distribution that is a point mass): P(x) = p(x); P(y) = (1 - p(x)) * p(y) / (1 - p(x)) = p(y).
So a sampled answer with guesses is distributed as one without; a greedy chain's p is a point
mass on its pick, where the rule is "keep x when it is the pick", which runner.py does by
sampling as usual and comparing.

Pure numpy: the real runner gives it the candidates llama.cpp's chain left, the scripted fake
runner its known distribution (tests/test_speculative_sampling_fake.py checks the output
distribution with a chi-square test).
"""
from __future__ import annotations

import numpy as np


def keep_or_resample(ids: np.ndarray, probs: np.ndarray, guess: int, rng: np.random.Generator) -> int:
    """The token for a row with candidates `ids` of probabilities `probs` (summing to 1) when
    `guess` was drafted for it: the guess with probability p(guess), else a draw from the
    rest, renormalized."""
    hit = np.flatnonzero(ids == guess)
    p_guess = float(probs[hit[0]]) if hit.size else 0.0
    if rng.random() < p_guess:
        return guess
    rest = np.array(probs, dtype=np.float64)
    if hit.size:
        rest[hit[0]] = 0.0
    cumulative = np.cumsum(rest)
    total = cumulative[-1] if cumulative.size else 0.0
    if total <= 0:
        return guess  # p(guess) was 1 (rounding kept the draw from landing under it)
    at = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
    return int(ids[min(at, len(ids) - 1)])


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of candidate logits, as llama.cpp's dist sampler computes them (in float64)."""
    x = np.asarray(logits, dtype=np.float64)
    finite = np.isfinite(x)
    if not finite.any():
        return np.full(len(x), 1.0 / max(len(x), 1))
    x = np.where(finite, x - x[finite].max(), -np.inf)
    e = np.exp(x)
    return e / e.sum()
