"""`n` samples of one prompt against the scripted FakeRunner: one prefill, KV forks, seeds,
waiting for slots, cancel/timeout of all samples, one Result. No model."""
from __future__ import annotations

import pytest

from llamabatch import Delta, SamplingParams, TickRecord

from fake_runner import EOG, FakeRunner, text_tokens
from test_engine_fake import GREEDY, WAIT, Gate, assert_clean, make_engine


def seeded(prompt: str, seed: int) -> str:
    return f"s{seed}-" + "x" * (seed % 3)  # samples differ by seed and end at different times


def test_n_samples_share_one_prefill_and_fork_the_prompt():
    runner = FakeRunner(n_slots=4, slot_ctx=200, reply=seeded)
    ticks = []
    with make_engine(runner) as engine:
        engine.subscribe(lambda r: ticks.append(r) if isinstance(r, TickRecord) else None)
        deltas = {}
        handle = engine.submit("prompt!", GREEDY.replace(n=3, seed=10),
                               callback=lambda h, item: isinstance(item, Delta)
                               and deltas.__setitem__(item.index, deltas.get(item.index, "") + item.text))
        result = handle.result(WAIT)
    assert [s.text for s in result.samples] == ["s10-x", "s11-xx", "s12-"]
    assert [s.index for s in result.samples] == [0, 1, 2]
    assert [s.seed for s in result.samples] == [10, 11, 12]
    assert deltas == {0: "s10-x", 1: "s11-xx", 2: "s12-"}  # streamed text names its sample
    assert (result.text, result.seed) == ("s10-x", 10)
    assert result.usage.prompt_tokens == 7  # counted once
    assert result.usage.completion_tokens == 5 + 6 + 4
    assert sum(t.prefill_tokens for t in ticks) == 7  # the prompt was evaluated once
    src = runner.plans[0].plan.chunks[0].slot
    assert sorted(runner.forks) == sorted((src, dst, 7) for dst, _ in runner.plans[0].plan.chunks[0].siblings)
    assert len(runner.forks) == 2 and runner.plans[1].plan.forks  # forked right before the first decode
    assert_clean(runner)  # every sample decoded at positions its (forked) KV holds


def test_n_greedy_identical_samples_and_a_prompt_cache_hit_after():
    runner = FakeRunner(n_slots=4, slot_ctx=200, reply=lambda p: "same")
    with make_engine(runner) as engine:
        r = engine.submit("abcdef", GREEDY.replace(n=4)).result(WAIT)
        again = engine.submit("abcdefgh").result(WAIT)  # any of the 4 slots holds the prompt now
    assert [s.text for s in r.samples] == ["same"] * 4 and r.finish_reason == "stop"
    assert again.usage.cached_tokens == 6
    assert_clean(runner)


def test_a_sample_that_ends_at_its_first_token_leaves_a_consistent_slot():
    runner = FakeRunner(n_slots=3, slot_ctx=200, reply=lambda p, seed: [EOG] if seed == 1 else "ok" if p == "hello" else p + "!")
    with make_engine(runner) as engine:
        r = engine.submit("hello", GREEDY.replace(n=3, seed=0)).result(WAIT)
        # its fork was decided with its first token and still runs: its slot then holds the
        # prompt, as the scheduler's bookkeeping says (the fake checks every position)
        later = [engine.submit("hello there", GREEDY.replace(seed=9)) for _ in range(3)]
        texts = [h.result(WAIT).text for h in later]
    assert [s.text for s in r.samples] == ["ok", "", "ok"]
    assert [s.finish_reason for s in r.samples] == ["stop"] * 3
    assert len(runner.forks) == 2
    assert texts == ["hello there!"] * 3
    assert_clean(runner)


def test_n_larger_than_the_slots_is_one_clear_error():
    runner = FakeRunner(n_slots=2, slot_ctx=200)
    with make_engine(runner) as engine:
        r = engine.submit("x", GREEDY.replace(n=3)).result(WAIT)
        ok = engine.submit("y", GREEDY.replace(n=2)).result(WAIT)
    assert r.finish_reason == "error" and r.error_code == "invalid_request"
    assert "n=3 is more than the 2 slots" in r.error
    assert [s.text for s in ok.samples] == ["y!", "y!"]
    assert runner.samplers and all(s.freed == 1 for s in runner.samplers)


