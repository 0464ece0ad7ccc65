"""Prefix sharing across slots and the KV fork it is built on, without a model: the
scheduler's decisions by hand-made runner outputs, the engine against the FakeRunner (which
applies every fork to its own copy of each slot's KV and checks every plan against it)."""
from __future__ import annotations

import threading
import time

import pytest

from llamabatch import EngineConfig, SamplingParams
from llamabatch.core.engine import EngineCore
from llamabatch.core.plan import Fork, StepResult
from llamabatch.core.scheduling.scheduler import Scheduler
from llamabatch.core.sequence import Status

from fake_runner import EOG, FakeRunner, text_tokens, token_piece

GREEDY = SamplingParams(temperature=0, max_tokens=3)
WAIT = 10
SHARED = "You label each item as A or B. Think of the examples. "  # 54 characters = 54 fake tokens


def make_scheduler(n_slots=4, fork_min_tokens=8, chunk_size=16, n_batch=64) -> Scheduler:
    return Scheduler(n_slots, 1000, n_batch, chunk_size, "decode-maximal", True, token_piece, lambda t: t == EOG,
                     fork_min_tokens=fork_min_tokens)


_ids = iter(range(10**6))


def make_seq(prompt: str):
    from llamabatch.core.sequence import Sequence

    return Sequence(next(_ids), text_tokens(prompt), GREEDY, seed=0)


def admit(sched: Scheduler):
    """Admit like the engine: trims keep everything (the fake's KV always can)."""
    out = sched.admit()
    for seq, slot, reuse, _fork in out:
        sched.start(seq, slot, reuse)
    return out


def step(sched: Scheduler):
    plan = sched.schedule()
    sampled = {c.slot: ord("x") for c in plan.chunks if c.wants_logits}
    sched.update(plan, StepResult(sampled=sampled))
    return plan


# -- the fork primitive ----------------------------------------------------------------------

def test_fork_copies_the_bookkeeping_and_rides_on_the_next_plan():
    sched = make_scheduler(n_slots=2, fork_min_tokens=0)
    a = make_seq("abcdefghij")
    sched.add(a)
    admit(sched)
    step(sched)  # the whole prompt in one chunk, first token sampled
    assert sched.slots[0].cached == text_tokens("abcdefghij")
    fork = sched.fork(0, 1, 6)
    assert fork == Fork(0, 1, 6)
    assert sched.slots[1].cached == text_tokens("abcdef")
    plan = sched.schedule()
    assert plan.forks == [fork] and plan.chunks[0].slot == 0  # a still decodes in the same tick
    assert sched.schedule().forks == []  # handed over once


@pytest.mark.parametrize("src,dst,n", [(0, 0, 3), (0, 1, 0), (0, 1, 11), (1, 0, 1)])
def test_impossible_forks_are_refused(src, dst, n):
    sched = make_scheduler(n_slots=2, fork_min_tokens=0)
    sched.add(make_seq("abcdefghij"))
    admit(sched)
    step(sched)  # slot 0 holds 10 tokens, slot 1 none
    with pytest.raises(ValueError):
        sched.fork(src, dst, n)


def test_a_fork_target_cannot_be_forked_again_or_used_as_a_source_in_the_same_tick():
    sched = make_scheduler(n_slots=3, fork_min_tokens=0)
    sched.add(make_seq("abcdefghij"))
    admit(sched)
    step(sched)
    sched.fork(0, 1, 5)
    with pytest.raises(ValueError):
        sched.fork(0, 1, 4)
    with pytest.raises(ValueError):
        sched.fork(1, 2, 4)


# -- admission that waits for a shared prefix -----------------------------------------------

