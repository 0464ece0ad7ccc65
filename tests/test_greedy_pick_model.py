"""Greedy requests on the bundled model give the same tokens with the in-place pick
(llamabatch/llama/sampling/greedy_pick.py) as with llama.cpp's sampler chain: the two runs evaluate the
same batches, so they see the same logits on any kernel path, and only the pick differs."""
from __future__ import annotations

import math


from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.llama.sampling import samplers


def run(model_path, cases, in_place: bool, monkeypatch):
    with monkeypatch.context() as patch:
        if not in_place:
            patch.setattr(samplers, "_only_bias_and_greedy", lambda params, masked=False: False)
        with Engine(EngineConfig(model=model_path, n_parallel=2, n_ctx=1024)) as engine:
            # one request at a time: both runs evaluate the same batches
            return [engine.submit(prompt, params).result(timeout=300) for prompt, params in cases]


def test_the_in_place_pick_gives_the_chains_tokens(model_path, monkeypatch):
    plain = SamplingParams(temperature=0, max_tokens=12)
    first = run(model_path, [("The capital of France is", plain)], True, monkeypatch)[0]
    top = first.token_ids[0]
    cases = [("The capital of France is", plain),
             ("Count: one, two,", plain.replace(ignore_eos=True, logprobs=2)),
             ("The capital of France is", plain.replace(logit_bias={top: -math.inf})),  # the top token banned
             ("The capital of France is", plain.replace(logit_bias={top: -0.5, 1000: 3.0})),
             ("Say nothing.", plain.replace(min_tokens=6)),  # the twin that cannot pick EOG
             ("Say nothing.", plain.replace(n=2))]
    in_place, chain = run(model_path, cases, True, monkeypatch), run(model_path, cases, False, monkeypatch)
    for (prompt, params), a, b in zip(cases, in_place, chain):
        assert a.ok and b.ok, (a.error, b.error)
        assert a.token_ids == b.token_ids, (prompt, params)
        assert a.logprobs == b.logprobs
        assert [s.token_ids for s in a.samples or []] == [s.token_ids for s in b.samples or []]
    assert in_place[2].token_ids[0] != top and in_place[0].token_ids[0] == top
    assert in_place[4].usage.completion_tokens >= 6


def test_a_greedy_chain_with_penalties_is_not_picked_in_place(model_path):
    with Engine(EngineConfig(model=model_path, n_parallel=1, n_ctx=512)) as engine:
        factory = engine.runner.samplers
        fast = factory.build(SamplingParams(temperature=0, ignore_eos=True), 0)
        penalised = factory.build(SamplingParams(temperature=0, repeat_penalty=1.3), 0)
        sampled = factory.build(SamplingParams(temperature=0.7), 0)
        try:
            assert fast.greedy is not None and fast.greedy.biased  # EOG banned by ignore_eos
            assert penalised.greedy is None and sampled.greedy is None
        finally:
            for s in (fast, penalised, sampled):
                factory.free(s)
