"""Sampling apart from the tick (llamabatch/core/sampling_threads.py) on the bundled Gemma 3 270M, with grammars in
llama.cpp's sampler (grammar_backend llama: token masks sample inline): the tokens are
the ones inline sampling gives, a large JSON-schema enum beside plain requests finishes, and
the supervised child samples apart too. Kept small: one or two slots, few tokens."""
from __future__ import annotations

import json

from llamabatch import Delta, Engine, EngineConfig, SamplingParams
from llamabatch.supervised import SupervisedEngine

from child_tools import child_env
from supervised_child_runner import choice

WAIT = 600  # generous: the large enum's tokens cost seconds each on a busy 2-core machine


def test_sampled_apart_gives_the_tokens_inline_sampling_gives(model_path):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    cases = [("A person as JSON:", SamplingParams(temperature=0, max_tokens=12, json_schema=schema, logprobs=2)),
             ("Colour:", SamplingParams(temperature=0.9, seed=11, max_tokens=6, grammar='root ::= "red" | "green" | [a-z]+')),
             ("Three words:", SamplingParams(temperature=0.8, seed=5, max_tokens=6, n=2, grammar='root ::= [a-z ]+'))]

    def run(apart: bool):
        # a fresh engine and one request at a time: both runs evaluate the same batches
        with Engine(EngineConfig(model=model_path, n_parallel=2, n_ctx=1024, grammar_backend="llama")) as engine:
            assert engine.sampling_threads is not None
            if not apart:
                engine.scheduler.sample_apart = None  # every row sampled inline, on the engine thread
            return [engine.submit(p, sp).result(timeout=WAIT) for p, sp in cases]

    apart, inline = run(True), run(False)
    for a, b in zip(apart, inline):
        assert a.ok and b.ok
        assert a.token_ids == b.token_ids and a.text == b.text
        assert [s.token_ids for s in a.samples or []] == [s.token_ids for s in b.samples or []]
        assert a.logprobs == b.logprobs
    assert apart[0].logprobs and len(apart[0].logprobs) == len(apart[0].token_ids)


def test_a_large_enum_beside_plain_requests_finishes_and_they_finish_too(model_path):
    # 400 grammar stacks (the llama backend takes at most 500 alternatives): a second or so a token, a few tokens
    values = [f"v{i}" for i in range(400)]
    order: list[str] = []

    def note(name):
        return lambda handle, item: order.append(name if not isinstance(item, Delta) else f"{name} token")

    with Engine(EngineConfig(model=model_path, n_parallel=3, n_ctx=3 * 256, grammar_backend="llama")) as engine:
        enum = engine.submit("Pick one:", SamplingParams(temperature=0, max_tokens=12, json_schema={"enum": values}),
                             callback=note("enum"))
        plain = [engine.submit(f"Count to {i}:", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                               callback=note(f"plain {i}")) for i in range(2)]
        results = [h.result(timeout=WAIT) for h in [enum, *plain]]
    assert results[0].finish_reason == "stop" and json.loads(results[0].text) in values
    assert all(r.finish_reason == "length" and r.usage.completion_tokens == 8 for r in results[1:])
    assert order.count("enum") == order.count("plain 0") == order.count("plain 1") == 1


def test_the_supervised_child_samples_apart(model_path):
    config = EngineConfig(n_parallel=2, n_ctx=512, threads=1, grammar_backend="llama")
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    with SupervisedEngine(config, default_params=greedy, env=child_env(), runner=choice("slow_grammar")) as engine:
        slow = engine.submit("slow: spell", greedy.replace(grammar="root ::= [a-z]+"))
        plain = [engine.submit(f"plain {i}") for i in range(4)]
        assert [h.result(timeout=60).text for h in plain] == [f"plain {i}"[:6] for i in range(4)]
        assert not slow.done  # its first token is still being sampled (30 s)
        slow.cancel()
        assert slow.result(timeout=20).finish_reason == "cancelled"
