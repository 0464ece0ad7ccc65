"""Sampling apart from the tick (llamabatch/core/sampling_threads.py) against the scripted FakeRunner: a request
whose sampling is slow (a costly grammar) does not hold up the others, and cancel, timeout,
close and failures still give it exactly one outcome, with its sampler freed only after the
sampling thread is done with it. No model."""
from __future__ import annotations

import threading
import time

from llamabatch import Delta, SamplingParams
from llamabatch.core.sampling_threads import SamplingThreads
from llamabatch.core.plan import SampleStopped

from fake_runner import FakeRunner
from test_engine_fake import GREEDY, WAIT, assert_clean, make_engine, wait_until

GRAMMAR = 'root ::= [a-z]+'  # the fake runner takes any grammar but "BAD"; only its presence matters here
SLOW = GREEDY.replace(grammar=GRAMMAR)


def slow_runner(seconds: float, **kw) -> FakeRunner:
    """Prompts starting with "slow" take `seconds` to sample each token; the rest take none."""
    return FakeRunner(n_slots=4, slot_ctx=200, sample_delay=lambda ctx: seconds if ctx.startswith("slow") else 0.0,
                      **kw)


def run_beside_slow(runner: FakeRunner) -> list[tuple[str, int]]:
    """A slow grammar request and three plain ones admitted in one tick; what came out, in order."""
    order: list[tuple[str, int]] = []

    def note(handle, item) -> None:
        order.append(("token" if isinstance(item, Delta) else "done", handle.request_id))

    with make_engine(runner) as engine:
        with engine.hold():
            slow = engine.submit("slow: spell", SLOW, callback=note)
            plain = [engine.submit(f"plain {i}", GREEDY, callback=note) for i in range(3)]
        results = [h.result(timeout=WAIT) for h in [slow, *plain]]
    assert [r.text for r in results] == ["slow: spell!"] + [f"plain {i}!" for i in range(3)]
    assert all(r.finish_reason == "stop" for r in results)
    return order


def test_plain_requests_finish_while_a_slow_grammar_samples_its_first_token():
    # its first token takes 2 s (the row's context is the prompt alone): far longer than the
    # plain requests' few ticks, even on a busy machine
    runner = FakeRunner(n_slots=4, slot_ctx=200, sample_delay=lambda ctx: 2.0 if ctx == "slow: spell" else 0.0)
    order = run_beside_slow(runner)
    slow_first = order.index(("token", 0))
    # every plain request ends before the slow one has its first token: no tick waited for it
    assert all(order.index(("done", i)) < slow_first for i in (1, 2, 3))
    assert runner.jobs and all(job.chunk.request_id == 0 for job in runner.jobs)  # only the grammar went apart
    assert_clean(runner)


def test_sampled_inline_the_slow_request_sets_everyones_pace():
    # The same run where the runner cannot sample apart (every row inline): the reproducer.
    runner = slow_runner(0.05, can_sample_apart=False)
    order = run_beside_slow(runner)
    assert order.index(("token", 0)) < min(order.index(("done", i)) for i in (1, 2, 3))
    assert runner.jobs == []
    assert_clean(runner)


def test_the_others_keep_ticking_while_a_token_is_in_flight():
    runner = slow_runner(30.0)
    with make_engine(runner) as engine:
        slow = engine.submit("slow: spell", SLOW)
        wait_until(lambda: 0 in runner.flying)
        calls = runner.calls
        plain = engine.submit("plain", GREEDY.replace(max_tokens=20, ignore_eos=True))
        assert plain.result(timeout=WAIT).usage.completion_tokens == 20
        assert runner.calls - calls >= 20  # a tick per token, the slow slot skipping each
        assert not slow.done
        slow.cancel()
        assert slow.result(timeout=WAIT).finish_reason == "cancelled"
    assert_clean(runner)


def test_cancel_while_sampling_ends_at_once_and_frees_the_sampler_after_the_thread():
    runner = slow_runner(30.0)
    with make_engine(runner) as engine:
        slow = engine.submit("slow: spell", SLOW)
        wait_until(lambda: 0 in runner.flying)
        t0 = time.monotonic()
        slow.cancel()
        result = slow.result(timeout=WAIT)
        assert result.finish_reason == "cancelled" and time.monotonic() - t0 < 5
        wait_until(lambda: 0 not in runner.flying)  # the job saw the stop between slices
        job = runner.jobs[0]
        assert job.stopped
        wait_until(lambda: job.samplers[0].freed == 1)  # freed once, after the job returned
        # the slot serves the next request
        assert engine.generate(["next"])[0].text == "next!"
    assert_clean(runner)


def test_timeout_reaches_a_request_whose_token_is_in_flight():
    runner = slow_runner(30.0)
    with make_engine(runner) as engine:
        t0 = time.monotonic()
        result = engine.submit("slow: spell", SLOW.replace(timeout=0.3)).result(timeout=WAIT)
        assert result.finish_reason == "timeout" and time.monotonic() - t0 < 5
    assert runner.jobs[0].stopped and runner.jobs[0].samplers[0].freed == 1
    assert_clean(runner)


def test_close_with_a_token_in_flight_cancels_it_and_waits_for_the_thread():
    runner = slow_runner(30.0)
    engine = make_engine(runner)
    slow = engine.submit("slow: spell", SLOW)
    wait_until(lambda: 0 in runner.flying)
    t0 = time.monotonic()
    engine.close()
    assert time.monotonic() - t0 < 5
    assert slow.result(timeout=WAIT).finish_reason == "cancelled"
    assert runner.flying == {} and runner.jobs[0].samplers[0].freed == 1
    assert runner.close_calls == 1
    assert_clean(runner)


