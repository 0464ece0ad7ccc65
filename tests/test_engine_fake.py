"""The engine's tick loop against the scripted FakeRunner: threads, queue, cancel, timeout,
decode failures, close, and one terminal outcome per request. No model."""
from __future__ import annotations

import threading
import time

import pytest

from llamabatch import (Delta, Engine, EngineClosed, EngineConfig, QueueFull, RequestRecord, Result, SamplingParams, TickRecord)

from fake_runner import FILL, FakeRunner, text_tokens

GREEDY = SamplingParams(temperature=0, max_tokens=64)
WAIT = 10  # seconds a test may wait for the engine before calling it hung


def make_engine(runner: FakeRunner, **config) -> Engine:
    cfg = dict(n_parallel=runner.n_slots, n_batch=64, chunk_size=16, max_queue=0)
    cfg.update(config)
    if runner.n_batch is None:
        runner.n_batch = cfg["n_batch"]
    return Engine(EngineConfig(**cfg), runner=runner, default_params=GREEDY)


def wait_until(predicate, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


class Gate:
    """Blocks execute() call number `at` until the test opens the gate."""

    def __init__(self, at: int = 1):
        self.at = at
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, call: int, plan) -> None:
        if call == self.at:
            self.entered.set()
            assert self.release.wait(WAIT), "gate never released"

    def wait_entered(self) -> None:
        assert self.entered.wait(WAIT), "engine never reached the gate"


def assert_clean(runner: FakeRunner) -> None:
    assert runner.violations == []


# -- the basics ------------------------------------------------------------------------------

def test_generate_returns_scripted_replies_in_input_order():
    # later prompts get shorter replies, so they finish first
    runner = FakeRunner(n_slots=3, slot_ctx=200, reply=lambda p: "r" * (40 - len(p)))
    with make_engine(runner) as engine:
        prompts = [f"p{'x' * i}" for i in range(10)]
        results = engine.generate(prompts)
    assert [r.text for r in results] == ["r" * (40 - len(p)) for p in prompts]
    assert all(r.finish_reason == "stop" and r.ok for r in results)
    assert [r.request_id for r in results] == sorted(r.request_id for r in results)
    assert [r.usage.prompt_tokens for r in results] == [len(p) for p in prompts]
    assert [r.usage.completion_tokens for r in results] == [40 - len(p) for p in prompts]
    assert_clean(runner)


def test_each_tick_is_one_execute_mixing_decode_tokens_and_prefill_chunks():
    # the first tick waits until all four are submitted: on a loaded machine the submitting
    # thread could otherwise lose the CPU between submits while a fake tick takes microseconds,
    # and each request would run alone (seen once in a whole-suite run)
    gate = Gate(at=1)
    runner = FakeRunner(n_slots=4, slot_ctx=200, reply=lambda p: "abcdefgh", hook=gate)
    with make_engine(runner, n_batch=16, chunk_size=8) as engine:
        handles = [engine.submit(p) for p in ["a" * 30, "b" * 30]]
        gate.wait_entered()
        handles += [engine.submit(p) for p in ["c" * 5, "d" * 5]]
        gate.release.set()
        results = [h.result(WAIT) for h in handles]
        # the last tick's record lands just after its results are delivered: wait for it
        deadline = time.monotonic() + WAIT
        while len(engine.telemetry.recent_ticks) < runner.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        ticks = list(engine.telemetry.recent_ticks)
    assert all(r.text == "abcdefgh" for r in results)
    assert len(ticks) == runner.calls == len(runner.plans)
    mixed = [p for p in runner.plans if p.plan.decode_tokens and p.plan.prefill_tokens]
    assert mixed, "no tick mixed decode tokens with prefill chunks"
    for p in runner.plans:
        assert p.plan.n_tokens <= 16
        assert p.plan.decode_tokens <= 4
        assert all(len(c.tokens) <= 8 for c in p.plan.chunks)
    assert_clean(runner)


