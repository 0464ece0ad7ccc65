"""Thinking models on the bundled models: SmolLM2 and Gemma 3 through tests/templates/thinking.jinja
(ChatML that opens `<think>` in its generation prompt; neither model is trained to think, so what
it writes there is its reasoning). A JSON-schema line gives valid JSON in the content with the
reasoning apart; the budget bounds the block and the engine closes it; budget 0 and
enable_thinking false generate no reasoning token; a block never closed ends with length; the
streamed deltas join to the whole answer. Properties only, never the model's words."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.model

TEMPLATE = str(Path(__file__).parent / "templates" / "thinking.jinja")
WAIT = 600
ASK = [{"role": "user", "content": "Give a person called Ana, aged 31, as JSON."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def engine(request):
    path = request.getfixturevalue("smollm2_path" if request.param == "smollm2" else "model_path")
    with Engine(EngineConfig(model=path, n_parallel=4, n_ctx=4 * 1024, chat_template=TEMPLATE)) as e:
        yield e


def params(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, **{"max_tokens": 120, **kw})


def test_a_json_schema_line_gives_valid_json_in_content_and_reasoning_apart(engine):
    handles = [engine.submit(ASK, params(json_schema=PERSON, reasoning_budget=budget)) for budget in (16, 0)]
    thought, direct = (h.result(timeout=WAIT) for h in handles)
    for result in (thought, direct):
        assert result.finish_reason == "stop" and result.grammar_backend == "llguidance"
        jsonschema.validate(json.loads(result.text), PERSON)
    assert 0 < thought.usage.reasoning_tokens <= 16 and thought.reasoning and "</think>" not in thought.reasoning
    assert direct.usage.reasoning_tokens == 0 and direct.reasoning == ""


def test_the_budget_bounds_the_block_and_the_engine_closes_it(engine):
    result = engine.submit(ASK, params(reasoning_budget=6)).result(timeout=WAIT)
    assert result.usage.reasoning_tokens <= 6 and result.reasoning
    closer = engine.tokenize("\n</think>\n\n", special=True, add_special=False)
    if result.usage.reasoning_tokens == 6:  # the model did not close it first: the engine wrote the closer
        assert result.token_ids[6:6 + len(closer)] == closer


def test_budget_zero_and_enable_thinking_false_generate_no_reasoning_token(engine):
    handles = [engine.submit(ASK, params(max_tokens=16, **kw))
               for kw in ({"reasoning_budget": 0}, {"chat_template_kwargs": {"enable_thinking": False}})]
    for handle in handles:
        result = handle.result(timeout=WAIT)
        assert (result.usage.reasoning_tokens, result.reasoning) == (0, "") and result.text


def test_a_block_never_closed_ends_with_length_and_its_reasoning(engine):
    result = engine.submit(ASK, params(max_tokens=5)).result(timeout=WAIT)
    assert result.finish_reason == "length" and result.text == "" and result.reasoning
    assert result.usage.reasoning_tokens == 5


def test_streamed_deltas_join_to_the_whole_answer(engine):
    whole = engine.submit(ASK, params(json_schema=PERSON, reasoning_budget=10)).result(timeout=WAIT)
    handle = engine.submit(ASK, params(json_schema=PERSON, reasoning_budget=10), stream=True)
    deltas = list(handle)
    streamed = handle.result(timeout=WAIT)
    assert "".join(d.reasoning for d in deltas) == streamed.reasoning == whole.reasoning
    assert "".join(d.text for d in deltas) == streamed.text == whole.text


def test_deterministic_mode_with_a_budget_gives_the_same_tokens_alone_and_in_a_batch(smollm2_path):
    """The closer the engine writes at the budget is a chunk of several forced tokens beside
    others' rows: in deterministic mode the answers stay bit for bit those of each request alone."""
    asks = [[{"role": "user", "content": f"Name {n} fruits, as JSON."}] for n in (2, 3, 4, 5)]
    wanted = [SamplingParams(max_tokens=24, reasoning_budget=6, **({"temperature": 0.8, "seed": 7 + i} if i % 2
                                                                    else {"temperature": 0}))
              for i in range(len(asks))]
    config = EngineConfig(model=smollm2_path, n_parallel=4, n_ctx=4 * 512, chat_template=TEMPLATE,
                          deterministic=True)
    with Engine(config) as e:
        alone = [e.submit(ask, p).result(timeout=WAIT) for ask, p in zip(asks, wanted)]
        together = [h.result(timeout=WAIT) for h in [e.submit(ask, p) for ask, p in zip(asks, wanted)]]
    assert any(r.usage.reasoning_tokens == 6 for r in alone)  # the engine wrote a closer somewhere
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [(r.reasoning, r.text) for r in together] == [(r.reasoning, r.text) for r in alone]
