"""Priority for requests of `n` samples (FakeRunner, no model): every sample of an n-request is
parked together and each resumes unchanged, whether it was decoding or still waiting for the
prompt's fork, and an urgent n-request parks as many lower-priority requests as it needs slots."""
from __future__ import annotations

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.plan import StepPlan

from fake_runner import FakeRunner

WAIT = 10


def seeded(prompt: str, seed: int) -> str:
    return f"{prompt[:1]}{seed}:" + "abcdefghij"[seed % 3:]  # samples differ by seed


def engine_over(runner: FakeRunner) -> Engine:
    config = EngineConfig(n_parallel=runner.n_slots, n_batch=64, chunk_size=16, share_prefix_min=0)
    return Engine(config, runner=runner, default_params=SamplingParams(temperature=0, max_tokens=8))


def params(priority: int = 0, n: int = 1, seed: int = 1, max_tokens: int = 16) -> SamplingParams:
    return SamplingParams(temperature=0.7, max_tokens=max_tokens, priority=priority, n=n, seed=seed)


def submit_when(runner: FakeRunner, engine_of, ready, prompt: str, urgent: SamplingParams) -> dict:
    """Submit `urgent` from inside the first execute whose plan `ready` accepts."""
    submitted: dict = {}

    def hook(call: int, plan: StepPlan) -> None:
        if "high" not in submitted and ready(plan):
            submitted["high"] = engine_of().submit(prompt, urgent)
            submitted["at"] = call

    runner.hook = hook
    return submitted


def urgent_once_every_slot_decodes(n_slots: int, urgent: SamplingParams) -> tuple[FakeRunner, Engine, dict]:
    """A runner, its engine, and `urgent` submitted from the first plan decoding in every slot."""
    runner = FakeRunner(n_slots=n_slots, slot_ctx=256, n_batch=64, reply=seeded)
    engine = engine_over(runner)
    submitted = submit_when(runner, lambda: engine, lambda plan: sum(c.is_decode for c in plan.chunks) == n_slots,
                            "urgent", urgent)
    return runner, engine, submitted


def test_an_urgent_request_parks_every_sample_of_a_lower_n_request_and_each_resumes_unchanged():
    runner, engine, submitted = urgent_once_every_slot_decodes(2, params(priority=-1, max_tokens=4))
    with engine:
        low = engine.submit("low", params(priority=1000, n=2, seed=4)).result(timeout=WAIT)
        high = submitted["high"].result(timeout=WAIT)
    assert high.finish_reason == "length" and runner.plans_with(high.request_id)[0].call == submitted["at"] + 1
    assert [s.text for s in low.samples] == [seeded("low", 4)[:16], seeded("low", 5)[:16]]  # as if never parked
    assert [s.timings.preemptions for s in low.samples] == [1, 1]
    assert all(s.timings.paused_ms > 0 for s in low.samples)
    assert len(runner.restores) == 2 and all(ok for *_, ok in runner.restores)
    assert runner.violations == []


def test_a_request_parked_while_its_samples_wait_for_the_prompt_resumes_and_forks_it():
    runner = FakeRunner(n_slots=2, slot_ctx=256, n_batch=16, reply=seeded)
    engine = engine_over(runner)
    # the low request's prompt takes three 16-token chunks: the urgent one comes after the first
    submitted = submit_when(runner, lambda: engine, lambda plan: any(not c.is_decode for c in plan.chunks),
                            "urgent", params(priority=-1, max_tokens=4))
    with engine:
        low = engine.submit("L" * 40, params(priority=5, n=2, seed=7)).result(timeout=WAIT)
        high = submitted["high"].result(timeout=WAIT)
    assert high.finish_reason == "length"
    assert [s.text for s in low.samples] == [seeded("L", 7)[:16], seeded("L", 8)[:16]]
    assert [s.timings.preemptions for s in low.samples] == [1, 1]
    assert runner.restores and all(n < 40 for _, n, _ in runner.restores)  # its prompt, part evaluated
    assert any(dst != src for src, dst, n in runner.forks if n == 40)  # the prompt forked after it resumed
    assert runner.violations == []


def test_an_urgent_n_request_parks_as_many_lower_requests_as_it_needs_slots():
    runner, engine, submitted = urgent_once_every_slot_decodes(3, params(priority=-1, n=2, seed=20, max_tokens=4))
    with engine:
        with engine.hold():  # admitted together
            lows = [engine.submit(f"low{i}", params(priority=5 - i, seed=i)) for i in range(3)]
        low_results = [h.result(timeout=WAIT) for h in lows]
        high = submitted["high"].result(timeout=WAIT)
    assert runner.plans_with(high.request_id)[0].call == submitted["at"] + 1  # no wait for the batch
    assert [s.text for s in high.samples] == [seeded("u", 20)[:4], seeded("u", 21)[:4]]
    # the two of lowest priority (5, then 4) were parked; the third ran on
    assert [r.timings.preemptions for r in low_results] == [1, 1, 0]
    assert [r.text for r in low_results] == [seeded("l", i)[:16] for i in range(3)]
    assert runner.violations == []


def test_an_urgent_n_request_parks_nobody_when_the_lower_ones_cannot_free_enough_slots():
    runner, engine, submitted = urgent_once_every_slot_decodes(2, params(priority=-1, n=2, seed=30, max_tokens=4))
    with engine:
        with engine.hold():
            equal = engine.submit("eq", params(priority=-1, seed=3))  # as urgent: never parked for it
            low = engine.submit("lo", params(priority=5, seed=4))
        results = [equal.result(timeout=WAIT), low.result(timeout=WAIT)]
        high = submitted["high"].result(timeout=WAIT)
    assert [r.timings.preemptions for r in results] == [0, 0]  # one slot could be freed, two are needed
    assert [s.text for s in high.samples] == [seeded("u", 30)[:4], seeded("u", 31)[:4]]
    assert runner.violations == []


def test_a_request_whose_other_sample_ended_is_parked_and_resumed_with_the_sample_still_running():
    # sample 0 (seed 4) answers long, sample 1 (seed 5) at once; "mid" takes the slot it leaves
    runner = FakeRunner(n_slots=2, slot_ctx=256, n_batch=64,
                        reply=lambda prompt, seed: "x" if seed % 2 else "abcdefghijklmno")
    engine = engine_over(runner)
    submitted = submit_when(runner, lambda: engine,
                            lambda plan: len({c.request_id for c in plan.chunks if c.is_decode}) == 2,
                            "urgent", params(priority=-1, n=2, seed=40, max_tokens=4))
    with engine:
        with engine.hold():
            low = engine.submit("low", params(priority=5, n=2, seed=4))
            mid = engine.submit("mid", params(priority=5, seed=6))  # behind low: it takes the ended sample's slot
        low_result, mid_result = low.result(timeout=WAIT), mid.result(timeout=WAIT)
        high = submitted["high"].result(timeout=WAIT)
    assert len(high.samples) == 2 and runner.plans_with(high.request_id)[0].call == submitted["at"] + 1
    assert [s.text for s in low_result.samples] == ["abcdefghijklmno", "x"]
    assert [s.timings.preemptions for s in low_result.samples] == [1, 0]  # the ended one stays ended
    assert mid_result.timings.preemptions == 1 and mid_result.text == "abcdefghijklmno"
    assert runner.violations == []
