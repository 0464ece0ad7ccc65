"""KV trims ride on the plan (plan.Trim): the scheduler decides them, the runner applies them
first in `execute`, and the fake runner checks every one against its copy of the cache."""
from __future__ import annotations

from dataclasses import fields

from fake_runner import EOG, FakeRunner, detokenize, missing_runner_members, text_tokens, token_piece

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.plan import Chunk, Fork, Runner, RunnerCapabilities, StepPlan, Trim
from llamabatch.core.scheduling.scheduler import Scheduler
from llamabatch.core.sequence import Sequence

WAIT = 30
GREEDY = SamplingParams(temperature=0, max_tokens=8)


def scheduler(n_slots: int = 2, cache_prompt: bool = True) -> Scheduler:
    return Scheduler(n_slots, 200, 64, 64, "decode-maximal", cache_prompt, token_piece, lambda t: t == EOG)


def seq(rid: int, text: str) -> Sequence:
    return Sequence(rid, text_tokens(text), GREEDY, 0, object())


def admit_all(sched: Scheduler) -> None:
    for s, slot, reuse, _fork in sched.admit():
        sched.start(s, slot, reuse)


def test_admission_plans_a_trim_to_what_the_prompt_reuses_and_the_plan_carries_it_once():
    sched = scheduler(n_slots=1)
    sched.slots[0].cached = text_tokens("hello world")  # a finished request's cache
    sched.add(seq(1, "hello there"))
    admit_all(sched)
    plan = sched.schedule()
    assert plan.trims == [Trim(0, len("hello "))]
    assert plan.chunks[0].start_pos == len("hello ")  # the chunk starts where the trim leaves the slot
    assert sched.slots[0].cached == text_tokens("hello ")  # bookkeeping changed at once
    assert sched.schedule().trims == []  # handed over once


def test_without_partial_trims_a_slot_reuses_nothing_of_its_own_cache():
    sched = scheduler(n_slots=1, cache_prompt=False)  # the engine passes cache_prompt and runner.capabilities.can_trim
    sched.slots[0].cached = text_tokens("hello world")
    sched.add(seq(1, "hello there"))
    admit_all(sched)
    plan = sched.schedule()
    assert plan.trims == [Trim(0, 0)] and plan.chunks[0].start_pos == 0


def test_a_failed_slot_is_emptied_by_a_trim_in_the_next_plan():
    sched = scheduler(n_slots=1)
    sched.slots[0].cached = text_tokens("abc")
    sched.forget_slot(0)
    assert sched.slots[0].cached == []
    plan = sched.schedule()
    assert plan.trims == [Trim(0, 0)] and bool(plan)  # a trims-only plan is still run


def test_a_trim_longer_than_the_slot_is_refused_by_the_scheduler():
    sched = scheduler(n_slots=1)
    sched.slots[0].cached = text_tokens("ab")
    try:
        sched.trim(0, 3)
    except ValueError as exc:
        assert "holds 2" in str(exc)
    else:
        raise AssertionError("a trim to 3 tokens of a 2-token slot was accepted")


def test_a_shrunk_retry_carries_no_trims():
    plan = StepPlan([Chunk(0, 1, [5], 3, True, True, sampler=object()), Chunk(1, 2, [6, 7], 0, True, False,
                                                                              sampler=object())],
                    trims=[Trim(1, 0)])
    smaller = Scheduler.shrink(plan)
    assert smaller is not None and smaller.trims == [] and smaller.forks == []


# -- the fake runner checks every trim ------------------------------------------------------


def run(runner: FakeRunner, plan: StepPlan) -> None:
    runner.execute(plan)


def test_fake_applies_trims_before_forks_and_chunks():
    runner = FakeRunner(n_slots=2, slot_ctx=64)
    s = FakeRunner(n_slots=1).build_sampler(GREEDY, 0)
    run(runner, StepPlan([Chunk(0, 1, text_tokens("abcd"), 0, False, False)]))
    run(runner, StepPlan([Chunk(1, 2, text_tokens("xy"), 0, False, False)]))
    # slot 1 emptied, then filled by the fork, then its chunk continues at 2
    run(runner, StepPlan([Chunk(1, 2, text_tokens("zz"), 2, True, False, sampler=s)],
                         forks=[Fork(0, 1, 2)], trims=[Trim(1, 0), Trim(0, 3)]))
    assert runner.kv[0] == text_tokens("abc") and runner.kv[1] == text_tokens("abzz")
    assert runner.trims == [(1, 0), (0, 3)] and not runner.violations


def test_fake_flags_a_trim_to_more_than_the_slot_holds():
    runner = FakeRunner(n_slots=1)
    run(runner, StepPlan([Chunk(0, 1, text_tokens("ab"), 0, False, False)]))
    run(runner, StepPlan(trims=[Trim(0, 3)]))
    assert any("holds 2 tokens" in v for v in runner.violations)


