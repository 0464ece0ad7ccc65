"""Admission by room in a KV pool the slots share (a unified cache): a request longer than an
even share of the pool waits until its prompt and max_tokens fit beside what the running
requests may come to hold, then runs; one that can never fit fails alone. FakeRunner, no model."""
from __future__ import annotations

from llamabatch import ContextOverflow, Engine, EngineConfig, SamplingParams

from fake_runner import FakeRunner, gated_at_first_call

WAIT = 10


def pool_engine(pool: int, n_slots: int = 4, reply=lambda p: "ok", **runner_kw) -> tuple[Engine, FakeRunner]:
    # slot_ctx here is what one request may hold: the whole pool, as the real runner's unified cache
    runner = FakeRunner(n_slots=n_slots, slot_ctx=pool, n_batch=64, pool_cells=pool, reply=reply, **runner_kw)
    config = EngineConfig(n_parallel=n_slots, n_batch=64, chunk_size=16, kv_unified=True, share_prefix_min=0)
    return Engine(config, runner=runner, default_params=SamplingParams(temperature=0, max_tokens=8)), runner


def slots_busy(runner: FakeRunner) -> list[int]:
    """Per executed plan, how many slots it evaluated."""
    return [len({c.slot for c in p.plan.chunks}) for p in runner.plans]


def test_short_requests_share_the_pool_and_run_side_by_side():
    engine, runner = pool_engine(pool=200)
    with engine:
        with engine.hold():  # queued together, so the first tick could admit all four
            handles = [engine.submit(f"p{i}" * 4, SamplingParams(temperature=0, max_tokens=8)) for i in range(4)]
        results = [h.result(timeout=WAIT) for h in handles]
    assert [r.finish_reason for r in results] == ["stop"] * 4
    assert max(slots_busy(runner)) == 4  # 4 x (8 + 8) tokens fit 200: nobody waited for room
    assert runner.violations == []


def first_and_last_plan(runner: FakeRunner, request_id: int) -> tuple[int, int]:
    """The indexes of the first and last executed plans that evaluated a chunk of the request."""
    seen = [i for i, p in enumerate(runner.plans) if any(c.request_id == request_id for c in p.plan.chunks)]
    return seen[0], seen[-1]


def test_a_request_longer_than_an_even_share_waits_for_room_then_runs():
    # pool 120, 4 slots: an even share would be 30 tokens. Each short one may hold 20 + 10,
    # the long one 90 + 10 = 100: it fits only once all three short ones have ended.
    gate, hook = gated_at_first_call()
    engine, runner = pool_engine(pool=120, reply=lambda p: "abcdefghij", hook=hook)
    params = SamplingParams(temperature=0, max_tokens=10)
    with engine:
        shorts = [engine.submit("s" * 20, params) for _ in range(3)]
        long_one = engine.submit("L" * 90, params)
        gate.set()
        results = [h.result(timeout=WAIT) for h in shorts + [long_one]]
    assert [r.finish_reason for r in results] == ["length"] * 4
    assert results[3].text == "abcdefghij" and results[3].usage.prompt_tokens == 90
    long_first, _ = first_and_last_plan(runner, results[3].request_id)
    assert all(first_and_last_plan(runner, r.request_id)[1] < long_first for r in results[:3])
    assert results[3].timings.queue_ms > 0
    assert runner.violations == []


def test_a_request_that_can_never_fit_fails_alone_with_the_numbers():
    engine, runner = pool_engine(pool=64)
    with engine:
        ok = engine.submit("fine", SamplingParams(temperature=0, max_tokens=4))
        refused = engine.submit("x" * 80, SamplingParams(temperature=0, max_tokens=4)).result(timeout=WAIT)
        assert ok.result(timeout=WAIT).finish_reason == "stop"
    assert refused.finish_reason == "error" and refused.error_code == ContextOverflow.code
    assert "80 tokens" in refused.error and "at most 64" in refused.error
    assert runner.violations == []


def test_idle_slots_caches_give_way_to_a_request_that_needs_their_room():
    engine, runner = pool_engine(pool=100, n_slots=4, reply=lambda p: "abcdefghij")
    params = SamplingParams(temperature=0, max_tokens=4)
    with engine:
        # four different prompts leave four slots' caches of ~24 tokens: 96 of the pool
        for r in engine.generate([c * 20 for c in "abcd"], params):
            assert r.finish_reason == "length"
        long_one = engine.generate(["z" * 80], SamplingParams(temperature=0, max_tokens=10))[0]
    assert long_one.finish_reason == "length" and long_one.usage.prompt_tokens == 80
    assert runner.trims, "no idle cache was emptied to make room"
    assert runner.violations == []


def test_requests_behind_a_waiting_long_one_do_not_overtake_it():
    # FIFO: short requests arriving behind a long one that waits for room do not start before it
    gate, hook = gated_at_first_call()
    engine, runner = pool_engine(pool=120, reply=lambda p: "abcdefghij", hook=hook)
    params = SamplingParams(temperature=0, max_tokens=10)
    with engine:
        handles = [engine.submit("s" * 20, params) for _ in range(3)]
        handles.append(engine.submit("L" * 90, params))
        handles += [engine.submit("t" * 20, params) for _ in range(3)]
        gate.set()
        results = [h.result(timeout=WAIT) for h in handles]
    assert [r.finish_reason for r in results] == ["length"] * 7
    long_first, _ = first_and_last_plan(runner, results[3].request_id)
    assert all(first_and_last_plan(runner, r.request_id)[0] > long_first for r in results[4:])
    assert runner.violations == []
