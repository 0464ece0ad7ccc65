"""`llamabatch serve`'s /v1/responses on the bundled model through the openai SDK: a json_schema
format holds (the same masks as chat's response_format), a stream joins to the stored response,
a chain through previous_response_id reuses the first turn's KV, and a forced function call
holds to its tool's schema (SmolLM2 through a Hermes template). Properties only (never the
model's words)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from llamabatch import SamplingParams
from llamabatch.config import EngineConfig
from llamabatch.engines import open_engine

from http_server import serving_engine

pytestmark = pytest.mark.model

HERMES = str(Path(__file__).parent / "templates" / "hermes_tools.jinja")

SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


class Colour(BaseModel):
    colour: Literal["red", "green", "blue"]


def test_responses_on_the_bundled_model(tmp_path):
    engine = open_engine(EngineConfig(model=None, n_parallel=2, n_ctx=2 * 512),
                         SamplingParams(temperature=0, max_tokens=12))
    with serving_engine(engine, tmp_path / "data") as running:
        client = running.client(timeout=300)
        shaped = client.responses.create(model="gemma", input="Name a colour.", max_output_tokens=40,
                                         text={"format": {"type": "json_schema", "name": "colour", "schema": SCHEMA,
                                                          "strict": True}})
        parsed = client.responses.parse(model="gemma", input="Name a colour.", max_output_tokens=40, text_format=Colour)
        first = client.responses.create(model="gemma", instructions="You are a helpful assistant.",
                                        input="Tell me about the sea.", max_output_tokens=8)
        events = list(client.responses.create(model="gemma", instructions="You are a helpful assistant.",
                                              input="And the sky?", previous_response_id=first.id,
                                              max_output_tokens=8, stream=True))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        second = client.responses.retrieve(events[0].response.id)
        counted = client.responses.input_tokens.count(model="gemma", instructions="You are a helpful assistant.",
                                                      input="And the sky?", previous_response_id=first.id)
    assert shaped.status == "completed" and json.loads(shaped.output_text)["colour"] in ("red", "green", "blue")
    assert isinstance(parsed.output_parsed, Colour)  # the SDK's own schema from a pydantic model, parsed back
    assert first.usage.output_tokens <= 8 and first.status in ("completed", "incomplete")
    assert second.previous_response_id == first.id and second.output_text == deltas
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 1
    assert counted.input_tokens == second.usage.input_tokens  # the model's own template and vocabulary
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1  # the first turn's KV


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}


def test_responses_function_calls_on_smollm2_through_a_hermes_template(tmp_path, smollm2_path):
    """tool_choice required gives a function_call item whose arguments hold to the tool's schema,
    streamed as the same call, and its output continues the chain to a message."""
    import jsonschema

    engine = open_engine(EngineConfig(model=smollm2_path, n_parallel=2, n_ctx=2 * 1024,
                                      chat_template=HERMES), SamplingParams(temperature=0, max_tokens=60))
    with serving_engine(engine, tmp_path / "data") as running:
        client = running.client(timeout=300)
        ask = dict(model="smollm2", input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                   parallel_tool_calls=False)
        whole = client.responses.create(**ask)
        with client.responses.stream(**ask) as stream:
            done = [e for e in stream if e.type == "response.function_call_arguments.done"]
            streamed = stream.get_final_response()
        call = whole.output[-1]
        final = client.responses.create(model="smollm2", previous_response_id=whole.id, tools=[WEATHER],
                                        tool_choice="none", max_output_tokens=12, input=[
                                            {"type": "function_call_output", "call_id": call.call_id,
                                             "output": '{"sky": "sunny", "celsius": 21}'}])
    assert [item.type for item in whole.output] == ["function_call"] and whole.status == "completed"
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    # greedy: the streamed call is the whole answer's call
    assert [(c.name, c.arguments) for c in streamed.output] == [(call.name, call.arguments)]
    assert len(done) == 1 and done[0].arguments == call.arguments
    assert [item.type for item in final.output] == ["message"] and final.output_text
    assert final.usage.input_tokens > whole.usage.output_tokens  # the call, with its output, is in the prompt
