"""Priority for requests of `n` samples on the bundled models (both families): every sample of
a request put aside is parked and restored, and answers as it does unpreempted; an urgent
request of two samples puts aside two running requests at once instead of waiting for them."""
from __future__ import annotations

import threading

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.model

TOKENS = 12
SEEDED = SamplingParams(max_tokens=TOKENS, temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=77)
GREEDY = SamplingParams(max_tokens=TOKENS, temperature=0)
PROMPTS = ["List three facts about the moon.", "Once upon a time"]


def after_tokens(engine: Engine, submits, urgent: SamplingParams | None):
    """Submit `submits` [(prompt, params)], then `urgent` once every one has streamed 3 tokens."""
    counts: dict[int, int] = {}
    ready = threading.Event()
    n_rows = sum(p.n for _, p in submits)

    def on_event(handle, event) -> None:
        key = (handle.request_id, getattr(event, "index", 0))
        counts[key] = counts.get(key, 0) + len(getattr(event, "token_ids", []) or [])
        if len(counts) == n_rows and min(counts.values()) >= 3:
            ready.set()

    handles = [engine.submit(prompt, params, callback=on_event) for prompt, params in submits]
    rush = None
    if urgent is not None:
        assert ready.wait(120)
        rush = engine.submit("The capital of France is", urgent)
    return [h.result(timeout=300) for h in handles], (rush.result(timeout=300) if rush else None)


def texts(result) -> list[list[int]]:
    return [s.token_ids for s in result.samples] if result.samples else [result.token_ids]


def test_an_n_request_put_aside_answers_every_sample_as_unpreempted(family):
    config = EngineConfig(model=family.path, n_parallel=2, n_ctx=1024)
    low = [(PROMPTS[1], SEEDED.replace(n=2, priority=1000))]
    with Engine(config) as engine:
        (plain,), _ = after_tokens(engine, low, None)
        (paused,), urgent = after_tokens(engine, low, GREEDY.replace(max_tokens=4, priority=-1))
    assert urgent.finish_reason in ("stop", "length") and urgent.token_ids
    assert [s.timings.preemptions for s in paused.samples] == [1, 1]
    assert texts(paused) == texts(plain)
    assert all(len(ids) > 3 for ids in texts(plain))  # both were mid-answer when it came


def test_an_urgent_n_request_puts_aside_two_running_requests(family):
    config = EngineConfig(model=family.path, n_parallel=2, n_ctx=1024)
    lows = [(prompt, GREEDY.replace(priority=5)) for prompt in PROMPTS]
    with Engine(config) as engine:
        plain, _ = after_tokens(engine, lows, None)
        paused, urgent = after_tokens(engine, lows, SEEDED.replace(n=2, max_tokens=4, priority=-1))
    assert urgent.finish_reason in ("stop", "length") and len(urgent.samples) == 2
    assert [r.timings.preemptions for r in paused] == [1, 1]
    assert [r.token_ids for r in paused] == [r.token_ids for r in plain]
