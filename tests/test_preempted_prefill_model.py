"""A request preempted part-way through a long prompt's prefill, on the bundled models (both
families), without the prompt cache: it resumes from its parked KV and answers with the
tokens it gets unpreempted. On Gemma 3 the parked prompt is longer than the 512-token window,
so the window layers' cache must not be one that wraps (the runner keeps it full-size)."""
from __future__ import annotations

import random

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams, TickRecord

pytestmark = pytest.mark.model

GREEDY = SamplingParams(max_tokens=16, temperature=0)
URGENT = SamplingParams(max_tokens=4, temperature=0, priority=-1)
WORDS = ("apple river stone quiet mountain seven green table under bright walk letter window cloud paper "
         "orange distant music garden bridge").split()


def notes() -> str:
    """About 1,500 tokens of loosely repeating words: past Gemma 3's window in 256-token chunks."""
    rng = random.Random(5)
    return "Notes: " + " ".join(rng.choice(WORDS) + ("." if rng.random() < 0.1 else "") for _ in range(1400))


def preempted_after(engine: Engine, prompt: str, chunks: int):
    """`prompt` answered with an urgent request submitted once `chunks` of its prefill ticks ran:
    submitted from the engine's own tick record, so the next admission parks it exactly there."""
    seen, urgent = [], []

    def on_record(record) -> None:
        if isinstance(record, TickRecord) and record.prefill_tokens and not urgent:
            seen.append(record)
            if len(seen) == chunks:
                urgent.append(engine.submit("The capital of France is", URGENT))

    stop = engine.subscribe(on_record)
    try:
        result = engine.submit(prompt, GREEDY).result(timeout=300)
        return result, urgent[0].result(timeout=300)
    finally:
        stop()


def test_a_request_preempted_mid_prefill_past_the_window_answers_as_unpreempted(family):
    config = EngineConfig(model=family.path, n_parallel=1, n_ctx=4096, cache_prompt=False,
                          chunk_size=256, speculative="off")
    with Engine(config) as engine:
        prompt = notes()
        assert len(engine.tokenize(prompt)) > 4 * 256
        plain = engine.generate([prompt], GREEDY)[0]
        resumed, urgent = preempted_after(engine, prompt, chunks=3)  # 768 tokens in: past the window
    assert urgent.finish_reason in ("stop", "length") and urgent.token_ids
    assert resumed.timings.preemptions == 1
    assert resumed.token_ids == plain.token_ids
