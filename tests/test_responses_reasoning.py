"""/v1/responses for a thinking model, over the scripted fake runner with
tests/templates/thinking.jinja: the reasoning as a `reasoning` item before the message (whole,
streamed as reasoning_text events, and in a batch line's record), its tokens in
output_tokens_details, `reasoning.effort` reaching the template, a reasoning item sent back as
input accepted, and a bad `reasoning` refused naming the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamabatch import SamplingParams
from llamabatch.errors import InvalidRequest
from llamabatch.openai_format import RESPONSES_URL, LineParser
from llamabatch.openai_format.responses_request import parse_responses_body

from http_server import serving
from lazy_modules import lazy

openai = lazy("openai")

TEMPLATE = str(Path(__file__).parent / "templates" / "thinking.jinja")
ANSWER = "Paris is in France.\n</think>\n\nParis."


def serve_thinking(tmp_path, prompts: list[str] | None = None):
    def answer(prompt: str) -> str:
        if prompts is not None:
            prompts.append(prompt)
        return ANSWER
    return serving(tmp_path / "data", reply_with=answer, max_tokens=80, slot_ctx=1024, chat_template=TEMPLATE)


def test_a_thinking_answer_is_a_reasoning_item_then_the_message_whole_and_streamed(tmp_path):
    with serve_thinking(tmp_path) as server:
        client = server.client()
        whole = client.responses.create(model="m", input="capital of France?")
        events = list(client.responses.create(model="m", input="capital of France?", stream=True))
        with client.responses.stream(model="m", input="capital of France?") as stream:  # the SDK's helper
            helped = stream.get_final_response()
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [c.text for c in reasoning.content] == ["Paris is in France."]
    assert message.type == "message" and whole.output_text == "Paris."
    assert whole.usage.output_tokens_details.reasoning_tokens == len("Paris is in France.\n</think>")
    kinds = [e.type for e in events]
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Paris is in France."
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert done.text == "Paris is in France." and done.output_index == 0
    first_text = kinds.index("response.output_text.delta")
    assert kinds.index("response.reasoning_text.done") < first_text  # the reasoning closes before the text opens
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == "Paris." and final.output[0].content[0].text == "Paris is in France."
    assert [item.type for item in helped.output] == ["reasoning", "message"] and helped.output_text == "Paris."
    assert helped.output[0].content[0].text == "Paris is in France."


def test_the_effort_reaches_the_template_and_a_reasoning_item_sent_back_is_accepted(tmp_path):
    prompts: list[str] = []
    with serve_thinking(tmp_path, prompts) as server:
        client = server.client()
        first = client.responses.create(model="m", input="capital of France?", reasoning={"effort": "low",
                                                                                        "summary": "auto"})
        again = client.responses.create(model="m", input=[
            {"role": "user", "content": "capital of France?"},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"role": "user", "content": "and of Italy?"}])
        with pytest.raises(openai.BadRequestError) as bad:
            client.responses.create(model="m", input="x", reasoning={"effort": "extreme"})
    assert "Reasoning effort: low." in prompts[0]
    assert first.reasoning.effort == "low" and first.reasoning.summary == "auto"
    assert again.output_text == "Paris."
    assert "<|im_start|>assistant\nParis.<|im_end|>" in prompts[1]  # the template kept the answer, not the reasoning
    assert "reasoning.effort" in str(bad.value)


@pytest.mark.parametrize("reasoning, words", [
    ("low", "body.reasoning must be an object"),
    ({"effort": "extreme"}, "reasoning.effort must be one of"),
    ({"summary": "long"}, "reasoning.summary must be one of"),
    ({"effort": "low", "budget": 3}, "unsupported field reasoning.budget"),
])
def test_a_bad_reasoning_object_is_refused_naming_the_field(reasoning, words):
    with pytest.raises(InvalidRequest, match=words):
        parse_responses_body({"input": "x", "reasoning": reasoning})


def test_a_top_level_reasoning_effort_must_agree_with_the_objects():
    assert parse_responses_body({"input": "x", "reasoning_effort": "low",
                                 "reasoning": {"effort": "low"}}).sampling["reasoning_effort"] == "low"
    with pytest.raises(InvalidRequest, match="disagree"):
        parse_responses_body({"input": "x", "reasoning_effort": "high", "reasoning": {"effort": "low"}})


def test_a_reasoning_input_item_becomes_the_next_assistant_turns_reasoning_content():
    request = parse_responses_body({"input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"}]})
    assert request.input[1]["reasoning_content"] == "hm" and request.input[1]["tool_calls"][0]["id"] == "c1"
    assert [item["type"] for item in request.items] == ["message", "reasoning", "function_call", "function_call_output"]
    with pytest.raises(InvalidRequest, match=r"input\[0\].content must be a list of reasoning_text parts"):
        parse_responses_body({"input": [{"type": "reasoning", "content": [{"type": "summary_text", "text": "x"}]}]})


def test_a_batch_lines_record_carries_the_reasoning_item(tmp_path):
    from http_server import ended, records, wait_batch

    line = {"custom_id": "r1", "method": "POST", "url": RESPONSES_URL, "body": {"input": "capital of France?"}}
    with serve_thinking(tmp_path) as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=RESPONSES_URL, completion_window="24h")
        (record,) = records(client, wait_batch(client, batch.id, ended).output_file_id)
    body = record["response"]["body"]
    assert [item["type"] for item in body["output"]] == ["reasoning", "message"]
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "Paris is in France."}]
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == len("Paris is in France.\n</think>")
    parsed = LineParser(SamplingParams(), input_format="jsonl").parse(json.dumps(line), 1)
    assert parsed.responses is not None and parsed.responses.reasoning == {"effort": None, "summary": None}