def test_request_arriving_while_others_generate_joins_at_the_next_tick():
    box = {}

    def hook(call, plan):
        if call == 4:  # A is generating: submit B from "outside" while this tick runs
            box["b"] = box["engine"].submit("late", SamplingParams(temperature=0, max_tokens=3))

    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p: "z" * 20, hook=hook)
    with make_engine(runner) as engine:
        box["engine"] = engine
        a = engine.submit("early", SamplingParams(temperature=0, max_tokens=12))
        ra, rb = a.result(WAIT), box["b"].result(WAIT)
    assert ra.text == "z" * 12 and rb.text == "zzz"
    nxt = runner.plans[4].plan  # call 5
    kinds = {(c.request_id, c.is_decode) for c in nxt.chunks}
    assert kinds == {(a.request_id, True), (box["b"].request_id, False)}
    assert_clean(runner)


def test_streamed_deltas_join_to_the_final_text_and_tokens():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p: "héllo wörld END tail")
    with make_engine(runner) as engine:
        h = engine.submit("x", GREEDY.replace(stop=["END"]))
        deltas = list(h)
        r = h.result(WAIT)
    assert all(isinstance(d, Delta) for d in deltas)
    assert "".join(d.text for d in deltas) == r.text == "héllo wörld "
    assert [t for d in deltas for t in d.token_ids] == r.token_ids
    assert r.stop == "END" and r.finish_reason == "stop"


def test_pre_tokenized_prompt_and_chat_messages():
    runner = FakeRunner(n_slots=2, slot_ctx=400, reply=lambda p: f"[{len(p)}]")
    with make_engine(runner) as engine:
        r1 = engine.submit(text_tokens("hello")).result(WAIT)
        messages = [{"role": "user", "content": "hi"}]
        rendered = engine.render_chat(messages)
        r2 = engine.submit(messages).result(WAIT)
    assert r1.ok and r1.text == "[5]" and r1.usage.prompt_tokens == 5
    assert "hi" in rendered
    assert r2.ok and r2.text == f"[{len(rendered)}]"


def test_prefix_cache_reports_cached_tokens_and_respects_unsupported_trims():
    for partial, expect_cached in ((True, True), (False, False)):
        runner = FakeRunner(n_slots=1, slot_ctx=400, reply=lambda p: "ok", partial_trim=partial)
        with make_engine(runner) as engine:
            base = "The shared part of the prompt. "
            engine.submit(base).result(WAIT)
            r = engine.submit(base + "More.").result(WAIT)
        if expect_cached:
            # the first request's prompt and fed-back "o" are cached; one "k" was sampled only
            assert r.usage.cached_tokens == len(base)
        else:
            assert r.usage.cached_tokens == 0
        assert r.text == "ok"
        assert_clean(runner)


def test_min_tokens_and_ignore_eos_keep_generating():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p: "ab")
    with make_engine(runner) as engine:
        r_min = engine.submit("x", GREEDY.replace(min_tokens=5)).result(WAIT)
        r_ign = engine.submit("x", GREEDY.replace(ignore_eos=True, max_tokens=6)).result(WAIT)
        r_plain = engine.submit("x").result(WAIT)
    assert r_min.text == "ab" + chr(FILL) * 3 and r_min.finish_reason == "stop"
    assert r_ign.text == "ab" + chr(FILL) * 4 and r_ign.finish_reason == "length"
    assert r_plain.text == "ab" and r_plain.finish_reason == "stop"


def test_logprobs_are_collected_only_when_asked():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p: "abc")
    with make_engine(runner) as engine:
        with_lp = engine.submit("x", GREEDY.replace(logprobs=2))
        without = engine.submit("y")
        r1, r2 = with_lp.result(WAIT), without.result(WAIT)
    assert [lp["id"] for lp in r1.logprobs] == text_tokens("abc")
    assert r2.logprobs is None


# -- cancel, timeout, queue ----------------------------------------------------------------------

def test_cancel_while_queued_never_reaches_a_slot():
    gate = Gate(at=1)
    runner = FakeRunner(n_slots=1, slot_ctx=200, reply=lambda p: "abc", hook=gate)
    with make_engine(runner) as engine:
        a = engine.submit("first")
        gate.wait_entered()
        b = engine.submit("second")
        b.cancel()
        gate.release.set()
        ra, rb = a.result(WAIT), b.result(WAIT)
        stats = engine.stats()
    assert ra.text == "abc"
    assert rb.finish_reason == "cancelled" and rb.text == "" and rb.usage.completion_tokens == 0
    assert runner.plans_with(b.request_id) == []
    assert stats.queue_depth == 0 and stats.cancelled == 1


