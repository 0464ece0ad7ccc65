"""Speculative decoding on the scripted FakeRunner (no model): guesses from a prediction or
prompt lookup ride on decode chunks, verification keeps exactly the tokens the request would
get without them, the turned-down guesses' cells leave by Trims, and usage and telemetry
count them."""
from __future__ import annotations

from dataclasses import replace

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

from fake_runner import FakeRunner, text_tokens

ANSWER = "the cat sat on the mat and the dog sat on the log, then both of them slept."
PREDICTION = "teh cat sat on teh mat and the dog sat on the log, then both of them slept."


def engine_for(runner: FakeRunner, n_batch: int = 64, chunk_size: int = 32, **config) -> Engine:
    runner.n_batch = n_batch
    return Engine(EngineConfig(n_parallel=runner.n_slots, n_batch=n_batch, chunk_size=chunk_size, **config),
                  runner=runner, default_params=SamplingParams(temperature=0, max_tokens=200))


def run(prompts, params=None, *, n_slots=2, reply=None, **config):
    runner = FakeRunner(n_slots=n_slots, slot_ctx=256, reply=reply or (lambda p: ANSWER), can_verify=True)
    with engine_for(runner, **config) as engine:
        results = engine.generate(prompts, params)
        stats = engine.stats()
    assert runner.violations == []
    return results, stats, runner


def draft_chunks(runner: FakeRunner):
    return [c for p in runner.plans for c in p.plan.chunks if c.n_draft]


def test_a_prediction_gives_the_same_answer_in_fewer_ticks():
    params = SamplingParams(temperature=0, max_tokens=200, prediction=PREDICTION)
    (on,), stats, runner = run(["fix: " + PREDICTION], [params])
    (off,), off_stats, _ = run(["fix: " + PREDICTION], [params], speculative="off")
    assert on.text == off.text == ANSWER and on.token_ids == off.token_ids
    assert on.finish_reason == off.finish_reason == "stop"
    assert on.usage.accepted_prediction_tokens > len(ANSWER) // 2
    assert on.usage.rejected_prediction_tokens > 0  # "teh" twice
    assert off.usage.accepted_prediction_tokens == off.usage.rejected_prediction_tokens == 0
    assert stats.ticks < off_stats.ticks / 2
    assert draft_chunks(runner)
    # telemetry: the guesses verified and those that joined answers
    assert stats.accepted_tokens == on.usage.accepted_prediction_tokens
    assert stats.drafted_tokens == on.usage.accepted_prediction_tokens + on.usage.rejected_prediction_tokens


def test_turned_down_guesses_leave_the_slot_by_a_trim():
    params = SamplingParams(temperature=0, max_tokens=200, prediction=PREDICTION)
    (result,), _, runner = run(["fix: " + PREDICTION], [params], n_slots=1)
    # the fake checks every chunk starts where the slot's cache ends: a guess left behind would fail it
    assert any(n_keep > 0 for _, n_keep in runner.trims)
    prompt = text_tokens("fix: " + PREDICTION)
    assert runner.kv[0][:len(prompt) + len(ANSWER)] == prompt + text_tokens(ANSWER)


def test_prompt_lookup_drafts_without_a_prediction():
    quote = "the quick brown fox jumps over the lazy dog"
    (result,), stats, runner = run([f"quote this: {quote}"], reply=lambda p: "here: " + quote)
    assert result.text == "here: " + quote
    assert result.usage.accepted_prediction_tokens > len(quote) // 2
    assert stats.accepted_tokens == result.usage.accepted_prediction_tokens


@pytest.mark.parametrize("speculative", [None, "off"])
def test_off_by_setting_or_per_request(speculative, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=200, prediction=PREDICTION,
                            speculative=speculative is not None)
    monkeypatch.setenv("LLAMABATCH_SPECULATIVE", "off")  # and the environment, when the setting says nothing
    (result,), stats, runner = run(["fix: " + PREDICTION], [params])
    assert result.text == ANSWER
    assert stats.drafted_tokens == 0 and not draft_chunks(runner)


def test_stops_and_max_tokens_cut_inside_kept_guesses():
    stop = SamplingParams(temperature=0, max_tokens=200, prediction=ANSWER, stop=["dog"])
    short = SamplingParams(temperature=0, max_tokens=20, prediction=ANSWER)
    (stopped, cut), _, runner = run(["a", "b"], [stop, short])
    assert stopped.text == ANSWER[:ANSWER.index("dog")] and stopped.stop == "dog"
    assert cut.text == ANSWER[:20] and cut.finish_reason == "length" and cut.usage.completion_tokens == 20
    assert all(len(c.tokens) - c.n_draft >= 1 for c in draft_chunks(runner))


def test_logprobs_come_for_every_token_kept():
    params = SamplingParams(temperature=0, max_tokens=200, prediction=ANSWER, logprobs=2)
    (result,), _, _ = run(["x"], [params])
    assert result.text == ANSWER
    assert [r["id"] for r in result.logprobs] == result.token_ids
    assert result.usage.accepted_prediction_tokens > 0


