"""Sampling with guesses keeps the request's distribution (llama/speculative_rule.py): on the
FakeRunner with a known distribution per row, 10,000 tokens of a sampled answer whose
prediction keeps guessing one token are distributed as that distribution (chi-square), for a
likely guess, an unlikely one and one the distribution never gives; and the rule itself on
its own, over 10,000 draws."""
from __future__ import annotations

import numpy as np
import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.speculation import TickCost
from llamabatch.llama.speculative_rule import keep_or_resample

from fake_runner import FakeRunner

P = {ord("a"): 0.5, ord("b"): 0.3, ord("c"): 0.15, ord("d"): 0.05}
DRAWS = 10_000
# chi-square critical values at p = 0.001 (a correct sampler fails one seed in a thousand; the
# seeds here are fixed, so the test is repeatable)
CRITICAL_3_DF = 16.27
CRITICAL_4_DF = 18.47


class FixedCost(TickCost):
    """A tick cost that the fake's ticks do not refit."""

    def observe(self, runs: int, rows: int, logit_rows: int, ms: float) -> None:
        pass


def chi_square(tokens: list[int], dist: dict[int, float]) -> float:
    counts = {t: 0 for t in dist}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    assert set(counts) == set(dist), f"tokens outside the distribution: {set(counts) - set(dist)}"
    n = len(tokens)
    return sum((counts[t] - n * p) ** 2 / (n * p) for t, p in dist.items())


@pytest.mark.parametrize("guess", ["a", "d", "z"])
def test_a_sampled_answer_with_guesses_keeps_its_distribution(guess):
    runner = FakeRunner(n_slots=1, slot_ctx=DRAWS + 64, n_batch=64, can_verify=True, probs=lambda before: P)
    params = SamplingParams(temperature=0.8, max_tokens=DRAWS, seed=1234, prediction=guess * DRAWS)
    with Engine(EngineConfig(n_parallel=1, n_batch=64, chunk_size=32), runner=runner) as engine:
        # rows nearly free: every tick verifies guesses, even ones that are rarely right
        engine.scheduler.speculation.cost = FixedCost(run_ms=100.0, row_ms=0.01, logit_ms=0.01)
        result = engine.generate(["go"], [params])[0]
        stats = engine.stats()
    assert runner.violations == []
    assert result.usage.completion_tokens == DRAWS
    drafted = stats.drafted_tokens
    assert drafted > 500  # guesses were verified, not skipped
    if guess != "z":
        assert result.usage.accepted_prediction_tokens > 0
    assert chi_square(result.token_ids, P) < CRITICAL_3_DF


def test_the_accept_rule_draws_from_p_over_10000_rows():
    rng = np.random.default_rng(7)
    ids = np.array([10, 11, 12, 13, 14])
    probs = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    for guess in (10, 14, 99):
        tokens = [keep_or_resample(ids, probs, guess, rng) for _ in range(DRAWS)]
        assert chi_square(tokens, dict(zip(ids.tolist(), probs.tolist()))) < CRITICAL_4_DF
    # a guess that is certain is always kept
    assert keep_or_resample(np.array([3]), np.array([1.0]), 3, rng) == 3