def test_cancel_while_running_frees_the_slot_for_the_next_request():
    seen = threading.Event()

    def on_item(handle, item):
        if isinstance(item, Delta) and len(item.text) and handle.request_id == 0:
            seen.set()

    runner = FakeRunner(n_slots=1, slot_ctx=10_000, reply=lambda p: "y" * 5000, step_delay=0.001)
    with make_engine(runner) as engine:
        long = engine.submit("long", GREEDY.replace(max_tokens=5000), callback=on_item)
        queued = engine.submit("next", GREEDY.replace(max_tokens=3))
        assert seen.wait(WAIT)
        long.cancel()
        r_long = long.result(WAIT)
        r_next = queued.result(WAIT)
        streamed = "".join(d.text for d in long)
    assert r_long.finish_reason == "cancelled"
    assert 0 < len(r_long.text) < 5000 and streamed == r_long.text
    assert r_next.text == "yyy" and r_next.finish_reason == "length"
    assert_clean(runner)


def test_timeout_while_running_and_while_queued():
    runner = FakeRunner(n_slots=1, slot_ctx=100_000, reply=lambda p: "y" * 50_000, step_delay=0.002)
    with make_engine(runner) as engine:
        running = engine.submit("a", GREEDY.replace(max_tokens=50_000, timeout=0.2))
        queued = engine.submit("b", GREEDY.replace(timeout=0.05))
        r_run, r_queued = running.result(WAIT), queued.result(WAIT)
        stats = engine.stats()
    assert r_run.finish_reason == "timeout" and 0 < r_run.usage.completion_tokens < 50_000
    assert r_queued.finish_reason == "timeout" and r_queued.usage.completion_tokens == 0
    assert stats.timed_out == 2 and stats.queue_depth == 0


def test_full_queue_rejects_at_once_and_the_rest_still_finish():
    gate = Gate(at=1)
    runner = FakeRunner(n_slots=1, slot_ctx=200, reply=lambda p: "ok", hook=gate)
    with make_engine(runner, max_queue=2) as engine:
        a = engine.submit("a")
        gate.wait_entered()  # a holds the only slot
        b, c = engine.submit("b"), engine.submit("c")
        with pytest.raises(QueueFull):
            engine.submit("d")
        assert engine.stats().queue_depth == 2
        gate.release.set()
        results = [h.result(WAIT) for h in (a, b, c)]
        e = engine.submit("e").result(WAIT)  # room again
        stats = engine.stats()
    assert [r.text for r in results] == ["ok"] * 3 and e.text == "ok"
    assert stats.submitted == 4 and stats.finished == 4


def test_max_queue_counts_only_requests_beyond_the_free_slots():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p: "ok")
    with make_engine(runner, max_queue=1) as engine:
        # hold() keeps the engine thread from admitting anything meanwhile: the submits
        # below all happen before any slot is handed out, as in a fast caller.
        with engine.hold():
            handles = [engine.submit(x) for x in "abc"]  # two take the idle slots, one waits
            with pytest.raises(QueueFull):
                engine.submit("d")
        assert [h.result(WAIT).text for h in handles] == ["ok"] * 3


def test_generate_waits_for_room_in_a_bounded_queue():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p: p.upper())
    with make_engine(runner, max_queue=1) as engine:
        results = engine.generate([f"q{i}" for i in range(9)])
    assert [r.text for r in results] == [f"Q{i}" for i in range(9)]


# -- llama_decode failures ---------------------------------------------------------------------

def test_decode_status_1_defers_prefill_then_halves_and_nothing_fails():
    def status(call, plan):
        # 'no KV room' for any plan that mixes prefill into a decode batch, and for the
        # first all-decode plan with more than two chunks
        if plan.decode_tokens and plan.prefill_tokens:
            return 1 if call % 2 == 0 else 0
        if plan.decode_tokens > 2 and not status.halved:
            status.halved = True
            return 1
        return 0

    status.halved = False
    runner = FakeRunner(n_slots=4, slot_ctx=300, reply=lambda p: "0123456789", status=status)
    with make_engine(runner, n_batch=32, chunk_size=8) as engine:
        results = engine.generate([f"prompt number {i}" for i in range(10)])
    assert [r.finish_reason for r in results] == ["stop"] * 10
    assert all(r.text == "0123456789" for r in results)
    failed = [i for i, p in enumerate(runner.plans) if p.status == 1]
    assert failed
    for i in failed:
        bad, retry = runner.plans[i].plan, runner.plans[i + 1].plan
        if bad.decode_tokens and bad.prefill_tokens:
            assert retry.prefill_tokens == 0 and retry.decode_tokens == bad.decode_tokens
        else:
            assert len(retry.chunks) == len(bad.chunks) // 2
    assert status.halved
    assert_clean(runner)