def test_requests_sharing_a_prefix_wait_for_it_and_then_fork_it():
    sched = make_scheduler(n_slots=4, fork_min_tokens=8, chunk_size=16)
    seqs = [make_seq(SHARED + item) for item in ("cat", "dog", "eel")]
    for s in seqs:
        sched.add(s)
    first = admit(sched)
    assert [a.seq for a in first] == seqs[:1]  # the others wait instead of evaluating it too
    assert list(sched.waiting) == seqs[1:]
    evaluated = 0
    while len(sched.slots[first[0].slot].cached) < len(SHARED):
        assert admit(sched) == []
        evaluated += step(sched).prefill_tokens
    later = admit(sched)
    assert [a.seq for a in later] == seqs[1:]
    for a in later:
        assert a.fork == Fork(first[0].slot, a.slot, len(SHARED))
        assert a.reuse == a.seq.kv.num_cached == a.seq.kv.num_computed == len(SHARED)
    plan = step(sched)
    assert plan.forks == [a.fork for a in later]
    suffixes = {c.slot: c for c in plan.chunks if not c.is_decode}
    for a in later:
        chunk = suffixes[a.slot]
        assert chunk.start_pos == len(SHARED) and chunk.tokens == a.seq.prompt[len(SHARED):]
    evaluated += plan.prefill_tokens
    # the shared part was evaluated once, not three times
    assert evaluated == len(SHARED) + 3 + 3 + 3


def test_a_request_that_shares_nothing_goes_ahead_of_one_that_waits():
    sched = make_scheduler(n_slots=3, fork_min_tokens=8)
    owner, waiter, other = make_seq(SHARED + "one"), make_seq(SHARED + "two"), make_seq("unrelated prompt")
    for s in (owner, waiter, other):
        sched.add(s)
    assert [a.seq for a in admit(sched)] == [owner, other]
    assert list(sched.waiting) == [waiter]


def test_below_the_threshold_prompts_are_evaluated_in_their_own_slots():
    sched = make_scheduler(n_slots=2, fork_min_tokens=60)  # SHARED is 54 tokens
    seqs = [make_seq(SHARED + "one"), make_seq(SHARED + "two")]
    for s in seqs:
        sched.add(s)
    assert [a.seq for a in admit(sched)] == seqs
    assert all(a.fork is None for a in sched.admit())


def test_a_prefix_already_in_a_busy_slot_is_forked_at_once():
    sched = make_scheduler(n_slots=2, fork_min_tokens=8, chunk_size=256)
    owner = make_seq(SHARED + "one")
    sched.add(owner)
    admit(sched)
    step(sched)
    assert owner.status == Status.GENERATING
    late = make_seq(SHARED + "two and more")
    sched.add(late)
    (a,) = admit(sched)
    assert a.fork == Fork(owner.kv.slot, a.slot, len(SHARED)) and late.kv.num_cached == len(SHARED)


def test_owner_cancelled_mid_evaluation_hands_its_work_to_a_waiter():
    sched = make_scheduler(n_slots=3, fork_min_tokens=8, chunk_size=16)
    owner, w1, w2 = make_seq(SHARED + "one"), make_seq(SHARED + "two"), make_seq(SHARED + "six")
    for s in (owner, w1, w2):
        sched.add(s)
    admit(sched)
    step(sched)  # 16 of the 54 shared tokens evaluated
    sched.finish(owner, "cancelled")
    (a,) = admit(sched)  # w1 takes over the owner's slot and what it evaluated; w2 waits for w1
    assert a.seq is w1 and a.slot == owner.kv.slot and a.reuse == 16 and a.fork is None
    assert list(sched.waiting) == [w2]
    while w1.kv.num_computed < len(SHARED):
        step(sched)
    (b,) = admit(sched)
    assert b.seq is w2 and b.fork == Fork(w1.kv.slot, b.slot, len(SHARED))


# -- the engine with the fake runner ------------------------------------------------------------

def make_engine(runner: FakeRunner, **config) -> EngineCore:
    cfg = dict(n_parallel=runner.n_slots, n_batch=64, chunk_size=16, share_prefix_min=8)
    cfg.update(config)
    runner.n_batch = cfg["n_batch"]
    return EngineCore(EngineConfig(**cfg), runner=runner, default_params=GREEDY)