def test_the_fork_waits_for_enough_free_slots_and_nothing_overtakes_it():
    gate = Gate(at=2)
    runner = FakeRunner(n_slots=3, slot_ctx=200, reply=lambda p: {"busy": "rrrr", "group": "ok"}.get(p, p + "!"), hook=gate)
    with make_engine(runner) as engine:
        busy = engine.submit("busy")
        gate.wait_entered()  # busy holds one slot: two are free
        group = engine.submit("group", GREEDY.replace(n=3))
        single = engine.submit("single")
        gate.release.set()
        rg, rs, rb = group.result(WAIT), single.result(WAIT), busy.result(WAIT)
    assert [s.text for s in rg.samples] == ["ok"] * 3 and rs.text == "single!" and rb.text == "rrrr"
    first_group_tick = min(p.call for p in runner.plans_with(group.request_id))
    first_single_tick = min(p.call for p in runner.plans_with(single.request_id))
    last_busy_tick = max(p.call for p in runner.plans_with(busy.request_id))
    assert first_group_tick > last_busy_tick  # waited for the third slot
    assert first_single_tick > first_group_tick  # FIFO: the single request did not jump ahead
    assert_clean(runner)


@pytest.mark.parametrize("when", ["queued", "prefilling", "generating"])
def test_cancel_of_an_n_request_cancels_every_sample(when):
    gate = Gate(at={"queued": 1, "prefilling": 1, "generating": 3}[when])
    runner = FakeRunner(n_slots=4, slot_ctx=10_000, reply=lambda p: "y" * 500, hook=gate, n_batch=64)
    with make_engine(runner, chunk_size=4) as engine:
        if when == "queued":
            blocker = engine.submit("blocker", GREEDY.replace(max_tokens=3))
            gate.wait_entered()
        handle = engine.submit("a longer prompt here", GREEDY.replace(n=3, max_tokens=500))
        if when != "queued":
            gate.wait_entered()
        handle.cancel()
        gate.release.set()
        r = handle.result(WAIT)
        if when == "queued":  # the blocker holds a slot until its 3 tokens are out
            blocker.result(WAIT)
        stats = engine.stats()
    assert r.finish_reason == "cancelled"
    assert [s.finish_reason for s in r.samples] == ["cancelled"] * 3
    assert stats.slots_idle == 4 and stats.cancelled == 1
    assert all(s.freed == 1 for s in runner.samplers)
    assert_clean(runner)


def test_timeout_ends_every_sample():
    runner = FakeRunner(n_slots=3, slot_ctx=10_000, reply=lambda p: "y" * 5000, step_delay=0.002)
    with make_engine(runner) as engine:
        r = engine.submit("x", GREEDY.replace(n=3, max_tokens=5000, timeout=0.1)).result(WAIT)
    assert r.finish_reason == "timeout"
    assert [s.finish_reason for s in r.samples] == ["timeout"] * 3
    assert all(0 < len(s.text) < 5000 for s in r.samples)


def test_logprobs_for_every_sample():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p, seed: "ab" if seed == 5 else "cd")
    with make_engine(runner) as engine:
        r = engine.submit("x", GREEDY.replace(n=2, seed=5, logprobs=1)).result(WAIT)
    assert [[lp["id"] for lp in s.logprobs] for s in r.samples] == [text_tokens("ab"), text_tokens("cd")]


def test_n_without_a_runner_that_can_fork_is_one_clear_error_not_a_crash():
    runner = FakeRunner(n_slots=4, slot_ctx=200, can_fork=False)
    with make_engine(runner, cache_prompt=False) as engine:
        r = engine.submit("x", GREEDY.replace(n=2)).result(WAIT)
        ok = engine.submit("y").result(WAIT)  # the engine goes on serving
    assert r.finish_reason == "error" and r.error_code == "invalid_request" and "needs a KV fork" in r.error
    assert ok.text == "y!"