def test_decode_status_1_on_a_single_chunk_fails_only_that_request():
    runner = FakeRunner(n_slots=1, slot_ctx=300, reply=lambda p: "fine",
                        status=lambda call, plan: 1 if plan.chunks[0].request_id == 1 else 0)
    with make_engine(runner) as engine:
        results = engine.generate(["a", "b", "c"])
    assert [r.finish_reason for r in results] == ["stop", "error", "stop"]
    assert results[1].error_code == "decode_error" and "KV" in results[1].error
    assert results[0].text == results[2].text == "fine"
    assert_clean(runner)


def test_decode_failure_fails_only_that_batch_and_the_engine_keeps_serving():
    def status(call, plan):
        if len(plan.chunks) == 2 and not status.failed:
            status.failed = call
            return -3
        return 0

    status.failed = 0
    runner = FakeRunner(n_slots=2, slot_ctx=300, reply=lambda p: "abcdef", status=status)
    with make_engine(runner) as engine:
        with engine.hold():  # a and b start in the same tick, so one plan holds exactly their two chunks
            handles = [engine.submit(x) for x in "abc"]  # c waits for a slot
        results = {h.request_id: h.result(WAIT) for h in handles}
        rd = engine.submit("d").result(WAIT)
        stats = engine.stats()
    failed_plan = runner.plans[status.failed - 1]
    batch = {ch.request_id for ch in failed_plan.plan.chunks}
    assert failed_plan.status == -3 and len(batch) == 2
    for rid, r in results.items():
        if rid in batch:
            assert r.finish_reason == "error" and r.error_code == "decode_error"
            assert "llama_decode returned -3" in r.error and "\n" not in r.error
        else:
            assert r.text == "abcdef"
    assert rd.text == "abcdef"
    # the failed slots' caches were emptied by trims the next plan carried, before its chunks,
    # so nothing stale is reused (the fake flags a chunk on a slot a failed decode left unknown)
    next_plan = runner.plans[status.failed].plan
    assert {ch.slot for ch in failed_plan.plan.chunks} <= {t.slot for t in next_plan.trims if t.n_keep == 0}
    assert not runner.stale
    assert stats.failed == 2 and stats.finished == 2
    assert_clean(runner)


# -- bad input -----------------------------------------------------------------------------------

def test_a_prompt_too_long_by_its_bytes_fails_without_being_tokenized():
    # llama.cpp tokenizes long runs of spaces in about quadratic time, so a 16 MB
    # cell stalled every other row; more bytes than a slot of the longest tokens can spell is
    # context_overflow before tokenizing (the fake's tokens are one character, 4 bytes at most)
    runner = FakeRunner(n_slots=2, slot_ctx=50, reply=lambda p: "ok")
    with make_engine(runner) as engine:
        huge = engine.submit(" " * 8_000_000)
        chat = engine.submit([{"role": "user", "content": "x" * 1_000_000}])
        edge = engine.submit("é" * 100)  # 200 bytes = 4 x 50: tokenized, then too long by its tokens
        good = engine.generate(["fine"])
    for handle in (huge, chat, edge):
        result = handle.result(0)
        assert result.error_code == "context_overflow" and "\n" not in result.error, result
    assert "bytes" in huge.result().error and "bytes" not in edge.result().error
    assert runner.tokenized_chars < 10_000  # the two long prompts were never tokenized
    assert [r.text for r in good] == ["ok"]


