"""Tokens a grammar forces (llama/sampling/mask_grammar.py) on the scripted FakeRunner: they join the
output unsampled, are evaluated as one chunk with the next decode token, and every stop, length
and slot bound still holds token by token. No model."""
from __future__ import annotations

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.scheduling.policies import POLICIES

from fake_runner import FakeRunner, text_tokens

REPLY = '{"name": "Ada", "age": 36}'


def structure_forced(text: str) -> int:
    """Force the reply's next characters while they are JSON punctuation or a key, as a
    schema's grammar would: everything but the values."""
    rest = REPLY[len(text):]
    n = 0
    for ch in rest:
        if ch.isdigit() or ch in "Ad":
            break
        n += 1
    return n


def engine_for(runner: FakeRunner, **config) -> Engine:
    runner.n_batch = 64
    return Engine(EngineConfig(n_parallel=runner.n_slots, n_batch=64, chunk_size=16, **config), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=64))


def test_forced_tokens_join_the_output_and_are_evaluated_in_one_chunk():
    runner = FakeRunner(n_slots=2, slot_ctx=128, reply=lambda p: REPLY, force=structure_forced)
    with engine_for(runner) as engine:
        result = engine.generate(["go"])[0]
        stats = engine.stats()
    assert result.text == REPLY and result.finish_reason == "stop"
    assert result.usage.completion_tokens == len(REPLY)
    forced = len(REPLY) - sum(ch.isdigit() or ch in "Ad" for ch in REPLY) - 1  # all but values and the first
    assert stats.forced_tokens == forced == result.forced_tokens
    decode_chunks = [c for p in runner.plans for c in p.plan.chunks if c.is_decode]
    assert max(len(c.tokens) for c in decode_chunks) > 1  # a forced run went in with its decode token
    # one tick per sampled token (plus the prompt's), not one per token
    assert stats.ticks <= 1 + (len(REPLY) - forced) + 1
    assert runner.violations == []
    # the KV holds the prompt and every token of the reply, in order
    assert any(runner.kv[s][-len(REPLY):] == text_tokens(REPLY) for s in range(2))


def test_stops_and_max_tokens_cut_inside_a_forced_run():
    runner = FakeRunner(n_slots=2, slot_ctx=128, reply=lambda p: REPLY, force=structure_forced)
    with engine_for(runner) as engine:
        stopped, cut = engine.generate(["a", "b"], [SamplingParams(temperature=0, max_tokens=64, stop=['"age'],),
                                                   SamplingParams(temperature=0, max_tokens=4)])
        stats = engine.stats()
    # telemetry counts the forced tokens the requests kept, not the ones the cut dropped
    assert stats.forced_tokens == stopped.forced_tokens + cut.forced_tokens
    assert stopped.text == '{"name": "Ada", ' and stopped.finish_reason == "stop" and stopped.stop == '"age'
    assert cut.text == REPLY[:4] and cut.finish_reason == "length" and cut.usage.completion_tokens == 4


def test_a_forced_run_ends_at_the_slot_end():
    runner = FakeRunner(n_slots=1, slot_ctx=12, reply=lambda p: REPLY, force=structure_forced)
    with engine_for(runner) as engine:
        result = engine.generate(["go"])[0]
    assert result.finish_reason == "length"
    assert result.usage.prompt_tokens + result.usage.completion_tokens == 12
    assert result.text == REPLY[:12 - result.usage.prompt_tokens]
    assert runner.violations == []


def test_forced_tokens_and_plain_requests_share_ticks():
    runner = FakeRunner(n_slots=3, slot_ctx=128,
                        reply=lambda p: REPLY if p.startswith("json") else "plain text reply",
                        force=lambda text: structure_forced(text) if text.startswith("{") else 0)
    with engine_for(runner) as engine:
        results = engine.generate(["json 1", "plain", "json 2"])
    assert [r.text for r in results] == [REPLY, "plain text reply", REPLY]
    assert runner.violations == []


def test_every_policy_gives_a_generating_sequence_its_pending_tokens():
    # a generating sequence with 4 pending (its sampled token and 3 forced), one with 1
    pending = {"g4": 4, "g1": 1, "p": 100}
    for name, policy in POLICIES.items():
        out = dict(policy(["g4", "g1"], ["p"], 64, 16, lambda s: pending[s]))
        assert out["g4"] == 4 and out["g1"] == 1, name
        assert sum(out.values()) <= 64, name
    # a budget too small for the forced run: it goes in part, never past the budget
    out = POLICIES["decode-maximal"](["g4", "g1"], [], 3, 16, lambda s: pending[s])
    assert out == [("g4", 3)]


def test_a_grammar_that_stops_mid_answer_ends_only_its_request():
    runner = FakeRunner(n_slots=2, slot_ctx=128, reply=lambda p: "some reply")
    with engine_for(runner) as engine:
        stopped = engine.submit("a", SamplingParams(temperature=0, max_tokens=32, grammar="STOPS"))
        fine = engine.generate(["b", "c"])
        after = engine.generate(["d"])[0]  # the engine thread is alive
        result = stopped.result(5)
    assert result.finish_reason == "error" and result.error_code == "invalid_request"
    assert result.error == "the grammar stopped the answer: fake" and result.text == "so"
    assert [r.text for r in fine] == ["some reply", "some reply"] and after.text == "some reply"
    assert runner.violations == []


def test_run_says_which_backend_constrained_its_structured_lines():
    from cli_harness import invoke, runner_for

    lines = ('{"id": 1, "prompt": "a", "json_schema": {"type": "object"}}\n{"id": 2, "prompt": "b"}\n'
             '{"id": 3, "prompt": "c", "grammar": "STOPS"}\n')
    out = invoke(["run", "-", "--n-parallel", "2"], input=lines, runner=runner_for(reply=lambda p: " x"))
    assert out.exit_code == 0, out.stderr
    summary = [line for line in out.stderr.splitlines() if "structured output" in line]
    assert summary == ["llamabatch run: structured output: 1 line(s) through llama.cpp's grammar sampler, "
                       "1 line(s) as llguidance token masks; 0 token(s) forced by the grammar"], out.stderr
    plain = invoke(["run", "-"], input="hello\n", runner=runner_for(reply=lambda p: " x"))
    assert "structured output" not in plain.stderr
