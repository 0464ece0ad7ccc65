"""Hostile but plausible /v1/responses and chat bodies for a thinking model (the scripted fake
runner with tests/templates/thinking.jinja): a wrong type in a reasoning input item, in
`reasoning` or `text` is a 400 naming the field; a streamed answer cut after its reasoning closed
gives the same items, statuses included, as the unstreamed one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamabatch.errors import InvalidRequest
from llamabatch.models.chat_template import validate_messages
from llamabatch.openai_format import TOOLS_MESSAGE_ROLE
from llamabatch.openai_format.responses_request import parse_responses_body

from http_server import raw, serving

TEMPLATE = str(Path(__file__).parent / "templates" / "thinking.jinja")
ANSWER = "Paris is in France.\n</think>\n\nParis."
CLOSED_AT = len("Paris is in France.\n</think>")  # tokens (characters) up to the closer


def post(server, body: dict) -> tuple[int, bytes]:
    got = raw("POST", server.base_url[:-3] + "/v1/responses", json.dumps(body).encode(),
              {"content-type": "application/json"})
    return got.status, got.body


def streamed_items(data: bytes) -> tuple[list[dict], dict]:
    """(the items of the output_item.done events, the last event's response) of a stream."""
    events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]
    return [e["item"] for e in events if e["type"] == "response.output_item.done"], events[-1]["response"]


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


def test_an_answer_cut_after_its_reasoning_closed_has_the_same_items_streamed_and_whole(tmp_path):
    body = {"input": "capital of France?", "max_output_tokens": CLOSED_AT + 4}  # cut inside "Paris."
    with serving(tmp_path / "data", reply_with=lambda prompt: ANSWER, max_tokens=80, slot_ctx=1024,
                 chat_template=TEMPLATE) as server:
        status, whole = post(server, body)
        stream_status, stream = post(server, {**body, "stream": True})
    assert status == stream_status == 200
    whole_body = json.loads(whole)
    items, final = streamed_items(stream)
    assert whole_body["status"] == final["status"] == "incomplete"
    assert [(i["type"], i["status"]) for i in whole_body["output"]] == [("reasoning", "completed"),
                                                                        ("message", "incomplete")]
    assert without_ids(whole_body["output"]) == without_ids(final["output"]) == without_ids(items)


@pytest.mark.parametrize("item, words", [
    ({"content": {}}, r"input\[0\].content must be a list of reasoning_text parts"),
    ({"content": ""}, r"input\[0\].content must be a list of reasoning_text parts"),
    ({"content": 0}, r"input\[0\].content must be a list of reasoning_text parts"),
    ({"summary": [1, None]}, r"input\[0\].summary\[0\] must be a summary_text part"),
    ({"summary": [{"type": "summary_text", "text": 5}]}, r"input\[0\].summary\[0\] must be a summary_text part"),
    ({"encrypted_content": 5}, r"input\[0\].encrypted_content must be a string"),
])
def test_a_reasoning_input_item_of_the_wrong_shape_is_refused_naming_the_field(item, words):
    with pytest.raises(InvalidRequest, match=words):
        parse_responses_body({"input": [{"type": "reasoning", "summary": [], **item},
                                        {"role": "user", "content": "q"}]})


def test_a_reasoning_input_item_as_openai_writes_it_is_taken():
    request = parse_responses_body({"input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thought"}],
         "encrypted_content": "gAAAA", "content": None},
        {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]})
    assert request.items[1]["summary"] == [{"type": "summary_text", "text": "thought"}]
    assert request.input[1] == {"role": "assistant", "content": "a", "reasoning_content": ""}


@pytest.mark.parametrize("body, words", [
    ({"reasoning": {"summary": "auto", "generate_summary": "loud"}}, "reasoning.generate_summary must be one of"),
    ({"text": {"verbosity": 5}}, "text.verbosity must be one of low, medium, high"),
])
def test_a_bad_value_beside_a_good_one_is_refused_naming_its_field(body, words):
    with pytest.raises(InvalidRequest, match=words):
        parse_responses_body({"input": "x", **body})
    assert parse_responses_body({"input": "x", "text": {"verbosity": "low"}}).text_format == {"type": "text"}


def test_a_chat_messages_reasoning_content_must_be_text_and_null_is_none():
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": None}]
    assert validate_messages(turns)[1] == {"role": "assistant", "content": "a"}  # as if not given
    with pytest.raises(InvalidRequest, match=r"messages\[1\].reasoning_content must be a string, got a number"):
        validate_messages([turns[0], {**turns[1], "reasoning_content": 5}])
    tools = {"role": TOOLS_MESSAGE_ROLE, "content": "", "tools": []}  # what a request's tools add before its turns
    with pytest.raises(InvalidRequest, match=r"messages\[1\].reasoning_content must be a string, got a number"):
        validate_messages([tools, turns[0], {**turns[1], "reasoning_content": 5}])
    assert validate_messages([turns[0], {"role": "assistant", "content": None}])[1]["content"] == ""  # no calls beside


