"""The engine on the bundled Gemma 3 270M, for real: batching, order, determinism,
streaming, cancel, prefix cache (also past Gemma 3's 512-token sliding window), bad
input, queue limits, grammars, chat, token-id prompts and model load errors. The prefix
cache, grammar, stop-string and token-id tests run on SmolLM2 too (`family_engine`).

Kept small (few tokens) so the file runs in well under a minute on 2 cores.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from llamabatch import Delta, Engine, EngineConfig, ModelLoadError, QueueFull, SamplingParams

from family_engines import family_engine_of
from llamabatch.llama.cpu_kernels import cpu_extra_buffer_types

GREEDY = SamplingParams(temperature=0, max_tokens=8)
WAIT = 180  # seconds before a test calls the engine hung (SmolLM2's Q4_1 prefill is slow here, and a loaded machine multiplies it)


def long_prompt(n_facts: int = 55) -> str:
    """About 700 tokens: longer than Gemma 3's 512-token sliding window."""
    return " ".join(f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(n_facts))


@pytest.fixture(scope="module")
def engine(model_path):
    """8 slots of 1024 tokens each, shared by the tests that do not need their own."""
    with Engine(EngineConfig(model=model_path, n_parallel=8, n_ctx=8 * 1024)) as eng:
        yield eng


@pytest.fixture(scope="module")
def family_engine(request, family):
    """`engine` on each model family (the Gemma one is `engine` itself): for the tests of paths
    that depend on the architecture, the vocabulary or the tokenizer."""
    yield from family_engine_of(request, family, n_parallel=8, n_ctx=8 * 1024)


@pytest.fixture(scope="module")
def one_slot(model_path):
    """One slot and room for one waiting request: for cancel and queue-limit tests."""
    with Engine(EngineConfig(model=model_path, n_parallel=1, n_ctx=512, max_queue=1)) as eng:
        yield eng


def first_delta_event(engine_, prompt, params):
    """Submit and return (handle, event set when the first streamed text arrives)."""
    got = threading.Event()

    def on_item(handle, item):
        if isinstance(item, Delta) and item.token_ids:
            got.set()

    return engine_.submit(prompt, params, callback=on_item), got


# -- batching and order ------------------------------------------------------------------------

def test_sixteen_prompts_through_eight_slots_finish_in_input_order(engine):
    prompts = [f"Question {i}: name a colour of the rainbow number {i}." for i in range(16)]
    before = engine.telemetry.totals.ticks
    results = engine.generate(prompts, GREEDY)
    ticks = list(engine.telemetry.recent_ticks)[-(engine.telemetry.totals.ticks - before):]
    assert len(results) == 16
    for prompt, r in zip(prompts, results):
        assert r.ok and r.finish_reason in ("stop", "length"), r.error
        assert r.usage.prompt_tokens == len(engine.tokenize(prompt))
        assert 0 < r.usage.completion_tokens <= 8 and r.text
    assert [r.request_id for r in results] == sorted(r.request_id for r in results)
    # really batched: several slots decoded in one llama_decode, and never more than 8
    assert max(t.decode_tokens for t in ticks) > 1
    # (a decode chunk's guess rows, speculative decoding, are not requests: drafted_tokens)
    assert all(t.decode_tokens - t.drafted_tokens <= 8 and t.batch_size <= 512 for t in ticks)
    stats = engine.stats()
    assert stats.slots_idle == 8 and stats.queue_depth == 0


def test_megabytes_of_spaces_fail_fast_and_the_others_run(engine):
    # tokenizing a long run of spaces is about quadratic in llama.cpp (640k took
    # 3.6 s), so 2 MB of them held the submitting thread for ~30 s; now refused by their bytes
    # (more than 1024 tokens of at most 48 bytes each) before tokenizing
    started = time.perf_counter()
    huge = engine.submit(" " * 2_000_000, SamplingParams(max_tokens=4))
    refused_in = time.perf_counter() - started
    fine = engine.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=4))[0]
    result = huge.result(timeout=5)
    assert result.error_code == "context_overflow" and "bytes" in result.error, result
    assert refused_in < 2.0, f"{refused_in:.2f}s to refuse it"
    assert fine.finish_reason == "length" and fine.text.strip()


