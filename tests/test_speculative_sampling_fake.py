"""Sampling with guesses keeps the request's distribution (llama/sampling/chunk_sampling.py ChunkSampler.verify: each row one
draw of the request's own generator, a guess kept when the draw is the guess): on the
FakeRunner with a known distribution per row, 10,000 tokens of a sampled answer whose
prediction keeps guessing one token are distributed as that distribution (chi-square), for a
likely guess, an unlikely one and one the distribution never gives; and they are the very
tokens the same seed gives without guesses."""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.speculation import TickCost

from fake_runner import FakeRunner
from fixed_cost import FixedCost

P = {ord("a"): 0.5, ord("b"): 0.3, ord("c"): 0.15, ord("d"): 0.05}
DRAWS = 10_000
# chi-square critical values at p = 0.001 (a correct sampler fails one seed in a thousand; the
# seeds here are fixed, so the test is repeatable)
CRITICAL_3_DF = 16.27
CRITICAL_4_DF = 18.47


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


def sampled(prediction: str | None, cost: TickCost | None = None):
    """The answer and the ticks' (guessed, kept) counts."""
    runner = FakeRunner(n_slots=1, slot_ctx=DRAWS + 64, n_batch=64, can_verify=True, probs=lambda before: P)
    params = SamplingParams(temperature=0.8, max_tokens=DRAWS, seed=99, prediction=prediction)
    ticks: list[tuple[int, int]] = []
    with Engine(EngineConfig(n_parallel=1, n_batch=64, chunk_size=32,
                             speculative="auto" if prediction else "off"), runner=runner) as engine:
        if cost is not None:
            engine.scheduler.speculation.cost = cost
        engine.telemetry.subscribe(lambda r: ticks.append((r.drafted_tokens, r.accepted_tokens))
                                   if hasattr(r, "drafted_tokens") else None)
        return engine.generate(["go"], [params])[0], ticks


def test_a_seeded_answer_is_the_same_tokens_with_guesses_and_keeps_a_guess_at_its_probability():
    plain, _ = sampled(None)
    guessed, ticks = sampled("b" * DRAWS, FixedCost(run_ms=100.0, row_ms=0.01, logit_ms=0.01))
    assert guessed.token_ids == plain.token_ids  # one draw per emitted token, guess or not
    # a tick's guesses are decided in order until one is turned down, each kept with the
    # probability of the token guessed: 'b' from the prediction (0.3), or where the drafter
    # looks the answer's last tokens up in the answer itself, any of P's tokens (0.05-0.5)
    kept = sum(a for _, a in ticks)
    decided = sum(a + (a < d) for d, a in ticks if d)
    assert decided > 2000
    assert 0.25 < kept / decided < 0.45, kept / decided
