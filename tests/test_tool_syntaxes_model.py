"""The Llama 3.x and Mistral call syntaxes on a real model: SmolLM2 (ChatML) through templates
that teach them (tests/templates/llama3_tools.jinja, mistral_tools.jinja). The engine masks
each answer in its template's syntax; required and named calls are valid against their tool's
schema (jsonschema); the mask accepts and refuses the same shapes as Hermes' on a real
vocabulary; `serve`'s streamed call equals its whole answer's. Properties only."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.constraints.tool_grammar import tool_grammar
from llamabatch.constraints.tool_syntax import SYNTAXES
from llamabatch.openai_format import LineParser, build_record

from test_tools_model import CASES, SCHEMAS, WAIT, WEATHER, line, smollm2_masks  # noqa: F401 (a fixture)

pytestmark = pytest.mark.model

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE_OF = {"llama3": str(TEMPLATES / "llama3_tools.jinja"), "mistral": str(TEMPLATES / "mistral_tools.jinja")}


@pytest.fixture(scope="module", params=["llama3", "mistral"])
def engine(request, smollm2_path):
    config = EngineConfig(model=smollm2_path, n_parallel=3, n_ctx=3 * 1024, chat_template=TEMPLATE_OF[request.param])
    with Engine(config) as e:
        yield request.param, e


def test_required_and_named_calls_in_the_templates_syntax_are_valid(engine):
    syntax, engine = engine
    parser = LineParser(SamplingParams(temperature=0), input_format="jsonl")
    items = [parser.parse(line(i, *case), i + 1) for i, case in enumerate(CASES)]
    handles = [engine.submit(item.prompt, item.params, stream=False) for item in items]
    for item, handle, (_q, _tools, choice) in zip(items, handles, CASES):
        result = handle.result(timeout=WAIT)
        assert result.tool_syntax == syntax and result.text.startswith(SYNTAXES[syntax].trigger), result.text
        choice_out = build_record(item, result, "m")["response"]["body"]["choices"][0]
        assert choice_out["finish_reason"] == "tool_calls", result.text
        (call,) = choice_out["message"]["tool_calls"]
        name = call["function"]["name"]
        if isinstance(choice, dict):
            assert name == choice["function"]["name"]
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


GOOD = {"llama3": '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]'}
TWO = {"llama3": GOOD["llama3"] + "\n" + GOOD["llama3"],
       "mistral": GOOD["mistral"][:-1] + ", " + GOOD["mistral"][len("[TOOL_CALLS]["):]}
OFF_SCHEMA = {"llama3": '{"name": "get_weather", "parameters": {"city": 3',
              "mistral": '[TOOL_CALLS][{"name": "get_wind"'}


@pytest.mark.parametrize("syntax", ["llama3", "mistral"])
@pytest.mark.parametrize("mode, shape, whole", [
    ("required", "good", True), ("required", "two", True), ("required", "text first", False),
    ("required", "off schema", False), ("auto", "text first", True), ("auto", "no call", True),
    ("auto", "text then off schema", False),
])
def test_the_call_mask_of_each_syntax_on_a_real_vocabulary(smollm2_masks, syntax, mode, shape, whole):
    text = {"good": GOOD[syntax], "two": TWO[syntax], "text first": "Sure. " + GOOD[syntax],
            "off schema": OFF_SCHEMA[syntax], "no call": "Just an answer.",
            "text then off schema": "Let me see. " + OFF_SCHEMA[syntax]}[shape]
    grammar = tool_grammar([("get_weather", WEATHER["function"]["parameters"]), ("search", SCHEMAS["search"])],
                           mode, True, SYNTAXES[syntax])
    matcher = smollm2_masks.matcher_for(grammar, None)
    tokens = smollm2_masks.tokenizer().tokenize_str(text)
    assert (matcher.valid_prefix(tokens) == len(tokens)) is whole


def test_serve_streams_a_llama3_call_as_its_whole_answer_gives_it(tmp_path, smollm2_path):
    from llamabatch.engines import open_engine

    from http_server import serving_engine

    engine = open_engine(EngineConfig(model=smollm2_path, n_parallel=2, n_ctx=2 * 1024,
                                      chat_template=TEMPLATE_OF["llama3"]), SamplingParams(temperature=0, max_tokens=60))
    with serving_engine(engine, tmp_path / "data", online_slots=2) as running:
        client = running.client(timeout=WAIT)
        ask = dict(model="smollm2", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                   tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
        whole = client.chat.completions.create(**ask)
        chunks = list(client.chat.completions.create(stream=True, **ask))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content is None
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    assert [(c.function.name, c.function.arguments) for c in calls] == [(call.function.name, call.function.arguments)]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # no call text leaked


def test_run_and_a_serve_batch_give_the_same_calls(tmp_path, smollm2_path):
    """The same tool lines (greedy, deterministic: a request's tokens do not depend on what runs
    beside it) through `llamabatch run` and a `serve` batch: the same calls."""
    from llamabatch.engines import open_engine

    from cli_harness import invoke
    from http_server import ended, records, serving_engine, wait_batch

    cases = CASES[1:]  # several tools; one named
    data = "".join(line(i, *case) + "\n" for i, case in enumerate(cases))
    (tmp_path / "in.jsonl").write_text(data)
    done = invoke(["run", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "-m", smollm2_path,
                   "--chat-template", TEMPLATE_OF["llama3"], "--temperature", "0", "--n-parallel", "2",
                   "--n-ctx", "2048", "--deterministic"])
    assert done.exit_code == 0, done.stderr
    by_run = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["tool_calls"]
              for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}

    engine = open_engine(EngineConfig(model=smollm2_path, n_parallel=2, n_ctx=2048, deterministic=True,
                                      chat_template=TEMPLATE_OF["llama3"]), SamplingParams(temperature=0))
    with serving_engine(engine, tmp_path / "data") as running:
        client = running.client(timeout=WAIT)
        f = client.files.create(file=("in.jsonl", data.encode()), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        batch = wait_batch(client, batch.id, ended, timeout=WAIT)
        by_serve = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["tool_calls"]
                    for r in records(client, batch.output_file_id)}

    def calls(by_id: dict) -> dict:
        return {k: [(c["function"]["name"], c["function"]["arguments"]) for c in v] for k, v in by_id.items()}
    assert len(by_run) == len(cases) and calls(by_run) == calls(by_serve)