def test_greedy_and_seeded_output_is_repeatable_across_engines(model_path):
    """Same settings, same schedule -> the same tokens. llama.cpp's CPU kernels round
    differently for different batch shapes, so the prompts are all submitted before the
    engine thread can start its first tick (inside hold()); otherwise the first tick
    could hold fewer prompts in one run than in the other."""
    prompts = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Water boils at"]
    params = [SamplingParams(temperature=0, max_tokens=12)] * 3 + [SamplingParams(temperature=0.9, max_tokens=12,
                                                                                  seed=1234)]
    runs = []
    for _ in range(2):
        with Engine(EngineConfig(model=model_path, n_parallel=4, n_ctx=4 * 256)) as eng:
            with eng.hold():
                handles = [eng.submit(p, sp, stream=False) for p, sp in zip(prompts, params)]
            results = [h.result(WAIT) for h in handles]
            first_tick = eng.telemetry.recent_ticks[0]
        assert first_tick.prefill_tokens == sum(r.usage.prompt_tokens for r in results)
        assert results[3].seed == 1234  # the seed is echoed (greedy ones get a random one)
        runs.append([(r.text, r.token_ids) for r in results])
    assert runs[0] == runs[1]
    assert all(text for text, _ in runs[0])


# -- streaming and cancel -------------------------------------------------------------------------

def test_streamed_deltas_join_to_the_final_text(engine):
    h = engine.submit("Le café près de la gare sert", SamplingParams(temperature=0, max_tokens=24))
    deltas = list(h)
    r = h.result(WAIT)
    assert "".join(d.text for d in deltas) == r.text
    assert [t for d in deltas for t in d.token_ids] == r.token_ids
    assert "\ufffd" not in r.text
    assert len(r.token_ids) == r.usage.completion_tokens == 24