def test_a_sampling_failure_is_that_requests_error_only():
    def delay(ctx: str) -> float:
        if ctx.startswith("slow"):
            raise RuntimeError("planted sampler failure")
        return 0.0

    runner = FakeRunner(n_slots=4, slot_ctx=200, sample_delay=delay)
    with make_engine(runner) as engine:
        bad = engine.submit("slow: spell", SLOW)
        good = engine.submit("fine", GREEDY.replace(grammar=GRAMMAR))
        bad_result, good_result = bad.result(timeout=WAIT), good.result(timeout=WAIT)
    assert bad_result.finish_reason == "error" and bad_result.error_code == "internal_error"
    assert "planted sampler failure" in bad_result.error
    assert good_result.text == "fine!" and good_result.finish_reason == "stop"
    assert runner.jobs[0].samplers[0].freed == 1
    assert_clean(runner)


def test_n_samples_with_a_grammar_take_their_first_tokens_apart_and_fork_as_inline():
    runner = FakeRunner(n_slots=4, slot_ctx=200, reply=lambda prompt, seed: f"{prompt}:{seed}")
    with make_engine(runner) as engine:
        result = engine.submit("hi", GREEDY.replace(n=3, seed=7, grammar=GRAMMAR)).result(timeout=WAIT)
    assert [s.text for s in result.samples] == ["hi:7", "hi:8", "hi:9"]
    assert len(runner.forks) == 2  # sample 0's prompt copied into the two other slots
    first = runner.jobs[0]
    assert len(first.samplers) == 3  # one row, three chains
    assert_clean(runner)


def test_the_engine_thread_sleeps_while_only_a_token_in_flight_is_left():
    runner = slow_runner(1.0)
    with make_engine(runner) as engine:
        handle = engine.submit("slow: spell", SLOW.replace(max_tokens=1))
        wait_until(lambda: 0 in runner.flying)
        engine_thread = engine._thread
        busy0 = time.process_time()
        assert handle.result(timeout=WAIT).finish_reason == "length"
        busy = time.process_time() - busy0
    # a loop spinning for its token would burn about a second of CPU; the sleeping one next to none
    assert busy < 0.5, f"{busy:.2f} s of CPU while one token was in flight"
    assert not engine_thread.is_alive()
    assert_clean(runner)


def test_no_spinning_while_an_n_request_waits_for_the_slot_a_token_in_flight_holds():
    runner = FakeRunner(n_slots=2, slot_ctx=200, sample_delay=lambda ctx: 1.0 if ctx.startswith("slow") else 0.0)
    with make_engine(runner) as engine:
        slow = engine.submit("slow: spell", SLOW.replace(max_tokens=1))
        wait_until(lambda: 0 in runner.flying)
        busy0 = time.process_time()
        pair = engine.submit("two", GREEDY.replace(n=2))  # needs both slots: waits for the slow one
        assert slow.result(timeout=WAIT).finish_reason == "length"
        busy = time.process_time() - busy0
        assert [s.text for s in pair.result(timeout=WAIT).samples] == ["two!", "two!"]
    assert busy < 0.5, f"{busy:.2f} s of CPU while the queue head waited for a slot"
    assert_clean(runner)


def test_deterministic_mode_samples_every_row_inline():
    runner = slow_runner(0.0)
    with make_engine(runner, deterministic=True) as engine:
        results = engine.generate(["slow: spell", "plain"], [SLOW, GREEDY])
    assert [r.text for r in results] == ["slow: spell!", "plain!"]
    assert runner.jobs == [] and not any(p.apart for p in runner.plans)
    assert_clean(runner)


def test_every_request_ends_once_in_a_mix_of_slow_grammars_cancels_and_timeouts():
    runner = FakeRunner(n_slots=3, slot_ctx=200,
                        sample_delay=lambda ctx: 0.02 * (ord(ctx[-1]) % 5) if ctx.startswith("slow") else 0.0)
    outcomes: dict[int, list[str]] = {}
    lock = threading.Lock()

    def note(handle, item) -> None:
        if not isinstance(item, Delta):
            with lock:
                outcomes.setdefault(handle.request_id, []).append(item.finish_reason)

    with make_engine(runner) as engine:
        handles = []
        for i in range(24):
            params = SLOW.replace(timeout=0.05 if i % 6 == 5 else None) if i % 2 else GREEDY
            handles.append(engine.submit(f"{'slow' if i % 2 else 'plain'} {i}", params, callback=note))
            if i % 4 == 3:
                handles[-1].cancel()
        results = [h.result(timeout=WAIT) for h in handles]
    assert sorted(outcomes) == [h.request_id for h in handles]
    assert all(len(v) == 1 for v in outcomes.values())
    assert {r.finish_reason for r in results} <= {"stop", "cancelled", "timeout"}
    assert all(s.freed == 1 for s in runner.samplers)
    assert_clean(runner)


def test_where_the_decode_takes_every_core_a_job_waits_at_its_checkpoint_until_the_decode_ends():
    apart = SamplingThreads(threading.Condition(), 1, yield_to_decode=True)
    steps: list[float] = []

    class Job:
        samplers: list = []

        def run(self, stop):
            for _ in range(50):
                if stop():
                    raise SampleStopped()
                steps.append(time.perf_counter())
            return {}, {}

    with apart.decoding():
        flight = apart.launch(object(), None, Job())
        time.sleep(0.2)
        assert steps == []  # held at its first checkpoint while "llama_decode" runs
        ended = time.perf_counter()
    apart.wait([flight], WAIT)
    assert flight.landed and flight.error is None and len(steps) == 50 and steps[0] >= ended
    apart.close()
