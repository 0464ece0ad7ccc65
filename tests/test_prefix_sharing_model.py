"""The KV fork and prefix sharing across slots on the bundled Gemma 3 270M, for real.

llama.cpp's CPU kernels round a row differently depending on the ubatch it sits in (see
../shared/probes/README.md), so "the same tokens" is only well defined for the same shapes.
The runner test therefore evaluates the prefix in exactly the same chunks in both arms and
compares token lists exactly: one arm forks it (whole-stream copy, trimmed), the other
evaluates it itself. The shared part is longer than Gemma 3's 512-token sliding window, so a
fork that lost the window's early cells would change the answer. Both tests run on Gemma 3
(sliding window, swa_full) and SmolLM2 (llama, full attention), `family`.
"""
from __future__ import annotations

import pytest
from fake_runner import missing_runner_members

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.plan import Chunk, Fork, StepPlan, Trim

pytestmark = pytest.mark.model

WAIT = 120


def long_prompt(n_facts: int = 43) -> str:
    """About 540 tokens: longer than Gemma 3's 512-token sliding window."""
    return " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(n_facts))


def evaluate(runner, sampler, slot: int, tokens: list[int], start: int, chunk: int = 256, forks=(), trims=()) -> int:
    """Evaluate `tokens` in `slot` from position `start`, `chunk` tokens per tick; returns the
    token sampled after the last one. `trims` and `forks` ride on the first tick (the runner
    applies them before that tick's chunk)."""
    sampled = None
    for i in range(0, len(tokens), chunk):
        part = tokens[i:i + chunk]
        last = i + chunk >= len(tokens)
        result = runner.execute(StepPlan([Chunk(slot, slot, part, start + i, last, False, sampler=sampler if last else None)],
                                         list(forks) if i == 0 else [], list(trims) if i == 0 else []))
        assert result.status == 0
        sampled = result.sampled.get(slot)
    return sampled


def greedy(runner, sampler, slot: int, first: int, pos: int, n: int) -> list[int]:
    out = [first]
    for _ in range(n - 1):
        result = runner.execute(StepPlan([Chunk(slot, slot, [out[-1]], pos, True, True, sampler=sampler)]))
        assert result.status == 0
        out.append(result.sampled[slot])
        pos += 1
    return out


@pytest.mark.parametrize("unified", [False, True], ids=["per-slot-streams", "unified"])
def test_forked_prefix_plus_suffix_gives_the_tokens_of_evaluating_it_in_place(family, unified, cpu_path):
    from llamabatch.llama.runner import LlamaRunner

    config = EngineConfig(model=family.path, n_parallel=2, n_ctx=2 * 640, kv_unified=unified,
                          cpu_buffers=cpu_path)
    runner = LlamaRunner(config, family.path)
    sampler = runner.build_sampler(SamplingParams(temperature=0), 0)
    try:
        assert runner.capabilities.can_fork and runner.capabilities.can_trim
        assert missing_runner_members(runner) == []  # LlamaRunner is the Runner protocol, all of it
        # greedy: stateless, one chain serves both slots
        # Gemma: past its window. SmolLM2 has none, and its Q4_1 prefill is slow here (no repacked
        # or tinyBLAS kernel): a shorter shared part, still several prefill ticks
        base = runner.tokenize(long_prompt(43 if family.sliding_window else 12), special=False)
        owner = base + runner.tokenize(" Fact 98: the number 98 is", special=False)[1:]
        suffix = runner.tokenize(" Fact 55: the number 55 is", special=False)[1:]
        assert len(base) > (family.sliding_window or 100)
        # reference: slot 1 evaluates the owner's prompt itself, keeps the base, adds the suffix
        # (the Trim to the base rides on the suffix's first chunk: applied before it is evaluated)
        evaluate(runner, sampler, 1, owner, 0)
        ref = greedy(runner, sampler, 1, evaluate(runner, sampler, 1, suffix, len(base), trims=[Trim(1, len(base))]),
                     len(base) + len(suffix), 8)
        # fork: slot 0 evaluates the owner's prompt (same chunks), slot 1 gets its base by a fork
        evaluate(runner, sampler, 0, owner, 0, trims=[Trim(1, 0)])
        assert runner.kv.next_pos(1) == 0
        forked = greedy(runner, sampler, 1, evaluate(runner, sampler, 1, suffix, len(base), forks=[Fork(0, 1, len(base))]),
                        len(base) + len(suffix), 8)
        assert forked == ref
        # not vacuous: without the prefix the suffix continues otherwise, so the fork carried it
        bare = greedy(runner, sampler, 1, evaluate(runner, sampler, 1, suffix, 0, trims=[Trim(0, 0), Trim(1, 0)]),
                      len(suffix), 8)
        assert bare != ref
        # a trim to more than the slot holds is refused in one line, before anything changes
        held = runner.kv.next_pos(1)
        with pytest.raises(RuntimeError, match=f"holds {held} tokens"):
            runner.execute(StepPlan(trims=[Trim(1, held + 1)]))
        assert runner.kv.next_pos(1) == held
    finally:
        runner.free_sampler(sampler)
        runner.close()


def test_engine_shares_a_prefix_across_slots_and_counts_it_as_cached(family):
    base = "You are a careful assistant. Answer with one word, yes or no. " * 6
    # ignore_eos: SmolLM2, an instruct model, may end a raw (non-chat) prompt at once with <|im_end|>
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with Engine(EngineConfig(model=family.path, n_parallel=3, n_ctx=3 * 256)) as eng:
        n_base = len(eng.tokenize(base))
        with eng.hold():  # all start in the same tick: two wait for the first one's prefill
            handles = [eng.submit(base + q, params) for q in (" Is ice cold?", " Is fire hot?", " Is snow dry?")]
        results = [h.result(WAIT) for h in handles]
    assert all(r.ok and r.usage.completion_tokens > 0 for r in results)
    assert results[0].usage.cached_tokens == 0
    for r in results[1:]:  # the slots started empty: these came from the first slot by a fork
        assert n_base - 1 <= r.usage.cached_tokens < r.usage.prompt_tokens
