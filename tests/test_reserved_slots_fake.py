"""Reserved slots in the core scheduler (FakeRunner, no model): EngineConfig.reserved_slots of
the n_parallel slots (the last ids) are only for requests above the default priority (priority
< 0). Requests at the default priority or below never hold them; an urgent request beside a
full batch takes one at once and puts nothing aside; a request the fair share put at the head
does not keep an urgent one behind it from a reserved slot."""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, InvalidRequest, SamplingParams
from llamabatch.core.plan import StepPlan

from fake_runner import FakeRunner, gated_at_first_call

WAIT = 10


def engine_over(runner: FakeRunner, reserved: int) -> Engine:
    config = EngineConfig(n_parallel=runner.n_slots, n_batch=64, chunk_size=16, share_prefix_min=0,
                          reserved_slots=reserved)
    return Engine(config, runner=runner, default_params=SamplingParams(temperature=0, max_tokens=8))


def params(priority: int = 0, max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, priority=priority)


def test_requests_at_the_default_priority_or_below_never_hold_a_reserved_slot():
    opened, hook = gated_at_first_call()
    runner = FakeRunner(n_slots=3, slot_ctx=256, n_batch=64, hook=hook, reply=lambda p: "abcdef")
    with engine_over(runner, reserved=1) as engine:
        handles = [engine.submit(f"line {i}", params(priority=i % 2 * 3)) for i in range(6)]  # priorities 0 and 3
        opened.set()
        results = [h.result(timeout=WAIT) for h in handles]
        stats = engine.stats()
    assert all(r.text == "abcdef" for r in results)
    assert stats.reserved_slots == 1 and stats.n_parallel == 3
    assert {c.slot for p in runner.plans for c in p.plan.chunks} == {0, 1}  # never the reserved (last) slot
    assert runner.violations == []


def test_an_urgent_request_beside_a_full_batch_takes_the_reserved_slot_and_puts_nothing_aside():
    submitted: dict[str, object] = {}
    runner = FakeRunner(n_slots=3, slot_ctx=256, n_batch=64, reply=lambda p: "x" * 12)

    def hook(call: int, plan: StepPlan) -> None:
        if sum(c.is_decode for c in plan.chunks) == 2 and "urgent" not in submitted:  # the batch's slots busy
            submitted["urgent"] = engine.submit("urgent question", params(priority=-1, max_tokens=4))
            submitted["at"] = call

    runner.hook = hook
    engine = engine_over(runner, reserved=1)
    with engine:
        with engine.hold():
            batch = [engine.submit(f"line {i}", params(max_tokens=12)) for i in range(6)]
        results = [h.result(timeout=WAIT) for h in batch]
        urgent = submitted["urgent"].result(timeout=WAIT)  # type: ignore[attr-defined]
        stats = engine.stats()
    urgent_first = runner.plans_with(urgent.request_id)[0]
    assert urgent_first.call == submitted["at"] + 1  # the next tick
    # in the reserved slot, the last: the batch's slots stay consecutive ids (AdmissionQueue._open_to)
    assert {c.slot for p in runner.plans for c in p.plan.chunks if c.request_id == urgent.request_id} == {2}
    assert {c.slot for p in runner.plans for c in p.plan.chunks if c.request_id != urgent.request_id} == {0, 1}
    assert stats.preemptions == 0 and all(r.timings.preemptions == 0 for r in results)
    assert all(r.text == "x" * 12 for r in results)
    assert runner.violations == []


def test_a_fair_share_head_does_not_keep_an_urgent_request_from_a_reserved_slot():
    # One batch slot, one reserved. The fair share puts the oldest waiting request (priority 5)
    # at the head; it may not take the reserved slot, and an urgent request queued behind it
    # takes that slot instead of waiting for the head to get the batch slot.
    runner = FakeRunner(n_slots=2, slot_ctx=256, n_batch=64, reply=lambda p: "ab")
    submitted: dict[str, object] = {}

    def hook(call: int, plan: StepPlan) -> None:
        if call < 40:
            submitted.setdefault("stream", []).append(engine.submit(f"h{call}", params(priority=0, max_tokens=4)))
        waiting = engine.scheduler.waiting  # read on the engine thread, in its tick
        if "urgent" not in submitted and len(waiting) > 1 and waiting[0].params.priority == 5:  # put first by the fair share
            submitted["urgent"] = engine.submit("urgent", params(priority=-1, max_tokens=2))
            submitted["at"] = call

    runner.hook = hook
    engine = engine_over(runner, reserved=1)
    with engine:
        with engine.hold():
            first = engine.submit("first", params(priority=0, max_tokens=2))
            low = engine.submit("low", params(priority=5, max_tokens=2))
        low_result = low.result(timeout=WAIT)
        urgent = submitted["urgent"].result(timeout=WAIT)  # type: ignore[attr-defined]
        for h in [first, *submitted["stream"]]:  # type: ignore[misc]
            h.result(timeout=WAIT)
    assert runner.plans_with(urgent.request_id)[0].call == submitted["at"] + 1
    assert low_result.text == "ab"
    assert runner.violations == []


def test_reserved_slots_must_leave_one_for_the_default_priority():
    with pytest.raises(InvalidRequest, match="reserved_slots"):
        EngineConfig(n_parallel=2, reserved_slots=2).validate()
    assert EngineConfig(n_parallel=2, reserved_slots=1).validate().reserved_slots == 1
