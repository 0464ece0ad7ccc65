"""OpenAI Batch lines with "url": "/v1/responses", as `llamabatch run` (and `serve`'s batches)
read them: the body read as a chat turn (openai_format/responses_request.py), the record's
`response.body` a `response` object (responses_object.py), and every line that cannot run its
own error record naming what is wrong. The line parser alone, then `run` on the fake runner."""
from __future__ import annotations

import json

import pytest

from llamabatch import SamplingParams
from llamabatch.openai_format import LineError, LineParser, build_record
from llamabatch.results import Result, Timings, Usage

from cli_harness import invoke, runner_for

RESPONSES = "/v1/responses"


def parse(body: dict, system: str | None = None):
    parser = LineParser(SamplingParams(temperature=0, max_tokens=16), input_format="jsonl", system=system)
    return parser.parse_object({"custom_id": "r", "method": "POST", "url": RESPONSES, "body": body}, 1)


def test_a_body_becomes_the_chat_turn_with_its_sampling_fields():
    item = parse({"model": "gpt-x", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.3,
                  "top_p": 0.5, "seed": 4, "service_tier": "flex", "input": [
                      {"role": "developer", "content": "No lists."},
                      {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]})
    assert item.prompt == [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "No lists."},
                           {"role": "user", "content": "Hi"}]
    assert (item.params.max_tokens, item.params.temperature, item.params.top_p, item.params.seed) == (9, 0.3, 0.5, 4)
    assert item.params.priority == 10  # flex: as chat bodies read service_tier
    assert item.responses.input == [{"role": "developer", "content": "No lists."}, {"role": "user", "content": "Hi"}]


def test_run_s_system_applies_unless_the_body_has_instructions():
    assert parse({"input": "Hi"}, system="S").prompt[0] == {"role": "system", "content": "S"}
    assert parse({"input": "Hi", "instructions": "I"}, system="S").prompt[0] == {"role": "system", "content": "I"}


@pytest.mark.parametrize("text, schema", [
    (None, None), ({"format": {"type": "text"}}, None), ({"format": {"type": "json_object"}}, {"type": "object"}),
    ({"format": {"type": "json_schema", "name": "n", "schema": {"type": "array"}, "strict": True}}, {"type": "array"}),
])
def test_text_format_is_chat_s_response_format(text, schema):
    assert parse({"input": "x", "text": text}).params.json_schema == schema


def test_the_record_body_is_a_response_object():
    item = parse({"input": "x", "metadata": {"k": "v"}, "max_output_tokens": 2})
    record = build_record(item, Result(0, "ok", [1, 2], "length", Usage(prompt_tokens=5, completion_tokens=2,
                                                                          cached_tokens=3), Timings()), "m")
    body = record["response"]["body"]
    assert record["custom_id"] == "r" and record["error"] is None and record["response"]["status_code"] == 200
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["model"] == "m"
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0]["text"] == "ok" and body["metadata"] == {"k": "v"}
    assert body["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 2,
                             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 7}
    assert body["store"] is False  # a batch's responses are in its output file, not stored
    failed = build_record(item, Result(0, "", [], "error", Usage(), Timings(), error="boom", error_code="x"), "m")
    assert failed["error"] == {"code": "x", "message": "boom"} and failed["response"]["body"] is None


@pytest.mark.parametrize("body, named", [
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     "input[0].content[0] has type \"input_audio\""),
    ({"input": [{"type": "reasoning", "summary": []}]}, "body.input holds no message"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id is not supported in batch lines"),
    ({"input": "x", "stream": True}, "stream"),
    ({"input": "x", "reasoning": {"effort": "high", "summary": "short"}}, "reasoning.summary must be one of"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "logprobs": True}, "'logprobs'"),
    ({"input": "x", "instructions": 3}, "instructions"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens must be an integer"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": {"role": "user"}}, "body.input"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
])
def test_a_line_that_cannot_run_is_an_error_naming_what(body, named):
    item = parse(body)
    assert isinstance(item, LineError) and item.code == "invalid_request" and item.id == "r"
    assert named in item.message, item.message


def test_off_features_are_fine_when_off():
    item = parse({"input": "x", "tools": [], "tool_choice": "auto", "include": [], "reasoning": {"effort": None},
                  "background": False, "truncation": "disabled", "parallel_tool_calls": True, "store": True,
                  "user": "u", "prompt_cache_key": "k"})
    assert not isinstance(item, LineError)


def test_run_answers_responses_lines_with_response_objects(tmp_path):
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": RESPONSES,
              "body": {"model": "any", "input": f"Say {i}", "max_output_tokens": 50}} for i in range(3)]
    lines.append({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"messages": [{"role": "user", "content": "Hi"}]}})
    lines.append({"custom_id": "bad", "method": "POST", "url": RESPONSES,
                  "body": {"input": [{"type": "computer_call"}]}})
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    result = invoke(["run", str(inp), "-o", str(out), "--n-parallel", "2", "--n-ctx", "1024", "--temperature", "0"],
                    runner=runner_for(reply=lambda prompt: "fine"))
    assert result.exit_code == 0, result.stderr
    records = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    for i in range(3):
        body = records[f"r{i}"]["response"]["body"]
        assert body["object"] == "response" and body["status"] == "completed" and body["max_output_tokens"] == 50
        assert body["output"][0]["content"][0]["text"] == "fine"
    assert records["chat"]["response"]["body"]["object"] == "chat.completion"  # mixed freely, as other urls are
    assert records["bad"]["response"]["status_code"] == 400 and "computer_call" in records["bad"]["error"]["message"]


WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_tools_and_replayed_call_items_become_the_template_s_tools_and_tool_turns():
    from llamabatch.constraints.tool_grammar import LarkGrammar
    from llamabatch.openai_format import TOOLS_MESSAGE_ROLE

    item = parse({"tools": [WEATHER], "input": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]})
    tools, user, assistant, tool = item.prompt
    assert tools["role"] == TOOLS_MESSAGE_ROLE and tools["tools"][0]["function"]["name"] == "get_weather"
    assert user == {"role": "user", "content": "weather?"}
    assert assistant["content"] == "Checking." and assistant["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "get_weather"}
    assert isinstance(item.params.grammar, LarkGrammar)
    assert [i["type"] for i in item.responses.items] == ["message", "message", "function_call", "function_call_output"]


def test_a_record_reads_the_calls_in_the_syntax_the_engine_constrained():
    item = parse({"input": "weather?", "tools": [WEATHER], "tool_choice": "required"})
    result = Result(0, '{"name": "get_weather", "parameters": {"city": "Oslo"}}', [1], "stop",
                    Usage(prompt_tokens=5, completion_tokens=1), Timings(), tool_syntax="llama3")
    (call,) = build_record(item, result, "m")["response"]["body"]["output"]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "get_weather", {"city": "Oslo"})


def test_a_call_output_without_its_call_is_the_line_s_own_error():
    item = parse({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]})
    assert isinstance(item, LineError) and "call_9" in item.message and "matches no function_call" in item.message
