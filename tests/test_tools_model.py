"""Tool calls on the bundled models: SmolLM2 (ChatML) through a Hermes-style template that reads
`tools` (tests/templates/hermes_tools.jinja; its own template has none) and through its own
template (the fallback prompt), Gemma 3 through the fallback. `required` and a named tool give a
call from the first token whose arguments are valid against the tool's schema (checked with
jsonschema); `serve` answers the openai SDK with a call, streamed and not, and a round trip.
Properties only, never the model's words; short answers (max_tokens small, few prompts)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.openai_format import CHAT_URL, LineParser, build_record

pytestmark = pytest.mark.model

HERMES = str(Path(__file__).parent / "templates" / "hermes_tools.jinja")
WAIT = 600

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
EVENT = {"type": "function", "function": {"name": "create_event", "description": "Put an event in the calendar", "parameters": {
    "type": "object", "properties": {
        "title": {"type": "string", "maxLength": 20},
        "when": {"type": "object", "properties": {"day": {"type": "integer", "minimum": 1, "maximum": 31},
                                                  "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                 "required": ["day", "hour"]},
        "guests": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2}},
    "required": ["title", "when"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string", "maxLength": 20}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
    "required": ["query"]}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, EVENT, SEARCH)}

CASES = [  # (question, tools, tool_choice)
    ("What is the weather in Paris?", [WEATHER], "required"),
    ("Plan lunch with Ana on the 3rd at noon.", [WEATHER, EVENT, SEARCH], "required"),
    ("Plan lunch with Ana on the 3rd at noon.", [WEATHER, EVENT, SEARCH],
     {"type": "function", "function": {"name": "create_event"}}),
]


@pytest.fixture(scope="module", params=["smollm2-hermes", "smollm2-own", "gemma3"])
def engine(request):
    if request.param.startswith("smollm2"):
        path = request.getfixturevalue("smollm2_path")
    else:
        path = request.getfixturevalue("model_path")
    template = HERMES if request.param == "smollm2-hermes" else None
    with Engine(EngineConfig(model=path, n_parallel=3, n_ctx=3 * 1024, chat_template=template)) as e:
        yield e


def line(i: int, question: str, tools: list, choice) -> str:
    body = {"messages": [{"role": "user", "content": question}], "tools": tools, "tool_choice": choice,
            "parallel_tool_calls": False, "max_tokens": 90}
    return json.dumps({"custom_id": f"t{i}", "method": "POST", "url": CHAT_URL, "body": body})


def test_required_and_named_calls_are_valid_against_their_tools_schema(engine):
    parser = LineParser(SamplingParams(temperature=0), input_format="jsonl")
    items = [parser.parse(line(i, *case), i + 1) for i, case in enumerate(CASES)]
    handles = [engine.submit(item.prompt, item.params, stream=False) for item in items]
    for item, handle, (_q, _tools, choice) in zip(items, handles, CASES):
        result = handle.result(timeout=WAIT)
        assert result.grammar_backend == "llguidance" and result.text.startswith("<tool_call>\n{\"name\": ")
        choice_out = build_record(item, result, "m")["response"]["body"]["choices"][0]
        assert choice_out["finish_reason"] == "tool_calls", result.text
        assert choice_out["message"]["content"] is None
        (call,) = choice_out["message"]["tool_calls"]
        name = call["function"]["name"]
        if isinstance(choice, dict):
            assert name == choice["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def test_serve_answers_the_openai_sdk_with_calls_streamed_and_a_round_trip(tmp_path, smollm2_path):
    from llamabatch.engines import open_engine

    from http_server import serving_engine

    engine = open_engine(EngineConfig(model=smollm2_path, n_parallel=2, n_ctx=2 * 1024, chat_template=HERMES),
                         SamplingParams(temperature=0, max_tokens=60))
    with serving_engine(engine, tmp_path / "data", online_slots=2) as running:
        client = running.client(timeout=WAIT)
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        ask = dict(model="smollm2", tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
        whole = client.chat.completions.create(messages=messages, **ask)
        chunks = list(client.chat.completions.create(messages=messages, stream=True, **ask))
        calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        (call,) = whole.choices[0].message.tool_calls
        assert whole.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
        # greedy: the streamed call is the whole answer's call
        assert [(c.function.name, c.function.arguments) for c in calls] == [(call.function.name, call.function.arguments)]
        messages += [whole.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "celsius": 21}'}]
        final = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER], tool_choice="none",
                                               max_tokens=12)
        assert final.choices[0].message.content and not final.choices[0].message.tool_calls


@pytest.fixture(scope="module")
def smollm2_masks(smollm2_path):
    from llama_cpp import llama_cpp as C

    from llamabatch.llama.direct_load import load_vocabulary
    from llamabatch.llama.sampling.mask_grammar import MaskGrammars
    from llamabatch.llama.vocab import Vocabulary

    model = load_vocabulary(smollm2_path)
    yield MaskGrammars(Vocabulary(model))
    C.llama_model_free(model)


GOOD_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


@pytest.mark.parametrize("mode, text, whole", [
    ("required", GOOD_CALL, True),
    ("required", GOOD_CALL + "\n" + GOOD_CALL, True),
    ("required", "Sure. " + GOOD_CALL, False),  # required: a call from the first token
    ("required", '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3', False),  # arguments off the schema
    ("required", '<tool_call>\n{"name": "get_wind", ', False),  # no such tool
    ("auto", "Sure, let me look that up. " + GOOD_CALL, True),  # text, then a masked call
    ("auto", "Just an answer, no call.", True),
    ("auto", 'Let me see. <tool_call>\n{"name": "get_weather", "arguments": {"town": ', False),  # masked once opened
])
def test_the_call_mask_on_a_real_vocabulary(smollm2_masks, mode, text, whole):
    from llamabatch.constraints.tool_grammar import tool_grammar

    grammar = tool_grammar([("get_weather", WEATHER["function"]["parameters"]), ("search", SCHEMAS["search"])],
                           mode, True)
    matcher = smollm2_masks.matcher_for(grammar, None)
    tokens = smollm2_masks.tokenizer().tokenize_str(text)
    assert (matcher.valid_prefix(tokens) == len(tokens)) is whole


def test_auto_calls_that_the_model_opens_are_masked_valid(model_path):
    """Gemma 3 (base) through the fallback: in auto it writes freely; where it opens a call, the
    rest is the mask's. Greedy, so the same prompt opens one each run (seen on the first one:
    it echoes the system turn up to `<tool_call>`); every call read out is valid."""
    parser = LineParser(SamplingParams(temperature=0, max_tokens=50), input_format="jsonl")
    asks = [[{"role": "system", "content": "You answer only by calling a tool, in <tool_call> tags."},
             {"role": "user", "content": "Weather in Paris?"}],
            [{"role": "user", "content": "What's the weather in Paris? Use the tool."}]]
    lines = [json.dumps({"custom_id": str(i), "url": CHAT_URL, "body": {"messages": m, "tools": [WEATHER, SEARCH]}})
             for i, m in enumerate(asks)]
    with Engine(EngineConfig(model=model_path, n_parallel=2, n_ctx=2 * 1024)) as engine:
        items = [parser.parse(text, i + 1) for i, text in enumerate(lines)]
        results = [h.result(timeout=WAIT) for h in [engine.submit(i.prompt, i.params, stream=False) for i in items]]
    calls = []
    for item, result in zip(items, results):
        message = build_record(item, result, "m")["response"]["body"]["choices"][0]["message"]
        calls += message.get("tool_calls") or []
    assert calls, [r.text for r in results]
    for call in calls:
        name = call["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