def test_cancel_frees_the_slot_for_the_next_request(one_slot):
    long, started = first_delta_event(one_slot, "Count to a thousand: 1, 2, 3,",
                                      SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    nxt = one_slot.submit("The capital of Italy is", GREEDY)
    assert started.wait(WAIT)
    assert one_slot.stats().queue_depth == 1
    long.cancel()
    r_long, r_next = long.result(WAIT), nxt.result(WAIT)
    assert r_long.finish_reason == "cancelled" and 0 < r_long.usage.completion_tokens < 400
    assert r_next.ok and r_next.usage.completion_tokens > 0
    stats = one_slot.stats()
    assert stats.slots_idle == 1 and stats.queue_depth == 0


def test_full_queue_rejects_with_queue_full(one_slot):
    running, started = first_delta_event(one_slot, "Count slowly: 1, 2, 3,",
                                         SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    assert started.wait(WAIT)
    queued = one_slot.submit("Hello", GREEDY)
    with pytest.raises(QueueFull):
        one_slot.submit("One too many", GREEDY)
    running.cancel()
    assert running.result(WAIT).finish_reason == "cancelled"
    assert queued.result(WAIT).ok


# -- prefix cache --------------------------------------------------------------------------------

@pytest.mark.parametrize("shared", ["short", "long"])
def test_follow_up_prompt_reuses_the_cached_prefix(family_engine, family, shared):
    engine = family_engine
    # long: past Gemma's 512-token sliding window; SmolLM2 has none (and its Q4_1 prefill is slow
    # here), so its long prefix is past one 256-token prefill chunk instead
    long = long_prompt() if family.sliding_window else long_prompt(24)
    base = ("You are a careful assistant. Answer briefly. " * 4) if shared == "short" else long
    n_base = len(engine.tokenize(base))
    if shared == "long":
        assert (family.sliding_window or 256) < n_base < engine.slot_ctx - 64
    first = engine.submit(base, GREEDY).result(WAIT)
    assert first.ok
    follow = base + " Now, in one sentence, what did you learn?"
    r = engine.submit(follow, GREEDY).result(WAIT)
    assert r.ok
    assert r.usage.cached_tokens >= 0.9 * n_base
    assert r.usage.prompt_tokens == len(engine.tokenize(follow))


def test_cached_prefix_past_the_window_gives_the_same_answer_as_a_cold_start(model_path, cpu_path):
    """swa_full is what makes this true: with the sliding window's cells gone, a trimmed
    prefix would be silently wrong and the greedy answer would change. The cold start
    evaluates the suffix inside a longer chunk than the warm one does, so the two agree to
    the bit only where a row's numbers do not depend on its chunk: deterministic mode."""
    base = long_prompt(45)  # 566 tokens: just past the window, each of them prefilled 3 times here
    follow = base + " Fact 45: the number 45 is"
    params = SamplingParams(temperature=0, max_tokens=6)
    det = dict(model=model_path, n_parallel=1, n_ctx=1024, deterministic=True, cpu_buffers=cpu_path)
    with Engine(EngineConfig(**det)) as warm:
        warm.submit(base + " Fact 99: the number", params).result(WAIT)  # diverges after the base
        hot = warm.submit(follow, params).result(WAIT)
    with Engine(EngineConfig(**det, cache_prompt=False)) as cold_eng:
        cold = cold_eng.submit(follow, params).result(WAIT)
    assert hot.usage.cached_tokens > 512 and cold.usage.cached_tokens == 0
    assert hot.text == cold.text and hot.usage.completion_tokens == 6


# -- bad input -----------------------------------------------------------------------------------

def test_over_long_prompt_fails_alone(engine):
    too_long = [236761] * engine.slot_ctx  # token ids: exactly one slot, no room to answer
    results = engine.generate(["Hello there,", too_long, long_prompt(5), ""], GREEDY)
    assert [r.finish_reason for r in results] == [results[0].finish_reason, "error", results[2].finish_reason, "error"]
    assert results[0].ok and results[2].ok
    assert results[1].error_code == "context_overflow" and f"{engine.slot_ctx:,}" in results[1].error
    assert results[3].error_code == "invalid_request"
    assert all("\n" not in (r.error or "") for r in results)


def test_bad_grammar_and_bad_params_are_request_errors(engine):
    bad_grammar = engine.submit("x", SamplingParams(grammar="root ::= (", max_tokens=4)).result(WAIT)
    bad_schema = engine.submit("x", SamplingParams(json_schema={"type": "no-such-type"}, max_tokens=4)).result(WAIT)
    bad_token = engine.submit([2, 10**9], GREEDY).result(WAIT)
    for r in (bad_grammar, bad_token):
        assert r.finish_reason == "error" and r.error_code == "invalid_request" and "\n" not in r.error
    assert bad_schema.finish_reason in ("error", "stop", "length")  # a lenient converter may accept it
    assert engine.submit("Still fine:", GREEDY).result(WAIT).ok


# -- sampling features ---------------------------------------------------------------------------

def test_json_schema_constrains_the_output(family_engine):
    engine = family_engine
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    # an example first: alone, "Describe a person as JSON:" led the base model into an endless
    # run of zeros, which llama.cpp's converter cut at 16 digits and a JSON schema does not
    # (docs/structured-output.md)
    r = engine.submit('A person as JSON: {"age": 31}\nAnother person as JSON:',
                      SamplingParams(temperature=0, max_tokens=40, json_schema=schema)).result(WAIT)
    assert r.finish_reason == "stop", (r.text, r.finish_reason)
    data = json.loads(r.text)
    assert isinstance(data["age"], int)


def test_gbnf_grammar_constrains_the_output(family_engine):
    engine = family_engine
    r = engine.submit("Is the sky blue? Answer:", SamplingParams(temperature=0.7, seed=3, max_tokens=8,
                                                                     grammar='root ::= " yes" | " no"')).result(WAIT)
    assert r.text in (" yes", " no") and r.finish_reason == "stop"


def test_grammar_with_ignore_eos_or_min_tokens_ends_when_the_grammar_does(engine):
    """Once a grammar is complete only EOG is allowed: banning it must not abort the process."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    for extra in ({"ignore_eos": True}, {"min_tokens": 30}):
        r = engine.submit("A JSON object with a number:", SamplingParams(temperature=0, max_tokens=40,
                                                                          json_schema=schema, **extra)).result(WAIT)
        assert r.finish_reason in ("stop", "length")
        if r.finish_reason == "stop":
            assert isinstance(json.loads(r.text)["n"], int)


def test_penalties_min_tokens_and_logprobs(engine):
    pen = engine.submit("List fruits: apple, apple, apple,", SamplingParams(
        temperature=0, max_tokens=8, repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5)).result(WAIT)
    assert pen.ok and pen.usage.completion_tokens > 0
    mins = engine.submit("Say OK.", SamplingParams(temperature=0, max_tokens=12, min_tokens=10)).result(WAIT)
    assert mins.ok and mins.usage.completion_tokens >= 10
    lp = engine.submit("The capital of France is", SamplingParams(temperature=0, max_tokens=3, logprobs=2)).result(WAIT)
    assert len(lp.logprobs) == 3
    for rec, tok in zip(lp.logprobs, lp.token_ids):
        assert rec["id"] == tok and rec["logprob"] <= 0
        assert len(rec["top_logprobs"]) == 2
        assert rec["top_logprobs"][0]["id"] == tok  # greedy: the chosen token is the top one


def test_stop_string_ends_generation_and_is_excluded(family):
    # The stop string is taken from the model's own answer (whatever these kernels make of
    # it), and the run repeated with it: one slot, no prompt cache, so both runs have the
    # same shapes and the same tokens up to the stop.
    with Engine(EngineConfig(model=family.path, n_parallel=1, n_ctx=512, cache_prompt=False)) as eng:
        params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        full = eng.submit("Counting: 1, 2, 3, 4,", params).result(WAIT).text
        cut = len(full) // 2
        stop = full[cut:cut + 3]
        assert len(stop) == 3 and stop.strip()
        r = eng.submit("Counting: 1, 2, 3, 4,", params.replace(stop=[stop])).result(WAIT)
    assert r.finish_reason == "stop" and r.stop == stop
    assert stop not in r.text and r.text == full[:full.index(stop)]


# -- prompt forms --------------------------------------------------------------------------------

def test_chat_messages_render_with_the_fallback_template_and_generate(engine):
    assert "tokenizer.chat_template" not in engine.runner.metadata  # the base GGUF has none
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]
    rendered = engine.render_chat(messages)
    assert "Name a fruit." in rendered and rendered.endswith("model\n")
    r = engine.submit(messages, GREEDY).result(WAIT)
    assert r.ok and r.usage.completion_tokens > 0
    assert r.usage.prompt_tokens == len(engine.tokenize(rendered, special=True))


def test_pre_tokenized_prompt_matches_the_text_prompt(family_engine):
    # Gemma's tokenizer adds a BOS, SmolLM2's adds none: the ids request must match either way
    engine = family_engine
    text = "1, 2, 3, 4, 5,"
    ids = engine.tokenize(text)
    by_text = engine.submit(text, GREEDY).result(WAIT)
    by_ids = engine.submit(ids, GREEDY).result(WAIT)
    assert by_ids.ok and by_ids.usage.prompt_tokens == len(ids)
    # the same tokens: the ids request finds the text request's whole prompt in the cache (all
    # but the last token, which is evaluated again to sample from)
    assert by_text.ok and by_ids.usage.cached_tokens >= len(ids) - 1


# -- model load errors ---------------------------------------------------------------------------

def test_missing_or_non_gguf_model_is_a_one_line_model_load_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model\n" * 10)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then nothing usable
    # Each weight layout loads differently: "repack" reads the tensor table itself before
    # llama.cpp does (what auto picks where AMX is built in but cannot run), and must fail the same way.
    layouts = ["auto", "plain"] + (["repack"] if "CPU_REPACK" in cpu_extra_buffer_types() else [])
    for layout in layouts:
        for path, words in ((missing, "no such"), (junk, "not a GGUF"), (broken, "")):
            with pytest.raises(ModelLoadError) as info:
                Engine(EngineConfig(model=str(path), n_parallel=1, cpu_buffers=layout))
            msg = str(info.value)
            assert str(path) in msg and "\n" not in msg and words in msg, (layout, msg)
