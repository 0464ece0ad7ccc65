"""One KV cache the slots share, on a model with window layers: a neighbour's work may take an
idle slot's early window cells (llama.cpp's cell search reuses cells their own sequence no
longer sees), so a later request that shares only a short prefix with that slot can no longer
keep it. Such a request is answered all the same: admission asks the runner what it can still
keep (Runner.keep_floor) and evaluates instead, and a trim or fork the runner finds it cannot
keep empties the slot and the request evaluates again. FakeRunner, no model."""
from __future__ import annotations

from llamabatch import Engine, EngineConfig, SamplingParams

from fake_runner import FakeRunner

WAIT = 10
PARAMS = SamplingParams(temperature=0, max_tokens=8)


def shared_cache_engine(**runner_kw) -> tuple[Engine, FakeRunner]:
    runner = FakeRunner(n_slots=2, slot_ctx=200, n_batch=64, pool_cells=200, window=8,
                        reply=lambda p: "ok", **runner_kw)
    config = EngineConfig(n_parallel=2, n_batch=64, chunk_size=16, kv_unified=True, share_prefix_min=0)
    return Engine(config, runner=runner, default_params=PARAMS), runner


def test_a_slot_whose_window_cells_a_neighbour_took_is_evaluated_instead_of_cut():
    engine, runner = shared_cache_engine()
    with engine:
        first = engine.submit("A" * 40, PARAMS).result(timeout=WAIT)
        slot = runner.plans[0].plan.chunks[0].slot
        runner.lose_window(slot, 30)  # keeping it now needs 38 tokens; the next prompt shares 20
        second = engine.submit("A" * 20 + "B" * 10, PARAMS).result(timeout=WAIT)
    assert (first.finish_reason, second.finish_reason) == ("stop", "stop")
    assert second.text == "ok" and second.usage.cached_tokens == 0
    assert (slot, 20) not in runner.trims  # never asked to keep what it no longer holds
    assert runner.violations == []


def test_a_prefix_kept_while_the_window_held_still_reuses_it():
    engine, runner = shared_cache_engine()
    with engine:
        engine.submit("A" * 40, PARAMS).result(timeout=WAIT)
        slot = runner.plans[0].plan.chunks[0].slot
        runner.lose_window(slot, 10)  # keeping 20 or more still finds the 8 window cells before
        second = engine.submit("A" * 20 + "B" * 10, PARAMS).result(timeout=WAIT)
    assert second.text == "ok" and second.usage.cached_tokens == 20
    assert runner.violations == []


def test_a_trim_the_runner_cannot_keep_empties_the_slot_and_the_request_evaluates_again():
    # the cells go between admission and the plan (as a decode in flight could take them):
    # the runner empties the slot, and the request evaluates its whole prompt next tick
    armed = {"slot": None}

    def take_cells_at_the_next_plan(call, plan):
        if armed["slot"] is not None and any(t.n_keep > 0 for t in plan.trims):
            runner.lose_window(armed["slot"], 30)
            armed["slot"] = None

    engine, runner = shared_cache_engine(hook=take_cells_at_the_next_plan)
    with engine:
        first = engine.submit("A" * 40, PARAMS).result(timeout=WAIT)
        armed["slot"] = runner.plans[0].plan.chunks[0].slot
        second = engine.submit("A" * 20 + "B" * 10, PARAMS).result(timeout=WAIT)
        third = engine.submit("C" * 12, PARAMS).result(timeout=WAIT)
    assert [r.finish_reason for r in (first, second, third)] == ["stop"] * 3
    assert second.text == "ok" and second.usage.cached_tokens == 0
    assert armed["slot"] is None  # the hook did take the cells
    assert runner.violations == []
