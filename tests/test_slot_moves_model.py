"""No holes between busy slots on the bundled models, for real: a request moved into an idle
slot below it (a whole KV stream copied by llama.cpp, plan.Move) goes on with the same tokens
as the same request left where it was: greedy, seeded, with logprobs, and in deterministic mode
bit for bit. Three requests on slots 0-2, the one on slot 1 ending after 2 tokens: the one on
slot 2 moves into slot 1 (moves on) or stays (slot_moves False). Every batch has at most 3
rows, which the CPU kernels evaluate one row at a time (gemv), so even outside deterministic
mode a row's numbers do not depend on its batch-mates here. Short answers, one thread."""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.model

WAIT = 120
MODES = {
    "greedy": SamplingParams(temperature=0, ignore_eos=True, max_tokens=12),
    "seeded": SamplingParams(temperature=0.9, top_k=40, seed=11, ignore_eos=True, max_tokens=12),
    "logprobs": SamplingParams(temperature=0, ignore_eos=True, max_tokens=12, logprobs=2),
}


def answer(config: dict, params: SamplingParams) -> tuple[tuple, int]:
    """The third request's tokens and logprobs, and the moves the engine made (a fresh engine:
    a slot's cached prompt would draw a later batch to it and change the layout)."""
    with Engine(EngineConfig(**config)) as engine:
        with engine.hold():  # admitted together: request i on slot i
            handles = [engine.submit("The lighthouse keeper wrote in his log:", MODES["greedy"]),
                       engine.submit("Two words:", SamplingParams(temperature=0, ignore_eos=True, max_tokens=2)),
                       engine.submit("A recipe for bread begins with", params)]
        results = [h.result(WAIT) for h in handles]
        moves = engine.stats().moves
    assert all(r.ok for r in results), [r.error for r in results]
    return (results[2].text, results[2].logprobs), moves  # logprob records compared exactly


@pytest.mark.parametrize("deterministic", [False, True], ids=["plain", "deterministic"])
def test_a_moved_request_gives_the_tokens_it_gives_unmoved(family, deterministic):
    config = dict(model=family.path, n_parallel=3, n_ctx=3 * 128, threads=1, deterministic=deterministic)
    for mode, params in MODES.items():
        moved, n_moves = answer(config, params)
        unmoved, none = answer({**config, "slot_moves": False}, params)
        assert (n_moves, none) == (1, 0), mode
        assert moved == unmoved, mode
        assert moved[0] and (moved[1] is not None) == (mode == "logprobs")


def test_the_runner_copies_a_stream_and_empties_the_destination_of_a_copy_that_fails(model_path):
    from llamabatch.core.plan import Chunk, Move, StepPlan
    from llamabatch.llama.runner import LlamaRunner

    runner = LlamaRunner(EngineConfig(model=model_path, n_parallel=2, n_ctx=2 * 128, threads=1), model_path)
    sampler = runner.build_sampler(SamplingParams(temperature=0), 0)
    try:
        prompt = runner.tokenize("The lighthouse keeper wrote", special=False)
        first = runner.execute(StepPlan([Chunk(0, 0, prompt, 0, True, False, sampler=sampler)])).sampled[0]

        def step(slot: int, moves: list[Move]):
            return runner.execute(StepPlan([Chunk(slot, 0, [first], len(prompt), True, True, sampler=sampler)],
                                           moves=moves))

        bad = step(1, [Move(0, 1, len(prompt) + 5)])  # the source holds fewer positions than said
        assert bad.emptied == {1} and not bad.sampled and runner.kv.next_pos(1) == 0
        moved = step(1, [Move(0, 1, len(prompt))])
        assert not moved.emptied and runner.kv.next_pos(1) == len(prompt) + 1
        assert runner.kv.next_pos(0) == len(prompt)  # the source keeps its cells
        assert step(0, []).sampled[0] == moved.sampled[1]  # the copy continues as the original does
    finally:
        runner.free_sampler(sampler)
        runner.close()
