"""Structured output as token masks (llama/sampling/mask_grammar.py) on the real models: the mask against
llama.cpp's own GBNF sampler over fuzzed prefixes, validity over a set of schemas, forced
tokens, deterministic mode across batch compositions, and bad grammars as their own line's error."""
from __future__ import annotations

import ctypes
import json
import random
import time

import jsonschema
import numpy as np
import pytest
from llama_cpp import llama_cpp as C

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.llama.sampling.mask_grammar import MaskGrammars
from llamabatch.llama.vocab import Vocabulary

from structured_schemas import SCHEMAS, lines

WAIT = 300


@pytest.fixture(scope="module")
def smollm2_vocab(smollm2_path):
    from llamabatch.llama.direct_load import load_vocabulary

    model = load_vocabulary(smollm2_path)
    yield Vocabulary(model)
    C.llama_model_free(model)


def gbnf_allowed(sampler, n_vocab: int) -> set[int]:
    """The tokens llama.cpp's grammar sampler leaves (the rest it sets to -inf)."""
    data = (C.llama_token_data * n_vocab)()
    view = np.frombuffer(data, dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]))
    view["id"] = np.arange(n_vocab, dtype=np.int32)
    view["logit"] = 0.0
    C.llama_sampler_apply(sampler, ctypes.byref(C.llama_token_data_array(data, n_vocab, -1, False)))
    return set(np.flatnonzero(view["logit"] != -np.inf).tolist())


def mask_allowed(matcher, n_vocab: int) -> set[int]:
    row = np.zeros(n_vocab, dtype=np.float32)
    matcher.mask_row(row)
    return set(np.flatnonzero(row != -np.inf).tolist())


# Character classes and repetition: both allow exactly the same tokens. Multi-character literals:
# llguidance allows only the tokens that spell the literal as the tokenizer would, a subset of
# llama.cpp's set, which also takes other splits of the same text (docs/structured-output.md).
EQUAL = ['root ::= [0-9]+ "." [0-9] [0-9]', 'root ::= [a-z]+ ("," [a-z]+)*',
         'root ::= ("ab" | "cd")+ "!"', 'root ::= [A-Z] [a-z]{2,5} " " [0-9]{1,3}']
SUBSET = ['root ::= " yes" | " no"', 'root ::= "{\\"a\\": " [0-9]+ ", \\"b\\": \\"" [a-z]* "\\"}"', 'root ::= "hello world" [.!?]']


@pytest.mark.parametrize("grammar", EQUAL + SUBSET)
def test_the_mask_is_llama_cpps_allowed_set_over_fuzzed_prefixes(smollm2_vocab, grammar):
    vocab, n = smollm2_vocab, smollm2_vocab.n_tokens
    masks = MaskGrammars(vocab, "llguidance")
    rng = random.Random(grammar)
    for _trial in range(4):
        llama = C.llama_sampler_init_grammar(vocab.ptr, grammar.encode(), b"root")
        matcher = masks.matcher_for(grammar, None)
        try:
            for _step in range(10):
                ours, theirs = mask_allowed(matcher, n), gbnf_allowed(llama, n)
                assert ours, "the mask allows nothing"
                if grammar in EQUAL:
                    assert ours == theirs, (sorted(ours - theirs)[:5], sorted(theirs - ours)[:5])
                else:
                    assert ours <= theirs, sorted(ours - theirs)[:5]
                choices = sorted(ours - set(vocab.eog_ids))
                if not choices:
                    break
                token = rng.choice(choices)  # a random walk through what both allow
                C.llama_sampler_accept(llama, token)
                matcher.accept(token)
        finally:
            C.llama_sampler_free(llama)