def test_bad_requests_end_at_once_with_an_error_and_others_are_unaffected():
    runner = FakeRunner(n_slots=2, slot_ctx=50, reply=lambda p: "ok")
    with make_engine(runner) as engine:
        bad = {
            "empty": engine.submit(""),
            "empty_ids": engine.submit([]),
            "too_long": engine.submit("x" * 50),
            "bad_param": engine.submit("hi", SamplingParams(max_tokens=-1)),
            "top_p": engine.submit("hi", SamplingParams(top_p=1.5)),
            "grammar": engine.submit("hi", SamplingParams(grammar="BAD")),
            "bad_ids": engine.submit([1, -5]),
            "bad_type": engine.submit(12345),  # type: ignore[arg-type]
            "bad_chat": engine.submit([{"role": "wizard", "content": "x"}]),
        }
        good = engine.generate(["fine", "x" * 49])
    for name, h in bad.items():
        assert h.done, name
        r = h.result(0)
        assert r.finish_reason == "error", name
        assert r.error and "\n" not in r.error, name
        assert r.error_code in ("invalid_request", "context_overflow"), name
    assert bad["too_long"].result().error_code == "context_overflow"
    assert "max_tokens" in bad["bad_param"].result().error
    assert [r.text for r in good] == ["ok", "o"]  # 49 + 1 tokens fill the 50-token slot
    assert [r.finish_reason for r in good] == ["stop", "length"]
    # a rejected request never built a sampler that leaks
    assert all(s.freed == 1 for s in runner.samplers)


def test_generate_rejects_mismatched_params_list():
    runner = FakeRunner()
    with make_engine(runner) as engine:
        with pytest.raises(ValueError):
            engine.generate(["a", "b"], [GREEDY])


# -- outcomes, close ------------------------------------------------------------------------------

def test_every_request_gets_exactly_one_terminal_outcome():
    calls: dict[int, list] = {}
    lock = threading.Lock()

    def on_item(handle, item):
        with lock:
            calls.setdefault(handle.request_id, []).append(item)

    runner = FakeRunner(n_slots=3, slot_ctx=120, reply=lambda p: "r" * (len(p) * 3), step_delay=0.0005)
    with make_engine(runner, max_queue=0) as engine:
        handles = []
        for i in range(30):
            kind = i % 5
            if kind == 0:
                handles.append(engine.submit("", callback=on_item))  # error
            elif kind == 1:
                handles.append(engine.submit("c" * (i + 1), callback=on_item))
            elif kind == 2:
                handles.append(engine.submit("t" * 10, GREEDY.replace(ignore_eos=True, max_tokens=100, timeout=0.01),
                                             callback=on_item))
            else:
                handles.append(engine.submit("g" * i, GREEDY.replace(max_tokens=20), callback=on_item))
        for h in handles[1::5]:
            h.cancel()
            h.cancel()  # twice is harmless
        results = [h.result(WAIT) for h in handles]
    for h, r in zip(handles, results):
        items = calls[h.request_id]
        finals = [x for x in items if isinstance(x, Result)]
        assert len(finals) == 1 and items[-1] is finals[0] and finals[0] is r
        assert "".join(x.text for x in items if isinstance(x, Delta)) == r.text
        assert r.finish_reason in ("stop", "length", "cancelled", "error", "timeout")
    reasons = [r.finish_reason for r in results]
    assert reasons[0::5] == ["error"] * 6
    assert set(reasons[2::5]) <= {"timeout", "length"}
    assert all(s.freed == 1 for s in runner.samplers)
    assert_clean(runner)


def test_close_with_requests_in_flight_cancels_all_and_frees_the_runner_once():
    runner = FakeRunner(n_slots=2, slot_ctx=100_000, reply=lambda p: "w" * 50_000, step_delay=0.001)
    engine = make_engine(runner)
    handles = [engine.submit(f"p{i}", GREEDY.replace(max_tokens=50_000)) for i in range(6)]
    wait_until(lambda: runner.calls > 5)
    engine.close()
    results = [h.result(0) for h in handles]  # already finished: no waiting
    assert [r.finish_reason for r in results] == ["cancelled"] * 6
    assert any(r.usage.completion_tokens > 0 for r in results)
    assert runner.close_calls == 1
    engine.close()
    with engine:
        pass  # __exit__ closes again
    assert runner.close_calls == 1
    with pytest.raises(EngineClosed):
        engine.submit("late")
    assert all(s.freed == 1 for s in runner.samplers)
    # iterating a finished handle replays its deltas and ends (never blocks)
    assert ["".join(d.text for d in h) for h in handles] == [r.text for r in results]


