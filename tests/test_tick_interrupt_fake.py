"""A request that outranks every row of the decode in flight stops that decode (FakeRunner, no
model; core/tick_interrupt.py): the tick counts as not run, the urgent prompt's tick comes next,
and the interrupted rows run again unchanged. Requests of equal priority, runners that cannot
stop a decode and ticks of a fair-share request are never interrupted (the fair-share case:
test_priority_fake.py's stream of higher prompts, one each tick), nor is a decode more than half
done; and, as a property, decodes stopped anywhere change no answer."""
from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamabatch import SamplingParams
from llamabatch.core.plan import INTERRUPTED, StepPlan
from llamabatch.core.tick_interrupt import TickInterrupt

from fake_runner import FakeRunner
from test_priority_fake import WAIT, engine_over, params, urgent_at_first_decode


def chunks_of(runner: FakeRunner, call: int) -> list[tuple[int, int, int, tuple[int, ...]]]:
    plan = next(p.plan for p in runner.plans if p.call == call)
    return [(c.request_id, c.slot, c.start_pos, tuple(c.tokens)) for c in plan.chunks]


def two_lines_and_an_urgent_one(urgent_priority: int, can_interrupt: bool = True):
    """Two priority-0 requests in 4 slots; a request of `urgent_priority` arrives inside their
    first decode. (runner, the two results, the urgent result, the engine's stats)."""
    runner = FakeRunner(n_slots=4, slot_ctx=256, n_batch=64, reply=lambda p: "abcdef", can_interrupt=can_interrupt,
                        eval_ms=40)
    engine, submitted = urgent_at_first_decode(runner, params(priority=urgent_priority, max_tokens=3))
    with engine:
        with engine.hold():  # admitted together
            batch = [engine.submit(f"line {i}", params(priority=0)) for i in range(2)]
        answers = [h.result(timeout=WAIT) for h in batch]
        urgent = submitted["high"].result(timeout=WAIT)  # type: ignore[attr-defined]
        stats = engine.stats()
    return runner, answers, urgent, stats


def test_an_urgent_arrival_stops_the_decode_in_flight_and_its_prompt_runs_next_alone():
    runner, answers, urgent, stats = two_lines_and_an_urgent_one(-1)
    (stopped,) = runner.interrupted_calls
    assert [p.status for p in runner.plans if p.call == stopped] == [2]
    after = [p.plan for p in runner.plans if p.call > stopped]
    assert {c.request_id for c in after[0].chunks} == {urgent.request_id}  # the urgent prompt's tick
    # the stopped rows run again as they were: nothing of them was kept
    again = [(c.request_id, c.slot, c.start_pos, tuple(c.tokens)) for p in after[1:] for c in p.chunks]
    assert set(chunks_of(runner, stopped)) <= set(again)
    assert [a.text for a in answers] == ["abcdef", "abcdef"] and urgent.text == "abc"
    assert stats.interrupted_ticks == 1
    assert runner.violations == []


@pytest.mark.parametrize("urgent_priority, can_interrupt", [(0, True), (-1, False)],
                         ids=["equal-priority", "runner-cannot-stop-a-decode"])
def test_nothing_is_interrupted_where_it_need_not_or_cannot_be(urgent_priority, can_interrupt):
    runner, answers, urgent, stats = two_lines_and_an_urgent_one(urgent_priority, can_interrupt)
    assert runner.interrupted_calls == [] and stats.interrupted_ticks == 0
    assert all(p.status == 0 for p in runner.plans)
    assert [a.text for a in answers] == ["abcdef", "abcdef"] and urgent.text == "abc"


def test_a_resumed_requests_restore_on_an_interrupted_tick_holds_and_it_ends_unchanged():
    # Two slots, two batch requests. u1 preempts the later one (b); when b's KV is put back, the
    # Restore rides on a tick with a's row, and u2 interrupts that tick and preempts b again: the
    # restore stays applied (and recorded), b is parked from the restored slot and resumed once
    # more, and both answers are the unpreempted ones.
    runner = FakeRunner(n_slots=2, slot_ctx=256, n_batch=64, reply=lambda p: "abcdefgh", eval_ms=40)
    submitted: dict[str, object] = {}

    def hook(call: int, plan: StepPlan) -> None:
        if "u1" not in submitted and any(c.is_decode for c in plan.chunks):
            submitted["u1"] = engine.submit("u1", params(priority=-1, max_tokens=2))
        elif "u1" in submitted and "u2" not in submitted and plan.restores and plan.chunks:
            submitted["u2"] = engine.submit("u2", params(priority=-1, max_tokens=2))

    runner.hook = hook
    engine = engine_over(runner)
    with engine:
        with engine.hold():  # admitted together
            batch = [engine.submit(name, params(priority=0)) for name in ("a", "b")]
        a, b = (h.result(timeout=WAIT) for h in batch)
        urgent = [submitted[k].result(timeout=WAIT) for k in ("u1", "u2")]  # type: ignore[attr-defined]
    assert a.text == b.text == "abcdefgh" and [u.text for u in urgent] == ["ab", "ab"]
    restoring = [p for p in runner.plans if p.plan.restores and p.plan.chunks]
    assert len(runner.interrupted_calls) == 2 and restoring[0].call in runner.interrupted_calls
    assert [took for _, _, took in runner.restores] == [True, True]  # the interrupted tick's, then the last
    assert (a.timings.preemptions, b.timings.preemptions) == (0, 2)
    assert runner.violations == []


