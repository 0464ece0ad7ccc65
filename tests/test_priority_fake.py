"""Priority in the core scheduler (FakeRunner, no model): admission by (priority, arrival), a
higher-priority prompt's chunk first in the tick's budget, preemption with the preempted
request's KV kept aside and put back (or evaluated again when that fails), the fair share
that keeps a low-priority request from starving, and a request arriving during a saturating
batch starting within one tick while every batch request still ends exactly once."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.plan import StepPlan
from llamabatch.core.scheduling.admission import FAIR_SHARE

from fake_runner import FakeRunner, gated_at_first_call

WAIT = 10


def engine_over(runner: FakeRunner, **config) -> Engine:
    settings = dict(n_parallel=runner.n_slots, n_batch=runner.n_batch or 64, chunk_size=16, share_prefix_min=0)
    settings.update(config)
    return Engine(EngineConfig(**settings), runner=runner, default_params=SamplingParams(temperature=0, max_tokens=8))


def params(priority: int = 0, max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, priority=priority)


def urgent_at_first_decode(runner: FakeRunner, urgent: SamplingParams) -> tuple[Engine, dict[str, object]]:
    """An engine over `runner` that submits `urgent` (submitted["high"]) from inside the first
    execute whose plan decodes: a request is generating in every slot it has by then."""
    submitted: dict[str, object] = {}

    def hook(call: int, plan: StepPlan) -> None:
        if any(c.is_decode for c in plan.chunks) and "high" not in submitted:
            submitted["high"] = engine.submit("now", urgent)

    runner.hook = hook
    engine = engine_over(runner)
    return engine, submitted


def first_plan_of(runner: FakeRunner, request_id: int) -> int:
    return runner.plans_with(request_id)[0].call


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    opened, hook = gated_at_first_call()
    runner = FakeRunner(n_slots=1, slot_ctx=256, n_batch=64, hook=hook, reply=lambda p: "abc")
    with engine_over(runner) as engine:
        first = engine.submit("holder", params(priority=-5))  # runs; nobody below outranks it
        queued = [engine.submit(f"q{i}", params(priority=p)) for i, p in enumerate([0, 5, -1, 0, -1])]
        opened.set()
        results = [h.result(timeout=WAIT) for h in [first, *queued]]
    assert all(r.finish_reason == "stop" for r in results)
    order = sorted(results[1:], key=lambda r: first_plan_of(runner, r.request_id))
    # q2 (-1), q4 (-1), q0 (0), q3 (0), q1 (5)
    assert [r.request_id for r in order] == [queued[i].request_id for i in (2, 4, 0, 3, 1)]
    assert runner.violations == []


def test_a_higher_priority_prompt_takes_the_ticks_prefill_budget_first():
    opened, hook = gated_at_first_call()
    runner = FakeRunner(n_slots=3, slot_ctx=256, n_batch=16, hook=hook, reply=lambda p: "ok")
    with engine_over(runner, n_batch=16, chunk_size=16) as engine:
        engine.submit("x", params(priority=-9))  # holds the gate
        low = engine.submit("L" * 40, params(priority=3))  # arrives first
        high = engine.submit("H" * 40, params(priority=1))
        opened.set()
        low_r, high_r = low.result(timeout=WAIT), high.result(timeout=WAIT)
    second = runner.plans[1].plan  # both admitted together, after the gated first plan
    rows = {c.request_id: len(c.tokens) for c in second.chunks}
    decode_rows = sum(len(c.tokens) for c in second.chunks if c.is_decode)  # the first one's token
    assert rows.get(high_r.request_id) == 16 - decode_rows and low_r.request_id not in rows
    assert low_r.text == high_r.text == "ok"
    assert runner.violations == []


def test_a_higher_priority_request_preempts_and_the_preempted_one_resumes_unchanged():
    submitted: dict[str, object] = {}
    runner = FakeRunner(n_slots=2, slot_ctx=256, n_batch=64, reply=lambda p: "0123456789abcdef")

    def hook(call: int, plan: StepPlan) -> None:
        if sum(c.is_decode for c in plan.chunks) == 2 and "high" not in submitted:  # every slot is busy
            submitted["high"] = engine.submit("urgent", params(priority=-1, max_tokens=4))
            submitted["at"] = call

    runner.hook = hook
    engine = engine_over(runner)
    with engine:
        with engine.hold():  # admitted together
            lows = [engine.submit(f"low{i}", params(max_tokens=16)) for i in range(2)]
        low_results = [h.result(timeout=WAIT) for h in lows]
        high_result = submitted["high"].result(timeout=WAIT)  # type: ignore[attr-defined]
        stats = engine.stats()
    assert first_plan_of(runner, high_result.request_id) == submitted["at"] + 1  # the next tick after it arrived
    assert high_result.text == "0123"
    assert [r.text for r in low_results] == ["0123456789abcdef"] * 2  # as if never preempted
    preempted = [r for r in low_results if r.timings.preemptions]
    assert len(preempted) == 1 and preempted[0].timings.paused_ms > 0
    assert preempted[0].request_id == lows[1].request_id  # the latest to arrive among equals
    assert stats.preemptions == 1
    assert [n for _, n, ok in runner.restores] and all(ok for *_, ok in runner.restores)
    assert any(t.preemptions == 1 for t in engine.telemetry.recent_ticks)
    assert any(t.rows_by_priority.get(-1) for t in engine.telemetry.recent_ticks)
    assert runner.violations == []


def test_a_restore_that_fails_evaluates_the_request_again_and_its_answer_is_the_same():
    runner = FakeRunner(n_slots=1, slot_ctx=256, n_batch=64, reply=lambda p: "0123456789",
                        restore_ok=lambda slot: False)

    engine, submitted = urgent_at_first_decode(runner, params(priority=-2, max_tokens=3))
    with engine:
        low = engine.submit("low", params(max_tokens=10)).result(timeout=WAIT)
        high = submitted["high"].result(timeout=WAIT)  # type: ignore[attr-defined]
    assert high.text == "012" and low.text == "0123456789"
    assert low.timings.preemptions == 1
    assert runner.restores and not any(ok for *_, ok in runner.restores)
    assert runner.violations == []


@pytest.mark.parametrize("whole_below, reused", [(None, 0), (1000, 14), (5, 0)],
                         ids=["restores-continue-from-their-end", "restored-whole", "restored-past-the-window"])
def test_a_slot_restored_whole_leaves_its_prompt_prefix_to_the_next_request(whole_below, reused):
    """A line put aside and resumed leaves its slot holding its tokens again. Where the restore
    brought every position back (fewer tokens than the runner's restored_whole_below: a
    sequence inside the sliding window), the next request keeps the prefix they share, as
    after an evaluated slot; otherwise the slot continues from its end only and is emptied."""
    runner = FakeRunner(n_slots=1, slot_ctx=256, n_batch=64, reply=lambda p: "0123456789",
                        restored_whole_below=whole_below)
    engine, submitted = urgent_at_first_decode(runner, params(priority=-1, max_tokens=3))
    with engine:
        low = engine.submit("shared prefix one", params(max_tokens=10)).result(timeout=WAIT)
        submitted["high"].result(timeout=WAIT)  # type: ignore[attr-defined]
        after = engine.submit("shared prefix two", params(max_tokens=4)).result(timeout=WAIT)
    assert low.timings.preemptions == 1 and low.text == "0123456789"
    assert runner.restores and all(ok for *_, ok in runner.restores)
    assert after.usage.cached_tokens == reused  # "shared prefix " is 14 tokens
    assert after.text == "0123"
    assert runner.violations == []


def test_without_parking_a_higher_priority_request_waits_for_a_free_slot_and_goes_first():
    opened, hook = gated_at_first_call()
    runner = FakeRunner(n_slots=1, slot_ctx=256, n_batch=64, hook=hook, reply=lambda p: "abcd", can_park=False)
    with engine_over(runner) as engine:
        running = engine.submit("run", params())
        low = engine.submit("low", params())
        high = engine.submit("high", params(priority=-1))
        opened.set()
        results = [h.result(timeout=WAIT) for h in (running, low, high)]
    assert [r.timings.preemptions for r in results] == [0, 0, 0]
    assert first_plan_of(runner, results[2].request_id) < first_plan_of(runner, results[1].request_id)
    assert runner.violations == []


def test_a_low_priority_request_is_not_starved_by_a_steady_stream_of_higher_ones():
    # One slot; a priority-5 request waits while priority-0 requests keep arriving, one more
    # each tick: it is admitted once FAIR_SHARE of them went ahead of it, and then never preempted.
    handles = []
    runner = FakeRunner(n_slots=1, slot_ctx=256, n_batch=64, reply=lambda p: "ab")
    stop = threading.Event()

    def hook(call: int, plan: StepPlan) -> None:
        if not stop.is_set() and call < 200:
            handles.append(engine.submit(f"h{call}", params(priority=0, max_tokens=2)))

    runner.hook = hook
    engine = engine_over(runner)
    with engine:
        with engine.hold():  # both queued before the first tick (and its hook) runs
            first = engine.submit("first", params(priority=0, max_tokens=2))
            low = engine.submit("low", params(priority=5, max_tokens=6))
        result = low.result(timeout=WAIT)
        stop.set()
        for h in [first, *handles]:
            h.result(timeout=WAIT)
    started = first_plan_of(runner, result.request_id)
    ahead = {c.request_id for p in runner.plans if p.call < started for c in p.plan.chunks} - {first.request_id}
    assert len(ahead) == FAIR_SHARE  # exactly its share went first
    assert result.text == "ab" and result.timings.preemptions == 0
    assert runner.violations == []


def test_an_online_request_during_a_saturating_batch_starts_within_one_tick_and_every_line_ends_once():
    submitted: dict[str, object] = {}
    ended: list[int] = []
    runner = FakeRunner(n_slots=8, slot_ctx=256, n_batch=64, reply=lambda p: "x" * 12)

    def hook(call: int, plan: StepPlan) -> None:
        if sum(c.is_decode for c in plan.chunks) == 8 and "online" not in submitted:  # every slot busy
            submitted["online"] = engine.submit("online question", params(priority=-1, max_tokens=4))
            submitted["at"] = call

    runner.hook = hook
    engine = engine_over(runner)
    with engine:
        with engine.hold():
            batch = [engine.submit(f"line {i}", params(max_tokens=12),
                                   callback=lambda h, e: ended.append(h.request_id) if hasattr(e, "finish_reason") else None)
                     for i in range(20)]
        online = submitted_result = None
        results = [h.result(timeout=WAIT) for h in batch]
        online = submitted["online"].result(timeout=WAIT)  # type: ignore[attr-defined]
        submitted_result = online
    assert first_plan_of(runner, submitted_result.request_id) == submitted["at"] + 1
    assert sorted(ended) == sorted(h.request_id for h in batch)  # one outcome each
    assert all(r.text == "x" * 12 for r in results)
    assert sum(r.timings.preemptions for r in results) == 1
    assert runner.violations == []


def test_priority_out_of_range_is_that_requests_error():
    runner = FakeRunner(n_slots=1, slot_ctx=64)
    with engine_over(runner) as engine:
        for bad in (1001, -1001):
            try:
                SamplingParams(priority=bad).validate()
            except Exception as exc:
                assert "priority must be an integer in [-1000, 1000]" in str(exc)
            else:
                raise AssertionError(f"priority {bad} was accepted")
        result = engine.submit("ok", SamplingParams(priority=2000, temperature=0)).result(timeout=WAIT)
    assert result.finish_reason == "error" and "priority" in result.error


def test_run_counts_its_preempted_lines_and_the_summary_says_so(tmp_path):
    import json

    from llamabatch.cli.run.job_summary import summary
    from llamabatch.jobs import run_job

    submitted: dict[str, object] = {}
    # 10 ms a tick: run's starter sends the second line while the first one runs
    runner = FakeRunner(n_slots=2, slot_ctx=256, n_batch=64, reply=lambda p: "0123456789abcdef", step_delay=0.01)

    def hook(call: int, plan: StepPlan) -> None:
        if sum(c.is_decode for c in plan.chunks) == 2 and "urgent" not in submitted:  # every slot is busy
            submitted["urgent"] = engine.submit("urgent", params(priority=-1, max_tokens=2))

    runner.hook = hook
    path, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    path.write_text("".join(json.dumps({"id": f"l{i}", "prompt": ["alpha", "bravo"][i], "max_tokens": 16}) + "\n"
                            for i in range(2)))
    with engine_over(runner) as engine:
        report = run_job(str(path), str(out), engine=engine)
        submitted["urgent"].result(timeout=WAIT)  # type: ignore[attr-defined]
    assert report.ok == 2 and report.tokens.preempted == 1 and report.tokens.paused_s > 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in records] == ["0123456789abcdef"] * 2

    class Notes:
        lines: list[str] = []

        def note(self, message: str) -> None:
            self.lines.append(message)

        say = note

    notes = Notes()
    summary(notes, report)  # type: ignore[arg-type]
    assert any("preempted: 1 line(s) waited" in line for line in notes.lines)


def test_a_request_queued_again_takes_its_place_by_arrival_and_the_oldest_stays_the_oldest():
    # A parked request is queued again while the scheduler's record of who arrived first still
    # holds its first entry (the heap drops entries lazily).
    from llamabatch.core.scheduling.scheduler import Scheduler
    from llamabatch.core.sequence import Sequence

    scheduler = Scheduler(1, 64, 64, 16, "decode-maximal", True, lambda t: b"x", lambda t: False)
    older, seq, later = (Sequence(i, [1, 2, 3], SamplingParams(priority=5), seed=1) for i in (0, 1, 2))
    for one in (older, seq, later):
        scheduler.add(one)
    scheduler.waiting.remove(seq)
    scheduler.add(seq)  # its first entry is still in the heap
    assert list(scheduler.waiting) == [older, seq, later]  # by arrival among equals
    assert scheduler.queue.oldest_waiting() is older


def test_a_fair_share_request_keeps_its_rows_while_higher_prompts_arrive_every_tick():
    # Two slots; a priority-0 request with a 40-token prompt (3 chunks of 16) arrives every tick.
    # The priority-5 one is preempted, admitted again by the fair share, and then finishes while
    # the stream goes on: higher prompts' ticks do not leave its rows out.
    handles, last_submit = [], [0]
    runner = FakeRunner(n_slots=2, slot_ctx=256, n_batch=64, reply=lambda p: "abcdef")
    done = threading.Event()

    def hook(call: int, plan: StepPlan) -> None:
        if not done.is_set() and call < 2000:
            handles.append(engine.submit(f"{call:04d}" + "h" * 36, params(priority=0, max_tokens=2)))
            last_submit[0] = call

    runner.hook = hook
    engine = engine_over(runner, n_batch=64, chunk_size=16)
    with engine:
        with engine.hold():
            first = engine.submit("first", params(priority=0, max_tokens=2))
            low = engine.submit("low", params(priority=5, max_tokens=6))
        result = low.result(timeout=WAIT)
        done.set()
        for h in [first, *handles]:
            h.result(timeout=WAIT)
    last_chunk = max(p.call for p in runner.plans if any(c.request_id == result.request_id for c in p.plan.chunks))
    assert result.text == "abcdef"
    assert last_chunk < last_submit[0]  # it finished while higher prompts were still arriving
    assert runner.violations == []


def test_the_fair_share_leaves_alone_a_request_held_back_for_a_prefix_another_slot_evaluates():
    # B shares A's long prefix and waits for A's slot to evaluate it (held back in each
    # admission), while short requests behind it are admitted: the oldest waiting request is B,
    # passed more than FAIR_SHARE times, yet not in the queue during those admissions.
    prefix = "P" * 200
    runner = FakeRunner(n_slots=2, slot_ctx=512, n_batch=32, reply=lambda p: "ok")
    with engine_over(runner, n_batch=32, chunk_size=16, share_prefix_min=8) as engine:
        with engine.hold():
            a = engine.submit(prefix + "a", params(max_tokens=2))
            b = engine.submit(prefix + "b", params(max_tokens=2))
            shorts = [engine.submit(f"s{i}", params(max_tokens=1)) for i in range(FAIR_SHARE + 4)]
        results = [h.result(timeout=WAIT) for h in [a, b, *shorts]]
    assert [r.error for r in results] == [None] * len(results)
    assert [r.text for r in results[:2]] == ["ok", "ok"]
    assert results[1].usage.cached_tokens >= 200  # B still got A's prefix
    assert runner.violations == []


def test_more_admissions_in_one_tick_than_the_fair_share_admit_everyone_in_order():
    # 10 idle slots take 10 requests in one admission: those already admitted (not yet started)
    # are not "the oldest waiting request" that the fair share would move.
    runner = FakeRunner(n_slots=10, slot_ctx=64, n_batch=256, reply=lambda p: "ok")
    with engine_over(runner, n_batch=256) as engine:
        with engine.hold():
            handles = [engine.submit(f"r{i}", params(max_tokens=2)) for i in range(12)]
        results = [h.result(timeout=WAIT) for h in handles]
    assert [r.error for r in results] == [None] * 12 and all(r.text == "ok" for r in results)
    first = [first_plan_of(runner, r.request_id) for r in results]
    assert first[:10] == [1] * 10 and min(first[10:]) > 1
    assert runner.violations == []


def test_parked_kv_past_its_budget_is_dropped_and_the_request_evaluated_again():
    runner = FakeRunner(n_slots=1, slot_ctx=256, n_batch=64, reply=lambda p: "0123456789")
    runner.capabilities = replace(runner.capabilities, kv_mib=1e-9)  # the engine's budget for parked KV is the KV cache's size: here 0 bytes

    engine, submitted = urgent_at_first_decode(runner, params(priority=-2, max_tokens=3))
    with engine:
        low = engine.submit("low", params(max_tokens=10)).result(timeout=WAIT)
        submitted["high"].result(timeout=WAIT)  # type: ignore[attr-defined]
        assert engine.scheduler.parked_bytes == 0
    assert low.text == "0123456789" and low.timings.preemptions == 1
    assert runner.snapshots and not runner.restores  # copied, over budget, dropped: evaluated again
    assert runner.violations == []


def test_a_parked_request_cancelled_while_it_waits_gives_its_bytes_back():
    runner = FakeRunner(n_slots=1, slot_ctx=256, n_batch=64, reply=lambda p: "0123456789" * 3, step_delay=0.002)

    engine, submitted = urgent_at_first_decode(runner, params(priority=-2, max_tokens=20))
    with engine:
        low = engine.submit("low", params(max_tokens=30))
        while engine.stats().preemptions == 0:
            threading.Event().wait(0.001)
        threading.Event().wait(0.02)  # a pause long enough to see
        low.cancel()
        cancelled = low.result(timeout=WAIT)
        assert cancelled.finish_reason == "cancelled"
        submitted["high"].result(timeout=WAIT)  # type: ignore[attr-defined]
        assert engine.scheduler.parked_bytes == 0
    # the pause it had is reported, as for a request that resumed
    assert cancelled.timings.preemptions == 1 and cancelled.timings.paused_ms >= 20
    assert runner.violations == []