def test_every_answer_validates_over_twenty_schemas(smollm2_path):
    # a line a schema, nested and $ref ones included: lines() gives every schema one prompt, so
    # more lines a schema would only add seeds, not prompts or grammars
    work = lines(len(SCHEMAS))
    with Engine(EngineConfig(model=smollm2_path, n_parallel=8, n_ctx=8 * 1024)) as engine:
        results = engine.generate([messages for _, messages in work],
                                  [SamplingParams(max_tokens=256, temperature=0.7, seed=i, json_schema=SCHEMAS[name])
                                   for i, (name, _) in enumerate(work)])
        stats = engine.stats()
    for (name, _), result in zip(work, results):
        assert result.finish_reason == "stop", (name, result.finish_reason, result.error, result.text)
        assert result.grammar_backend == "llguidance"
        jsonschema.validate(json.loads(result.text), SCHEMAS[name])
    assert 0 < stats.forced_tokens < stats.generated_tokens  # keys, quotes and braces came forced
    assert stats.forced_tokens == sum(r.forced_tokens for r in results)


def test_an_answer_ends_when_its_grammar_allows_nothing_but_the_end(smollm2_path):
    """No tick is spent sampling the end of generation a finished grammar leaves as the only
    token: one request alone, so every tick samples one token of its answer (its first tick
    evaluates the prompt), and the rest of the answer came forced."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    with Engine(EngineConfig(model=smollm2_path, n_parallel=1, n_ctx=1024)) as engine:
        ticks = []
        engine.subscribe(lambda record: ticks.append(record) if getattr(record, "kind", "") == "tick" else None)
        result = engine.generate(["Describe a person as JSON."],
                                 SamplingParams(max_tokens=64, temperature=0, json_schema=schema))[0]
    assert result.finish_reason == "stop" and {"name", "age"} <= set(json.loads(result.text))
    sampled = result.usage.completion_tokens - result.forced_tokens
    assert 0 < result.forced_tokens < result.usage.completion_tokens
    assert len(ticks) == sampled, [(t.prefill_tokens, t.decode_tokens) for t in ticks]


def test_forced_tokens_keep_answers_valid_and_mostly_the_same_on_gemma(model_path):
    # forced spans are the tokenizer's own spelling of the grammar's text, and go in as chunks of
    # their own: what the model sees can differ from token-by-token decoding (another split of
    # the same characters; other batch shapes round differently), so answers may differ. They
    # all validate either way; most are the same (logprobs force none: the token-by-token run)
    work = lines(8)
    answers = {}
    for logprobs in (None, 0):
        with Engine(EngineConfig(model=model_path, n_parallel=4, n_ctx=4 * 1024)) as engine:
            results = engine.generate([m for _, m in work], [
                SamplingParams(max_tokens=128, temperature=0, json_schema=SCHEMAS[name], logprobs=logprobs)
                for name, _ in work])
            answers[logprobs] = [r.text for r in results]
            forced = engine.stats().forced_tokens
        assert (forced > 0) == (logprobs is None)
    for (name, _), text in zip(work, answers[None]):
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    for (name, _), text in zip(work, answers[0]):
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    same = sum(a == b for a, b in zip(answers[None], answers[0]))
    print(f"{same} of {len(work)} answers the same with forced tokens as token by token")
    assert same >= len(work) // 2, list(zip(answers[None], answers[0]))


def test_deterministic_mode_with_grammars_is_bit_identical_alone_and_in_a_batch(model_path):
    schema = SCHEMAS["person"]
    target = lines(1)[0][1]
    params = SamplingParams(max_tokens=64, temperature=0.8, seed=11, json_schema=schema, logprobs=1)
    others = [m for _, m in lines(6)[1:]]
    with Engine(EngineConfig(model=model_path, n_parallel=6, n_ctx=6 * 512, deterministic=True)) as engine:
        alone = engine.generate([target], params)[0]
        crowd = engine.generate([target, *others], [params] + [SamplingParams(max_tokens=48, temperature=0.8, seed=i,
                                                                              json_schema=SCHEMAS["tags"])
                                                               for i in range(len(others))])[0]
    assert alone.token_ids == crowd.token_ids and alone.finish_reason == "stop"
    assert [e["logprob"] for e in alone.logprobs] == [e["logprob"] for e in crowd.logprobs]
    jsonschema.validate(json.loads(alone.text), schema)


def test_a_recursive_schema_compiles_and_its_answers_validate(smollm2_path):
    # no depth bound in the schema: max_tokens bounds the answer; the ones that end validate
    node = {"type": "object", "properties": {"label": {"type": "string", "maxLength": 8},
                                             "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
            "required": ["label"], "additionalProperties": False}
    schema = {"$defs": {"node": node}, "$ref": "#/$defs/node"}
    with Engine(EngineConfig(model=smollm2_path, n_parallel=4, n_ctx=4 * 512)) as engine:
        results = engine.generate([m for _, m in lines(4)], [SamplingParams(max_tokens=200, temperature=0.8, seed=i,
                                                                            json_schema=schema) for i in range(4)])
    ended = [r for r in results if r.finish_reason == "stop"]
    assert ended and all(r.finish_reason in ("stop", "length") for r in results)
    for r in ended:
        jsonschema.validate(json.loads(r.text), schema)


BAD = {
    "invalid schema": ({"type": "no-such-type"}, None),
    "unsupported keyword": ({"type": "string", "format": "no-such-format", "x-unknown": 1,
                             "patternProperties": {"^a": {"type": "string"}}}, None),
    "1 MB schema": ({"type": "string", "enum": ["x" * 1000] * 1100}, None),
    "recursive ref": ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, None),
    "catastrophic regex": ({"type": "string", "pattern": "^(a+)+$" + "(a|aa)*" * 40}, None),
    "no accepting path": (None, 'root ::= "a" root'),
}


def test_bad_grammars_are_their_own_lines_errors_and_the_others_run(model_path):
    with Engine(EngineConfig(model=model_path, n_parallel=2, n_ctx=1024)) as engine:
        started = time.perf_counter()
        handles = {what: engine.submit("Answer:", SamplingParams(max_tokens=16, temperature=0, json_schema=schema,
                                                                 grammar=grammar))
                   for what, (schema, grammar) in BAD.items()}
        good = engine.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0))[0]
        outcomes = {what: h.result(WAIT) for what, h in handles.items()}
        took = time.perf_counter() - started
    assert good.finish_reason == "length"
    for what, r in outcomes.items():
        # no accepting path: llguidance reads it, and stops the answer once its parser runs out of
        # items; every other one is refused at submit time
        assert r.finish_reason == "error" and r.error_code == "invalid_request", (what, r)
        assert "\n" not in r.error and len(r.error) < 400, r.error
    assert "no-such-format" in outcomes["unsupported keyword"].error or "format" in outcomes["unsupported keyword"].error
    assert took < 60, f"{took:.1f}s"


def test_a_refused_schema_is_compiled_once_and_a_gbnf_llguidance_cannot_use_goes_to_llama_cpp(smollm2_vocab):
    from llamabatch.errors import InvalidRequest

    masks = MaskGrammars(smollm2_vocab, "auto")
    bad = {"type": "array", "uniqueItems": True}
    with pytest.raises(InvalidRequest, match='Unimplemented keys: \\["uniqueItems"\\]'):
        masks.matcher_for(None, bad)
    started = time.perf_counter()
    for _ in range(100):  # 100 lines sharing the schema: refused from the cache, each at once
        with pytest.raises(InvalidRequest, match="uniqueItems"):
            masks.matcher_for(None, bad)
    assert time.perf_counter() - started < 0.5
    # GBNF llguidance cannot read (its converter) or use (its compiler): None under auto, so
    # llama.cpp's own parser takes it and says what is wrong; under llguidance, the line's error
    assert masks.matcher_for('root ::= "a" [', None) is None
    assert masks.matcher_for('root ::= "a"{2,1}', None) is None
    assert masks.matcher_for('root ::= "a" | "b"', None) is not None
    with pytest.raises(InvalidRequest, match="grammar cannot be read by llguidance"):
        MaskGrammars(smollm2_vocab, "llguidance").matcher_for('root ::= "a" [', None)