def reply_of(prompt: str) -> str:
    return prompt[-3:].upper()  # depends on the whole prompt having reached the slot's KV


def test_engine_shares_the_prefix_and_answers_as_if_each_prompt_were_evaluated_in_full():
    items = ["cat", "dog", "eel", "fox", "gnu", "hen"]
    totals = {}
    for share in (8, 0):
        runner = FakeRunner(n_slots=4, slot_ctx=200, reply=reply_of)
        with make_engine(runner, share_prefix_min=share) as engine:
            with engine.hold():  # all submitted before the first tick
                handles = [engine.submit(SHARED + item) for item in items]
            results = [h.result(WAIT) for h in handles]
        assert runner.violations == []
        assert [r.text for r in results] == [i.upper() for i in items]
        totals[share] = (sum(p.plan.prefill_tokens for p in runner.plans),
                         sum(len(p.plan.forks) for p in runner.plans), [r.usage.cached_tokens for r in results])
    evaluated, forks, cached = totals[8]
    # 3 forks fill the other slots; the last two reuse what their (idle) slots already hold
    assert forks == 3 and cached == [0] + [len(SHARED)] * 5
    assert evaluated == len(SHARED) + 3 * len(items)
    # without sharing, each of the 4 slots evaluates the shared part once itself
    assert totals[0][1] == 0 and totals[0][0] == 4 * (len(SHARED) + 3) + 2 * 3


def test_engine_without_fork_support_evaluates_every_prompt_in_full():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=reply_of, can_fork=False)
    with make_engine(runner) as engine:
        with engine.hold():
            handles = [engine.submit(SHARED + item) for item in ("cat", "dog")]
        results = [h.result(WAIT) for h in handles]
    assert [r.text for r in results] == ["CAT", "DOG"] and runner.violations == []
    assert all(not p.plan.forks for p in runner.plans)


def test_cancelling_the_owner_mid_evaluation_leaves_the_waiters_whole():
    at_second = threading.Event()
    release = threading.Event()

    def hook(call, plan):
        if call == 2:
            at_second.set()
            assert release.wait(WAIT)

    runner = FakeRunner(n_slots=3, slot_ctx=200, reply=reply_of, hook=hook)
    with make_engine(runner) as engine:
        with engine.hold():
            owner = engine.submit(SHARED + "one")
            waiters = [engine.submit(SHARED + w) for w in ("two", "six")]
        assert at_second.wait(WAIT)  # the owner has evaluated one chunk and is in its second
        owner.cancel()
        release.set()
        results = [w.result(WAIT) for w in waiters]
        assert owner.result(WAIT).finish_reason == "cancelled"
    assert [r.text for r in results] == ["TWO", "SIX"]
    assert runner.violations == []
    assert results[0].usage.cached_tokens > 0 and results[1].usage.cached_tokens == len(SHARED)
    assert sum(len(p.plan.forks) for p in runner.plans) == 1


def test_a_failed_decode_keeps_the_fork_and_the_retry_does_not_repeat_it():
    runner = FakeRunner(n_slots=2, slot_ctx=200, reply=reply_of, step_delay=0.001)
    with make_engine(runner) as engine:
        owner = engine.submit(SHARED + "one", GREEDY.replace(max_tokens=100, ignore_eos=True))
        while runner.calls < 5:  # until the owner is generating
            time.sleep(0.001)
        runner.status = lambda call, plan: 1 if plan.forks else 0  # no KV room on the fork's tick
        r = engine.submit(SHARED + "two").result(WAIT)
        owner.cancel()
    assert r.text == "TWO" and r.usage.cached_tokens == len(SHARED)
    assert runner.violations == []
    failed = [p for p in runner.plans if p.status == 1]
    assert len(failed) == 1 and failed[0].plan.forks
