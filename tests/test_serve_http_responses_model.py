"""`llamabatch serve`'s /v1/responses on the bundled model through the openai SDK: a json_schema
format holds (the same masks as chat's response_format), a stream joins to the stored response,
and a chain through previous_response_id reuses the first turn's KV. Properties only (never the
model's words)."""
from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import BaseModel

from llamabatch import SamplingParams
from llamabatch.config import EngineConfig
from llamabatch.engines import open_engine
from llamabatch.serve.http.app import build_app
from llamabatch.serve.http.server import listen
from llamabatch.serve.http.service import Service

pytestmark = pytest.mark.model

SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


class Colour(BaseModel):
    colour: Literal["red", "green", "blue"]


def test_responses_on_the_bundled_model(tmp_path):
    engine = open_engine(EngineConfig(model=None, n_parallel=2, n_ctx=2 * 512, threads=2),
                         SamplingParams(temperature=0, max_tokens=12))
    service = Service(engine, str(tmp_path / "data"))
    listening = listen(build_app(service), "127.0.0.1", 0)
    service.start()
    thread = listening.run_in_thread()
    try:
        from openai import OpenAI

        client = OpenAI(base_url=f"http://127.0.0.1:{listening.port}/v1", api_key="unused", max_retries=0,
                        timeout=300)
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
    finally:
        listening.stop()
        thread.join(10)
        service.close(10)
        engine.close()
    assert shaped.status == "completed" and json.loads(shaped.output_text)["colour"] in ("red", "green", "blue")
    assert isinstance(parsed.output_parsed, Colour)  # the SDK's own schema from a pydantic model, parsed back
    assert first.usage.output_tokens <= 8 and first.status in ("completed", "incomplete")
    assert second.previous_response_id == first.id and second.output_text == deltas
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 1
    assert counted.input_tokens == second.usage.input_tokens  # the model's own template and vocabulary
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1  # the first turn's KV