def test_fake_flags_a_partial_trim_on_a_runner_that_cannot_keep_part_of_a_slot():
    runner = FakeRunner(n_slots=1, partial_trim=False)
    run(runner, StepPlan([Chunk(0, 1, text_tokens("ab"), 0, False, False)]))
    run(runner, StepPlan(trims=[Trim(0, 1)]))
    assert any("can_trim False" in v for v in runner.violations)
    ok = FakeRunner(n_slots=1, partial_trim=False)
    run(ok, StepPlan([Chunk(0, 1, text_tokens("ab"), 0, False, False)]))
    run(ok, StepPlan(trims=[Trim(0, 0)]))  # emptying a slot: every runner can
    assert not ok.violations and ok.kv[0] == []


def test_fake_flags_a_chunk_decoded_past_a_failed_decode_before_a_trim_empties_the_slot():
    runner = FakeRunner(n_slots=1, status={2: -3})
    run(runner, StepPlan([Chunk(0, 1, text_tokens("ab"), 0, False, False)]))
    run(runner, StepPlan([Chunk(0, 1, text_tokens("cd"), 2, False, False)]))  # fails: the cache is unknown
    run(runner, StepPlan([Chunk(0, 2, text_tokens("cd"), 2, False, False)]))  # no trim first: stale
    assert any("before a trim emptied the slot" in v for v in runner.violations)
    fixed = FakeRunner(n_slots=1, status={2: -3})
    run(fixed, StepPlan([Chunk(0, 1, text_tokens("ab"), 0, False, False)]))
    run(fixed, StepPlan([Chunk(0, 1, text_tokens("cd"), 2, False, False)]))
    run(fixed, StepPlan([Chunk(0, 2, text_tokens("ef"), 0, False, False)], trims=[Trim(0, 0)]))
    assert not fixed.violations and fixed.kv[0] == text_tokens("ef")


def test_fake_flags_keeping_part_of_or_copying_a_slot_a_failed_decode_left_unknown():
    runner = FakeRunner(n_slots=2, status={2: -3})
    run(runner, StepPlan([Chunk(0, 1, text_tokens("ab"), 0, False, False)]))
    run(runner, StepPlan([Chunk(0, 1, text_tokens("cd"), 2, False, False)]))
    run(runner, StepPlan(forks=[Fork(0, 1, 1)], trims=[Trim(0, 1)]))
    assert any("keeps part of a slot a failed decode left unknown" in v for v in runner.violations)
    assert any("copies a slot a failed decode left unknown" in v for v in runner.violations)


def test_no_kv_room_leaves_the_cache_as_it_was_so_a_smaller_retry_needs_no_trim():
    runner = FakeRunner(n_slots=1, status={2: 1})
    run(runner, StepPlan([Chunk(0, 1, text_tokens("ab"), 0, False, False)]))
    run(runner, StepPlan([Chunk(0, 1, text_tokens("cd"), 2, False, False)]))  # status 1: rolled back
    run(runner, StepPlan([Chunk(0, 1, text_tokens("cd"), 2, False, False)]))
    assert not runner.violations and runner.kv[0] == text_tokens("abcd")


# -- the engine: trims only through plans --------------------------------------------------


def test_engine_trims_only_through_plans_and_a_failed_batch_is_emptied_by_the_next_plan():
    def status(call, plan):
        return -3 if any("boom" in detokenize(c.tokens) for c in plan.chunks) else 0

    start = "the same start, then "
    runner = FakeRunner(n_slots=1, slot_ctx=200, reply=lambda p: "ok", status=status)
    with Engine(EngineConfig(n_parallel=1, n_ctx=200), runner=runner) as engine:
        first = engine.submit(start + "one").result(WAIT)
        failed = engine.submit(start + "boom").result(WAIT)
        after = engine.submit(start + "two").result(WAIT)
    assert first.ok and after.ok and failed.finish_reason == "error"
    assert first.usage.cached_tokens == 0 and runner.plans[0].plan.trims == [Trim(0, 0)]
    failed_plan = next(p for p in runner.plans if p.status == -3)
    assert failed_plan.plan.trims == [Trim(0, len(start))]  # admitted keeping the shared start
    assert runner.plans[failed_plan.call].plan.trims[0] == Trim(0, 0)  # the next plan empties the failed slot
    assert after.usage.cached_tokens == 0  # so nothing of the failed slot's cache is reused
    assert not hasattr(runner, "keep_prefix") and not runner.violations


def test_the_fake_runner_implements_the_whole_runner_protocol():
    assert missing_runner_members(FakeRunner()) == []
    assert {"metadata", "n_vocab", "bos_text", "eos_text", "chat_formats", "capabilities", "model_path",
            "kernel_text", "tokenize", "execute"} <= set(Runner.__annotations__) | {
        n for n in vars(Runner) if not n.startswith("_")}
    # what plans may ask is one declared value, not loose attributes beside the model's facts
    asked = {"can_fork", "can_trim", "can_sample_apart", "can_store", "can_park", "can_verify", "pool_cells"}
    assert asked <= {f.name for f in fields(RunnerCapabilities)} and not asked & set(Runner.__annotations__)
    assert isinstance(FakeRunner().capabilities, RunnerCapabilities)
    assert "keep_prefix" not in vars(Runner)  # KV trims go through the plan