def test_close_on_an_idle_engine_and_from_a_callback():
    runner = FakeRunner()
    engine = make_engine(runner)
    engine.close()
    assert runner.close_calls == 1

    runner2 = FakeRunner(reply=lambda p: "x" * 1000)
    engine2 = make_engine(runner2)
    got = []

    def close_on_first(handle, item):
        if not got:
            got.append(item)
            engine2.close()  # from the engine thread: must not deadlock

    h = engine2.submit("a", GREEDY.replace(max_tokens=1000), callback=close_on_first)
    assert h.result(WAIT).finish_reason == "cancelled"
    engine2.close()
    assert runner2.close_calls == 1


def test_a_failing_callback_does_not_stop_the_engine():
    runner = FakeRunner(reply=lambda p: "abc")

    def boom(handle, item):
        raise RuntimeError("caller bug")

    with make_engine(runner) as engine:
        h = engine.submit("x", callback=boom)
        assert h.result(WAIT).text == "abc"
        assert engine.submit("y").result(WAIT).text == "abc"


# -- telemetry and stats -------------------------------------------------------------------------

def test_telemetry_records_are_sane_and_subscribers_get_them():
    records = []
    runner = FakeRunner(n_slots=4, slot_ctx=300, reply=lambda p: "x" * 12)
    with make_engine(runner, n_batch=24, chunk_size=8) as engine:
        unsubscribe = engine.subscribe(records.append)
        results = engine.generate([f"prompt {i} " * (i + 1) for i in range(9)])
        unsubscribe()
        engine.generate(["after"])
        ticks = list(engine.telemetry.recent_ticks)
        stats = engine.stats()
    tick_records = [r for r in records if isinstance(r, TickRecord)]
    req_records = [r for r in records if isinstance(r, RequestRecord)]
    # the subscriber saw the ticks in order until it unsubscribed, and none of the "after"
    # request's (the last tick of the first batch may be recorded just after unsubscribing)
    assert tick_records and ticks[:len(tick_records)] == tick_records
    after_id = results[-1].request_id + 1
    first_after = min(i for i, p in enumerate(runner.plans) if any(c.request_id == after_id for c in p.plan.chunks))
    assert len(tick_records) <= first_after < len(ticks)
    for t in ticks:
        assert t.batch_size == t.decode_tokens + t.prefill_tokens
        assert 0 < t.batch_size <= 24
        assert t.decode_tokens <= 4 and t.active_slots <= 4
        assert t.eval_ms >= 0 and t.sample_ms >= 0 and t.overhead_ms >= 0
        assert t.wall_ms + 1e-6 >= t.overhead_ms
        assert set(t.to_dict()) >= {"batch_size", "decode_tokens", "prefill_tokens", "eval_ms", "overhead_ms"}
    assert [r.kind for r in req_records].count("start") == 9
    done = [r for r in req_records if r.kind == "done"]
    assert len(done) == 9 and all(r.usage.completion_tokens == 12 for r in done)
    assert stats.finished == 10 and stats.generated_tokens == 120
    assert stats.slots_idle == 4 and stats.queue_depth == 0 and stats.ticks == len(ticks)
    assert sum(r.usage.prompt_tokens for r in results) + len("after") == stats.prompt_tokens


def test_timings_are_ordered_and_non_negative():
    runner = FakeRunner(reply=lambda p: "abcdef", step_delay=0.001)
    with make_engine(runner) as engine:
        r = engine.submit("hello").result(WAIT)
    t = r.timings
    assert t.queue_ms >= 0 and t.prompt_ms >= 0 and t.decode_ms > 0
    assert t.ttft_ms >= t.queue_ms
    assert t.generated_tokens_per_s > 0
    assert isinstance(r.seed, int)