def test_a_chain_through_previous_response_id_keeps_the_reasoning_as_replayed_items_do(tmp_path):
    """OpenAI's previous_response_id stands for sending the response's output items back: its
    reasoning item too, which a template that writes reasoning before calls reads."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    weather = {"type": "function", "name": "get_weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    prompts: list[str] = []

    def answer(prompt: str) -> str:
        prompts.append(prompt)
        return "done\n</think>\n\nSunny." if "<tool_response>" in prompt else "I should call\n</think>\n\n" + call
    template = str(Path(__file__).parent / "templates" / "thinking_tools.jinja")
    with serving(tmp_path / "data", reply_with=answer, max_tokens=300, slot_ctx=4096, chat_template=template) as server:
        client = server.client()
        first = client.responses.create(model="m", input="weather?", tools=[weather])
        result = {"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "sunny"}
        client.responses.create(model="m", input=[result], tools=[weather], previous_response_id=first.id)
        replayed = [{"role": "user", "content": "weather?"}, *[i.model_dump(exclude_none=True) for i in first.output], result]
        client.responses.create(model="m", input=replayed, tools=[weather])
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert "<think>\nI should call\n</think>\n<tool_call>" in prompts[2]
    assert prompts[1] == prompts[2]


def test_a_chat_answer_whose_block_never_closed_is_taken_back_as_the_sdk_sends_it(tmp_path):
    """Such an answer's content is null (docs/thinking.md); the SDK's message, sent back as the
    next turn's history, carries that null (or no content at all): an empty turn, not a 400."""
    with serving(tmp_path / "data", reply_with=lambda prompt: "thinking without end", max_tokens=6, slot_ctx=1024,
                 chat_template=TEMPLATE) as server:
        client = server.client()
        turns = [{"role": "user", "content": "q"}]
        first = client.chat.completions.create(model="m", messages=turns).choices[0]
        again = [client.chat.completions.create(model="m", messages=[*turns, sent, {"role": "user", "content": "go on"}])
                 for sent in (first.message.model_dump(), first.message.model_dump(exclude_none=True))]
    assert first.finish_reason == "length" and first.message.content is None
    assert [a.choices[0].message.reasoning_content for a in again] == ["thinki", "thinki"]
    with pytest.raises(InvalidRequest, match=r"messages\[0\].content must be"):
        validate_messages([{"role": "user", "content": None}])  # a user's turn says something


def test_a_call_whose_arguments_escape_a_lone_surrogate_is_answered_whole_and_streamed(tmp_path):
    r"""JSON lets a string escape half a surrogate pair ("\ud800"), and a model may write one
    inside its call: the call's arguments keep the escape as written (a lone surrogate cannot be
    UTF-8: storing the response was a 500, and the stream stopped without its last event)."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "\\ud800"}}\n</tool_call>'
    weather = {"type": "function", "name": "get_weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    with serving(tmp_path / "data", reply_with=lambda prompt: "hm\n</think>\n\n" + call, max_tokens=300,
                 slot_ctx=4096, chat_template=str(Path(__file__).parent / "templates" / "thinking_tools.jinja")) as server:
        status, whole = post(server, {"input": "weather?", "tools": [weather]})
        stream_status, stream = post(server, {"input": "weather?", "tools": [weather], "stream": True})
        chat = server.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "weather?"}],
            tools=[{"type": "function", "function": {k: v for k, v in weather.items() if k != "type"}}])
    assert status == stream_status == 200
    items, final = streamed_items(stream)
    assert final["status"] == "completed"
    for output in (json.loads(whole)["output"], items):
        assert [i["type"] for i in output] == ["reasoning", "function_call"]
        assert output[1]["arguments"] == '{"city": "\\ud800"}' and json.loads(output[1]["arguments"]) == {"city": "\ud800"}
    assert chat.choices[0].message.tool_calls[0].function.arguments == '{"city": "\\ud800"}'


def test_a_stream_whose_shaping_fails_still_ends_with_its_failure(tmp_path, monkeypatch):
    """Every request gets one terminal outcome: a bug turning an answer into events (as the lone
    surrogate above was) ends the stream with response.failed (chat: an error event and [DONE])
    instead of cutting it, and the server answers the next request."""
    from llamabatch.serve.http.responses_events import ResponseEvents
    from llamabatch.serve.http.sse import StreamShape

    def broken(*args, **kwargs):
        raise RuntimeError("shaping bug")
    with serving(tmp_path / "data", reply_with=lambda prompt: ANSWER, max_tokens=80, slot_ctx=1024,
                 chat_template=TEMPLATE) as server:
        with monkeypatch.context() as patched:
            patched.setattr(ResponseEvents, "delta", broken)
            patched.setattr(StreamShape, "delta", broken)
            _, stream = post(server, {"input": "q", "stream": True})
            chat = raw("POST", server.base_url[:-3] + "/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": "q"}], "stream": True}).encode(),
                {"content-type": "application/json"}).body.decode()
        after = server.client().responses.create(model="m", input="q")
    last = [json.loads(line[6:]) for line in stream.decode().splitlines() if line.startswith("data: ")][-1]
    assert last["type"] == "response.failed" and "shaping bug" in last["response"]["error"]["message"]
    events = [line[6:] for line in chat.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "shaping bug" in json.loads(events[-2])["error"]["message"]
    assert after.output_text == "Paris."


@pytest.mark.parametrize("after", [
    [],  # last
    [{"role": "user", "content": "q2"}],
    [{"type": "function_call_output", "call_id": "c1", "output": "42"}],
])
def test_a_reasoning_item_with_no_answer_after_it_is_refused_as_openai_refuses_it(after):
    """A reasoning item goes back just before its answer's message or call; one with none after
    it was dropped without a word."""
    head = [{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}]
    with pytest.raises(InvalidRequest, match=r"input\[2\] is a reasoning item with no assistant message or "
                                              r"function_call right after it"):
        parse_responses_body({"input": head + after})


def test_reasoning_items_in_a_row_all_reach_the_answer_after_them():
    parts = [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": t}]} for t in "ab"]
    request = parse_responses_body({"input": [{"role": "user", "content": "q"}, *parts,
                                              {"role": "assistant", "content": "x"}, {"role": "user", "content": "q2"}]})
    assert request.input[1]["reasoning_content"] == "a\nb"  # the second one kept the first's text