def test_guesses_take_only_rows_the_tick_has_to_spare():
    long_prompts = ["p" * 150 + str(i) for i in range(3)]
    params = [SamplingParams(temperature=0, max_tokens=60, prediction=ANSWER)] + \
             [SamplingParams(temperature=0, max_tokens=8)] * 3
    results, _, runner = run(["go"] + long_prompts, params, n_slots=4, n_batch=40, chunk_size=16)
    assert results[0].text == ANSWER[:60]
    assert all(executed.plan.n_tokens <= 40 for executed in runner.plans)
    # while a prompt is prefilled the tick happens for its sake and a guess only adds a row:
    # guesses wait for the ticks that decode alone
    guessing = [executed.plan for executed in runner.plans if executed.plan.draft_tokens]
    assert guessing and all(c.is_decode for plan in guessing for c in plan.chunks)
    assert any(not c.is_decode for executed in runner.plans for c in executed.plan.chunks)


def test_n_samples_draft_each_on_its_own():
    quote = "one two three four five six seven eight"
    params = SamplingParams(temperature=0, max_tokens=100, n=2)
    (result,), stats, runner = run([f"say {quote}"], [params], reply=lambda p: quote)
    assert [s.text for s in result.samples] == [quote, quote]
    assert result.usage.accepted_prediction_tokens == sum(s.usage.accepted_prediction_tokens for s in result.samples)
    assert stats.accepted_tokens > 0


def test_cancel_while_guessing_leaves_a_usable_slot():
    runner = FakeRunner(n_slots=1, slot_ctx=256, reply=lambda p: ANSWER if p.startswith("a") else "ok",
                        can_verify=True, step_delay=0.01)
    with engine_for(runner) as engine:
        handle = engine.submit("a", SamplingParams(temperature=0, max_tokens=200, prediction=ANSWER))
        for _ in handle:
            handle.cancel()
            break
        cancelled = handle.result()
        after = engine.generate(["b"])[0]
    assert cancelled.finish_reason == "cancelled"
    assert after.text == "ok"
    assert runner.violations == []


@pytest.mark.parametrize("prediction, message", [
    (5, "prediction must be"),
    ({"type": "text", "content": "x"}, 'prediction type must be "content"'),
    ({"type": "content", "content": [{"type": "image"}]}, "prediction content part 1"),
    ({"type": "content"}, "prediction content must be"),
])
def test_bad_predictions_are_the_requests_error(prediction, message):
    with pytest.raises(Exception, match=message):
        SamplingParams.from_dict({"prediction": prediction})


def test_prediction_forms_and_rules():
    text = SamplingParams.from_dict({"prediction": {"type": "content", "content": [
        {"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}}).prediction
    assert text == "abcd"
    assert SamplingParams.from_dict({"prediction": {"type": "content", "content": "x"}}).prediction == "x"
    with pytest.raises(Exception, match="prediction cannot be combined with n > 1"):
        SamplingParams(prediction="x", n=2).validate()


def test_a_prediction_longer_than_the_slot_is_refused():
    runner = FakeRunner(n_slots=1, slot_ctx=64, can_verify=True)
    with engine_for(runner) as engine:
        result = engine.generate(["hi"], [SamplingParams(prediction="x" * 100)])[0]
    assert result.finish_reason == "error" and result.error_code == "context_overflow"
    assert "prediction has 100 tokens" in result.error


def test_usage_records_carry_completion_tokens_details():
    params = SamplingParams(temperature=0, max_tokens=200, prediction=PREDICTION)
    (result,), _, _ = run(["fix"], [params])
    details = result.to_dict()["usage"]["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": result.usage.accepted_prediction_tokens,
                       "rejected_prediction_tokens": result.usage.rejected_prediction_tokens}


def test_guesses_are_cut_at_the_first_token_the_grammar_forbids():
    # sampled inline, as a token-mask grammar is (one in llama.cpp's sampler is sampled apart: no guesses)
    runner = FakeRunner(n_slots=1, slot_ctx=256, reply=lambda p: "1234567890", can_verify=True,
                        grammar_allows=lambda tok: chr(tok).isdigit(), can_sample_apart=False)
    params = SamplingParams(temperature=0, max_tokens=50, grammar='root ::= [0-9]+', prediction="12345ab67890")
    with engine_for(runner) as engine:
        result = engine.generate(["digits"], [params])[0]
    assert result.text == "1234567890"
    assert runner.violations == []
    guessed = [c.tokens[len(c.tokens) - c.n_draft:] for c in draft_chunks(runner)]
    assert guessed and all(chr(t).isdigit() for g in guessed for t in g)


def test_deterministic_mode_verifies_guesses_within_the_runners_limits():
    # deterministic mode pads every decode token with rows of its own stream (batch_invariance.py):
    # a guess takes a padding row at no cost, and no slot takes more rows than the pass can pad,
    # which the runner says through its capabilities' max_draft and free_draft; the answer is the very tokens of --speculative off
    params = SamplingParams(temperature=0, max_tokens=200, prediction=PREDICTION)
    runner = FakeRunner(n_slots=2, slot_ctx=256, reply=lambda p: ANSWER, can_verify=True)
    runner.capabilities = replace(runner.capabilities, max_draft=1, free_draft=1)
    with engine_for(runner, deterministic=True) as engine:
        (result,) = engine.generate(["fix: " + PREDICTION], [params])
        stats = engine.stats()
    assert runner.violations == []
    assert result.text == ANSWER
    chunks = draft_chunks(runner)
    assert stats.drafted_tokens > 0 and chunks and all(c.n_draft == 1 for c in chunks)
    assert result.usage.accepted_prediction_tokens > 0
