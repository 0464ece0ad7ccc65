"""Matcher.mask_row (llama/sampling/mask_grammar.py) on scripted masks: the row keeps exactly the allowed
tokens' logits and every other is -inf, by both of its paths (few words set, or many). No model."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from llamabatch.llama.sampling.mask_grammar import GrammarStopped, Matcher


class ScriptedMask:
    """Stands in for llguidance's LLMatcher: writes a given bitmask."""

    def __init__(self, words: np.ndarray, error: str = ""):
        self.words, self.error = words, error

    def unsafe_compute_mask_ptr(self, pointer: int, size: int) -> None:
        ctypes.memmove(pointer, self.words.ctypes.data, size)

    def is_error(self) -> bool:
        return bool(self.error)

    def get_error(self) -> str:
        return self.error


@pytest.mark.parametrize("n_vocab", [262144, 49152, 1000, 33, 32])
@pytest.mark.parametrize("density", [0.0, 0.0001, 0.01, 0.3, 1.0])
def test_the_row_keeps_exactly_the_allowed_logits(n_vocab, density):
    rng = np.random.default_rng(n_vocab + int(density * 1000))
    allowed = rng.random(((n_vocab + 31) // 32) * 32) < density
    allowed[n_vocab:] = True  # bits past the vocabulary are ignored, set or not
    if not allowed[:n_vocab].any():
        allowed[n_vocab // 2] = True
    words = np.packbits(allowed, bitorder="little").view(np.int32).copy()
    row = rng.standard_normal(n_vocab).astype(np.float32)
    expected = np.where(allowed[:n_vocab], row, -np.inf).astype(np.float32)
    Matcher(ScriptedMask(words), n_vocab).mask_row(row)
    assert np.array_equal(row, expected)


def test_a_matcher_in_its_error_state_stops_the_answer():
    matcher = Matcher(ScriptedMask(np.full(1, -1, dtype=np.int32), error="too many items"), 32)
    with pytest.raises(GrammarStopped, match="the grammar stopped the answer: too many items"):
        matcher.mask_row(np.zeros(32, dtype=np.float32))