def test_a_runner_crash_fails_everything_in_flight_once_and_closes_the_engine():
    def hook(call, plan):
        if call == 3:
            raise RuntimeError("simulated crash inside the runner")

    runner = FakeRunner(n_slots=2, slot_ctx=300, reply=lambda p: "z" * 50, hook=hook)
    engine = make_engine(runner)
    with engine.hold():  # all four are in before the engine thread can tick (and crash)
        handles = [engine.submit(f"p{i}") for i in range(4)]
    results = [h.result(WAIT) for h in handles]
    assert {r.finish_reason for r in results} <= {"error", "cancelled"}
    failed = [r for r in results if r.finish_reason == "error"]
    assert failed and all("simulated crash" in r.error and r.error_code == "engine_error" for r in failed)
    with pytest.raises(EngineClosed):
        engine.submit("after")
    engine.close()
    assert runner.close_calls == 1
    assert all(s.freed == 1 for s in runner.samplers)


# -- defects a close read found (each test failed before its fix) --------------------------------

def test_a_request_refused_at_submit_is_counted_and_reported_on_the_engine_thread():
    # The telemetry totals and subscribers belong to the engine thread (the docs say so): a bad
    # request recorded on the caller's thread would race the engine's updates.
    seen = []
    runner = FakeRunner(reply=lambda p: "ok")
    with make_engine(runner) as engine:
        engine.subscribe(lambda rec: seen.append((rec, threading.current_thread())))
        on_result = []
        h = engine.submit("", callback=lambda handle, item: on_result.append(threading.current_thread()))
        r = h.result(WAIT)
        assert engine.submit("fine").result(WAIT).text == "ok"
        stats = engine.stats()
    assert r.finish_reason == "error" and r.error_code == "invalid_request"
    refused = [(rec, t) for rec, t in seen if isinstance(rec, RequestRecord) and rec.request_id == h.request_id]
    assert [rec.kind for rec, _ in refused] == ["exception"]
    assert refused[0][1] is engine._thread and on_result == [engine._thread]
    assert stats.submitted == 2 and stats.failed == 1 and stats.finished == 1


def test_a_submit_that_meets_close_half_way_is_not_counted():
    class ClosingRunner(FakeRunner):
        engine = None

        def build_sampler(self, params, seed):
            sampler = super().build_sampler(params, seed)
            self.engine.close()  # close() lands while submit is between its two checks
            return sampler

    runner = ClosingRunner()
    engine = make_engine(runner)
    runner.engine = engine
    with pytest.raises(EngineClosed):
        engine.submit("late")
    assert engine.stats().submitted == 0  # the QueueFull path already undid its count; so must this
    assert [s.freed for s in runner.samplers] == [1]


def test_sequence_has_no_write_only_cancel_flag():
    # Sequence.cancel_requested was set by cancel() and read nowhere: the engine's cancel
    # queue is what ends a request. State nobody reads only misleads the next reader.
    import dataclasses

    from llamabatch.core.sequence import Sequence

    assert "cancel_requested" not in {f.name for f in dataclasses.fields(Sequence)}


def test_the_plan_carries_each_rows_sampler_and_logprobs_so_execute_needs_nothing_else():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=lambda p: "abc")
    assert not hasattr(runner, "attach")  # no side channel: the fake has only execute(plan)
    with make_engine(runner) as engine:
        with engine.hold():
            a = engine.submit("x", GREEDY.replace(logprobs=2))
            b = engine.submit("y")
        ra, rb = a.result(WAIT), b.result(WAIT)
    assert len(ra.logprobs) == 3 and rb.logprobs is None
    by_request = {}
    for p in runner.plans:
        for c in p.plan.chunks:
            if c.wants_logits:
                by_request.setdefault(c.request_id, set()).add((id(c.sampler), c.logprobs))
    samplers = {s.prompt_text: s for s in runner.samplers}
    assert by_request[a.request_id] == {(id(samplers["x"]), 2)}
    assert by_request[b.request_id] == {(id(samplers["y"]), None)}
    assert_clean(runner)


def test_stats_carry_every_running_total():
    import dataclasses

    from llamabatch.core.telemetry import Totals

    runner = FakeRunner(reply=lambda p: "abc")
    with make_engine(runner) as engine:
        engine.generate(["one", "two"])
        stats, totals = engine.stats(), engine.telemetry.totals
    for f in dataclasses.fields(Totals):
        assert getattr(stats, f.name) == getattr(totals, f.name), f.name
    assert stats.to_dict()["decode_tokens"] == totals.decode_tokens > 0
    assert stats.n_parallel == 4 and stats.slots_idle == 4
