"""Interrupting a decode on the bundled models (both families; core/tick_interrupt.py,
llama/decode_interrupt.py): llama.cpp stops part-way and keeps nothing of it, the same decode
run again gives the same token as a slot never interrupted, and through the engine an urgent
request that interrupts the batch's decode leaves every batch answer as it is without it."""
from __future__ import annotations

import logging
import threading
import time

import pytest

from llamabatch import Engine, EngineConfig
from llamabatch.core.plan import INTERRUPTED, Chunk, StepPlan
from llamabatch.llama.runner import LlamaRunner
from llamabatch.params import SamplingParams

from test_priority_model import GREEDY, PROMPTS, SEEDED, URGENT

pytestmark = pytest.mark.model

LONG = " ".join(f"Item {i} weighs {i * 7 % 13} grams and costs {i % 5} coins." for i in range(30))


def test_an_interrupted_decode_keeps_nothing_and_the_same_decode_then_gives_the_same_tokens(family):
    runner = LlamaRunner(EngineConfig(model=family.path, n_parallel=2, n_ctx=2048), family.path)
    samplers = [runner.build_sampler(SamplingParams(temperature=0), 0) for _ in range(2)]
    try:
        prompt = runner.tokenize(LONG, special=False)
        assert runner.interruptible(StepPlan([Chunk(0, 0, prompt, 0, True, False, sampler=samplers[0])]))
        # slot 1, never interrupted: its prefill's time, its first token
        t0 = time.perf_counter()
        whole = runner.execute(StepPlan([Chunk(1, 1, prompt, 0, True, False, sampler=samplers[1])]))
        took = time.perf_counter() - t0
        # slot 0: the same prefill, stopped a fifth of the way in from another thread
        timer = threading.Timer(took / 5, runner.interrupt)
        timer.start()
        stopped = runner.execute(StepPlan([Chunk(0, 0, prompt, 0, True, False, sampler=samplers[0])]))
        timer.join()
        runner.clear_interrupt()
        assert stopped.status == INTERRUPTED and stopped.sampled == {}
        assert runner.kv.next_pos(0) == 0  # nothing of it kept
        again = runner.execute(StepPlan([Chunk(0, 0, prompt, 0, True, False, sampler=samplers[0])]))
        assert again.status == 0 and again.sampled[0] == whole.sampled[1]
        # a decode interrupted before its first node, then each slot decoding alone: same tokens
        runner.interrupt()
        assert runner.execute(StepPlan([Chunk(0, 0, [again.sampled[0]], len(prompt), True, True,
                                              sampler=samplers[0])])).status == INTERRUPTED
        runner.clear_interrupt()
        assert runner.kv.next_pos(0) == len(prompt)
        tokens = {0: [again.sampled[0]], 1: [whole.sampled[1]]}
        for step in range(6):
            for slot in (0, 1):
                result = runner.execute(StepPlan([Chunk(slot, slot, [tokens[slot][-1]], len(prompt) + step, True, True,
                                                        sampler=samplers[slot])]))
                tokens[slot].append(result.sampled[slot])
        assert tokens[0] == tokens[1]
    finally:
        for sampler in samplers:
            runner.free_sampler(sampler)
        runner.close()


def run(e: Engine, urgent_at_decode_tick: int | None) -> tuple[list, object]:
    """Both prompts in 3 slots (one greedy, one seeded); with `urgent_at_decode_tick`, a priority
    -1 request is submitted from inside that decode tick of both, before its llama_decode starts."""
    real, seen, sent = e.runner.execute, [0], {}

    def execute(plan: StepPlan):
        if urgent_at_decode_tick is not None and len(plan.chunks) == 2 and all(c.is_decode for c in plan.chunks):
            seen[0] += 1
            if seen[0] == urgent_at_decode_tick:
                sent["urgent"] = e.submit("The capital of France is", URGENT)
        return real(plan)

    e.runner.execute = execute
    try:
        with e.hold():
            handles = [e.submit(p, q) for p, q in zip(PROMPTS, (GREEDY, SEEDED))]
        results = [h.result(timeout=300) for h in handles]
        urgent = sent["urgent"].result(timeout=300) if "urgent" in sent else None
    finally:
        del e.runner.execute
    return results, urgent


def test_an_urgent_request_interrupts_the_batchs_decode_and_the_batch_answers_on(family):
    """Through the engine: the decode in flight is stopped, nothing of it is kept, and every batch
    answer goes on from where it was. Its tokens up to the stopped tick are the unpreempted ones;
    after it the batch decodes beside the urgent request's rows, and on some kernel paths
    (CPU_REPACK) a row's rounding depends on its batch-mates outside deterministic mode, so the
    later tokens are compared only where the decode alone is (the runner-level test above)."""
    with Engine(EngineConfig(model=family.path, n_parallel=3, n_ctx=1536)) as e:
        plain, _ = run(e, None)
        interrupted, urgent = run(e, urgent_at_decode_tick=3)
        stats = e.stats()
    assert urgent is not None and urgent.finish_reason in ("stop", "length") and urgent.token_ids
    assert stats.interrupted_ticks == 1
    # the first token comes from the prompt's tick, then decode ticks 1 and 2 ran before the stop
    assert [r.token_ids[:3] for r in interrupted] == [r.token_ids[:3] for r in plain]
    assert all(r.finish_reason in ("stop", "length") and len(r.token_ids) > 3 for r in interrupted)


def test_a_tick_of_several_graph_runs_interrupted_in_a_later_one_keeps_nothing_either(family, caplog):
    # A decode row beside a long prompt: llama.cpp splits the batch into a run of one row per
    # sequence and a run of the rest of the prompt. Stopped in the second, it has kept the
    # first; the runner takes that out too, and the plan run again gives what slots 2 and 3,
    # never interrupted, got from the same plan.
    runner = LlamaRunner(EngineConfig(model=family.path, n_parallel=4, n_ctx=4096), family.path)
    caplog.clear()  # what loading logged
    samplers = [runner.build_sampler(SamplingParams(temperature=0), 0) for _ in range(4)]
    try:
        prompt = runner.tokenize(LONG, special=False)[:300]
        short = prompt[:12]
        firsts = {}
        for slot in (0, 2):
            firsts[slot] = runner.execute(StepPlan([Chunk(slot, slot, short, 0, True, False, sampler=samplers[slot])])).sampled[slot]

        def mixed(a: int, b: int) -> StepPlan:
            return StepPlan([Chunk(a, a, [firsts[a]], len(short), True, True, sampler=samplers[a]),
                             Chunk(b, b, prompt, 0, True, False, sampler=samplers[b])])

        assert runner.graph_runs([(0, 1), (1, len(prompt))]) == 2 and runner.interruptible(mixed(0, 1))
        t0 = time.perf_counter()
        reference = runner.execute(mixed(2, 3))
        took = time.perf_counter() - t0
        timer = threading.Timer(took / 2, runner.interrupt)  # well into the second run
        timer.start()
        stopped = runner.execute(mixed(0, 1))
        timer.join()
        runner.clear_interrupt()
        assert stopped.status == INTERRUPTED
        assert (runner.kv.next_pos(0), runner.kv.next_pos(1)) == (len(short), 0)
        again = runner.execute(mixed(0, 1))
        assert again.status == 0 and (again.sampled[0], again.sampled[1]) == (reference.sampled[2], reference.sampled[3])
        # llama.cpp's lines about the stop are not warnings here: it was asked for (backend.py)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        for sampler in samplers:
            runner.free_sampler(sampler)
        runner.close()