class CountingRunner:
    def __init__(self) -> None:
        self.stopped = 0

    def interrupt(self) -> None:
        self.stopped += 1

    def clear_interrupt(self) -> None:
        pass


def test_a_decode_more_than_half_done_is_left_to_finish():
    early, late = CountingRunner(), CountingRunner()
    for runner, run_ms, wait_s in ((early, 1000.0, 0.0), (late, 2.0, 0.02)):
        ticks = TickInterrupt(runner)
        ticks.observe(run_ms, 1)  # graph runs take run_ms
        ticks.arm(0, [], graph_runs=1)
        time.sleep(wait_s)  # early: at once, far under half of 1 s; late: 20 ms into a 2 ms decode
        ticks.arrived(-1)
        ticks.disarm()
    assert (early.stopped, late.stopped) == (1, 0)
    fresh = CountingRunner()
    ticks = TickInterrupt(fresh)  # no decode timed yet: any outranking arrival interrupts
    ticks.arm(0, [], graph_runs=3)
    ticks.arrived(0)  # equal priority: never
    ticks.arrived(-1)
    assert fresh.stopped == 1


def answers(requests: list[tuple[int, int, int, int, int]], slots: int, stopped: set[int]) -> list[tuple]:
    """(text, finish_reason, the samples') of each (priority, max_tokens, prompt length, arrival,
    n samples) request, in order, with the decodes of the `stopped` call numbers returning
    INTERRUPTED (as a real interrupt leaves them: nothing kept). Arrival 0: submitted before the
    first tick; n: from inside the engine's n-th decode, so a later urgent request finds the
    slots busy."""
    runner = FakeRunner(n_slots=slots, slot_ctx=256, n_batch=32, reply=lambda p: "re " + p[:9],
                        status=lambda call, plan: INTERRUPTED if call in stopped and plan.chunks else 0)
    handles: dict[int, object] = {}
    lock = threading.Lock()

    def submit(i: int) -> None:
        with lock:  # the hook (engine thread) and the test thread: each request once
            if i in handles:
                return
            priority, tokens, length, _, n = requests[i]
            handles[i] = engine.submit(f"p{i} " + "x" * length, SamplingParams(temperature=0, max_tokens=tokens,
                                                                            priority=priority, n=n))

    def hook(call: int, plan: StepPlan) -> None:
        for i, request in enumerate(requests):
            if request[3] == call:
                submit(i)

    runner.hook = hook
    engine = engine_over(runner, n_batch=32, chunk_size=16)
    with engine:
        with engine.hold():
            for i, request in enumerate(requests):
                if request[3] == 0:
                    submit(i)
        while len(handles) < len(requests):  # a request whose call never came (all else ended): now
            with lock:
                known = list(handles.values())
            for handle in known:
                handle.result(timeout=WAIT)  # type: ignore[attr-defined]
            missing = [i for i in range(len(requests)) if i not in handles]
            if missing:  # (the hook may have taken it meanwhile: submit() then does nothing)
                submit(missing[0])
        results = {i: h.result(timeout=WAIT) for i, h in handles.items()}  # type: ignore[attr-defined]
    assert runner.violations == []
    return [(results[i].text, results[i].finish_reason, [(s.text, s.finish_reason) for s in results[i].samples or []])
            for i in range(len(requests))]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(st.tuples(st.sampled_from([-1, 0, 3]), st.integers(1, 14), st.integers(0, 40),
                                   st.sampled_from([0, 0, 2, 4, 7]), st.sampled_from([1, 1, 2])), min_size=1, max_size=8),
       stopped=st.sets(st.integers(1, 80), max_size=20), slots=st.integers(1, 3))
def test_interrupted_decodes_anywhere_change_no_answer(requests, stopped, slots):
    # priorities, prompts longer than a chunk, fewer slots than requests, urgent ones arriving
    # while others run (preemption and restores), n samples (forks), with any of the first 80
    # decodes stopped
    assert answers(requests, slots, stopped) == answers(requests, slots, set())
