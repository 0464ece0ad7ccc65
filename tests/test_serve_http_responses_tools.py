"""Function tools in `serve`'s /v1/responses through the openai SDK, unchanged (fake runner): the
flat tool shape, tool_choice, function_call output items, their streamed events, a two-turn
round trip with function_call_output (through previous_response_id and as replayed input), batch
lines with tools, and the input_items and cancel routes."""
from __future__ import annotations

import json
import threading

import pytest

from llamabatch.constraints.tool_grammar import LarkGrammar

from http_server import ended, raw, records, serving, wait_batch
from lazy_modules import lazy
from test_serve_http_responses import post, sse_events

openai = lazy("openai")

RESPONSES = "/v1/responses"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def tool_reply_capturing():
    """The fake model: a weather call, then (once the tool's answer is in the prompt) a final
    answer; every prompt it was given is kept."""
    prompts: list[str] = []
    lock = threading.Lock()

    def reply_with(prompt: str) -> str:
        with lock:
            prompts.append(prompt)
        return "It is sunny." if "<tool_response>" in prompt else "Checking. " + CALL
    return prompts, reply_with


def tool_serving(tmp_path):
    prompts, reply_with = tool_reply_capturing()
    return prompts, serving(tmp_path / "data", reply_with=reply_with, max_tokens=200, slot_ctx=2048)


def test_a_call_is_a_function_call_item_after_the_message(tmp_path):
    prompts, server_cm = tool_serving(tmp_path)
    with server_cm as server:
        got = server.client().responses.create(model="any", input="weather in Paris?", tools=[WEATHER, TIME])
        body = post(server, {"input": "weather?", "tools": [WEATHER], "parallel_tool_calls": False}).json()
    assert got.status == "completed" and [item.type for item in got.output] == ["message", "function_call"]
    assert got.output_text == "Checking. "
    call = got.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
    assert [t.name for t in got.tools] == ["get_weather", "get_time"] and got.tool_choice == "auto"
    assert got.tools[0].parameters == WEATHER["parameters"] and got.tools[0].strict is True
    assert got.parallel_tool_calls is True and body["parallel_tool_calls"] is False
    assert body["tools"][0] == {**WEATHER, "strict": True}  # flat, as given
    assert "get_weather" in prompts[0] and "get_time" in prompts[0]  # the tools reached the template


def test_required_and_named_choices_constrain_the_answer_and_are_echoed(tmp_path):
    prompts, server_cm = tool_serving(tmp_path)
    with server_cm as server:
        grammars = []
        build = server.runner.build_sampler
        server.runner.build_sampler = lambda params, seed: (grammars.append(params.grammar), build(params, seed))[1]
        client = server.client()
        required = client.responses.create(model="any", input="weather?", tools=[WEATHER, TIME], tool_choice="required")
        named = client.responses.create(model="any", input="weather?", tools=[WEATHER, TIME],
                                        tool_choice={"type": "function", "name": "get_weather"})
        off = client.responses.create(model="any", input="weather?", tools=[WEATHER], tool_choice="none")
    assert isinstance(grammars[0], LarkGrammar) and isinstance(grammars[1], LarkGrammar)
    assert "get_time" in grammars[0] and "get_time" not in grammars[1]  # a named choice offers that tool alone
    assert grammars[2] is None and "get_weather" not in prompts[2]  # none: not shown, not constrained
    assert required.tool_choice == "required" and required.output[-1].type == "function_call"
    assert named.tool_choice.type == "function" and named.tool_choice.name == "get_weather"
    assert off.tool_choice == "none" and [i.type for i in off.output] == ["message"]
    assert off.output_text == "Checking. " + CALL  # with calls off, the text is the answer as written


def test_streamed_calls_are_their_own_items_with_argument_events(tmp_path):
    _prompts, server_cm = tool_serving(tmp_path)
    with server_cm as server:
        answer = post(server, {"input": "weather?", "tools": [WEATHER], "stream": True})
        client = server.client()
        with client.responses.stream(model="any", input="weather?", tools=[WEATHER]) as stream:
            typed = [event for event in stream]
            final = stream.get_final_response()
        kept = client.responses.retrieve(final.id)
    events = sse_events(answer.body)
    kinds = [kind for kind, _ in events]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-8:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added, delta, done, item_done = (data for _, data in events[-5:-1])
    assert added["output_index"] == 1 and added["item"]["type"] == "function_call" and added["item"]["arguments"] == ""
    assert added["item"]["status"] == "in_progress" and delta["item_id"] == added["item"]["id"] == done["item_id"]
    assert json.loads(delta["delta"]) == {"city": "Paris"} and done["arguments"] == delta["delta"]
    assert done["name"] == "get_weather" and item_done["item"]["status"] == "completed"
    whole = events[-1][1]["response"]
    assert whole["output"][1] == item_done["item"] and whole["output"][0]["content"][0]["text"] == "Checking. "
    assert "".join(d["delta"] for k, d in events if k == "response.output_text.delta") == "Checking. "
    # the SDK reads the events into its own types and assembles the same response
    done_events = [e for e in typed if e.type == "response.function_call_arguments.done"]
    assert len(done_events) == 1 and json.loads(done_events[0].arguments) == {"city": "Paris"}
    assert [i.type for i in final.output] == ["message", "function_call"] and final.output[1].name == "get_weather"
    assert kept.output[1].call_id == final.output[1].call_id  # stored as streamed


def test_a_call_alone_streams_no_message(tmp_path):
    with serving(tmp_path / "data", reply_with=lambda prompt: CALL, max_tokens=200, slot_ctx=2048) as server:
        answer = post(server, {"input": "weather?", "tools": [WEATHER], "tool_choice": "required", "stream": True})
        whole = server.client().responses.create(model="any", input="weather?", tools=[WEATHER], tool_choice="required")
    kinds = [kind for kind, _ in sse_events(answer.body)]
    assert "response.content_part.added" not in kinds and kinds.count("response.output_item.added") == 1
    assert [i.type for i in whole.output] == ["function_call"] and whole.output_text == ""


def test_a_round_trip_through_previous_response_id_and_as_replayed_input(tmp_path):
    prompts, server_cm = tool_serving(tmp_path)
    with server_cm as server:
        client = server.client()
        first = client.responses.create(model="any", input="weather in Paris?", tools=[WEATHER])
        call = first.output[1]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}
        chained = client.responses.create(model="any", previous_response_id=first.id, input=[output], tools=[WEATHER])
        replayed = client.responses.create(model="any", tools=[WEATHER], store=False, input=[
            {"role": "user", "content": "weather in Paris?"}, *[item.model_dump(exclude_none=True) for item in first.output],
            output])
        listed = client.responses.input_items.list(replayed.id) if replayed.store else None
        with pytest.raises(openai.BadRequestError, match="matches no function_call"):
            client.responses.create(model="any", input=[{**output, "call_id": "call_unknown"}],
                                    previous_response_id=first.id)
    assert chained.output_text == replayed.output_text == "It is sunny." and listed is None
    assert chained.status == "completed" and [i.type for i in chained.output] == ["message"]
    for prompt in prompts[1:3]:  # the call and its result reached the template, in order
        assert prompt.index("get_weather") < prompt.index("Paris") < prompt.index("<tool_response>") < prompt.index("sunny")
    assert prompts[1] == prompts[2]  # the chain and the replayed items are one conversation


def test_batch_lines_take_tools(tmp_path):
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": RESPONSES,
              "body": {"input": "weather?", "tools": [WEATHER], "tool_choice": "required"}} for i in range(3)]
    lines.append({"custom_id": "search", "method": "POST", "url": RESPONSES,
                  "body": {"input": "x", "tools": [{"type": "web_search_preview"}]}})
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    _prompts, server_cm = tool_serving(tmp_path)
    with server_cm as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=RESPONSES, completion_window="24h")
        done = wait_batch(client, batch.id, ended)
        outputs, errors = records(client, done.output_file_id), records(client, done.error_file_id)
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    for record in outputs:
        items = record["response"]["body"]["output"]
        assert [i["type"] for i in items] == ["message", "function_call"] and items[1]["name"] == "get_weather"
        assert record["response"]["body"]["tool_choice"] == "required"
    assert "web_search_preview" in errors[0]["error"]["message"]


def test_input_items_list_in_openais_shape_and_pages(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        made = client.responses.create(model="any", input=[
            {"role": "developer", "content": "Be terse."}, {"role": "user", "content": "question 1"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "answer 1"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "question 2"}]}])
        listed = client.responses.input_items.list(made.id)
        ascending = client.responses.input_items.list(made.id, order="asc", limit=2)
        after = client.responses.input_items.list(made.id, order="asc", limit=2, after=ascending.last_id)
        paged = [item.id for item in client.responses.input_items.list(made.id, limit=1)]  # the SDK follows has_more
        plain = client.responses.create(model="any", input="question 3")
        one = raw("GET", f"{server.base_url}/responses/{plain.id}/input_items").json()
        bad = raw("GET", f"{server.base_url}/responses/{plain.id}/input_items?limit=0")
        gone = raw("GET", f"{server.base_url}/responses/resp_{'0' * 48}/input_items")
    texts = [item.content[0].text for item in listed.data]
    assert texts == ["question 2", "answer 1", "question 1", "Be terse."]  # newest first, as OpenAI's default
    assert [item.role for item in listed.data] == ["user", "assistant", "user", "developer"]
    assert listed.data[1].content[0].type == "output_text" and listed.data[0].content[0].type == "input_text"
    assert listed.object == "list" and listed.has_more is False and listed.first_id == listed.data[0].id
    assert [i.content[0].text for i in ascending.data] == ["Be terse.", "question 1"] and ascending.has_more
    assert [i.content[0].text for i in after.data] == ["answer 1", "question 2"] and not after.has_more
    assert paged == [item.id for item in listed.data] and len(set(paged)) == 4
    assert one["data"] == [{"id": one["first_id"], "type": "message", "role": "user", "status": "completed",
                            "content": [{"type": "input_text", "text": "question 3"}]}]
    assert bad.status == 400 and "limit" in bad.json()["error"]["message"] and gone.status == 404


def test_cancel_answers_as_openai_does_for_a_response_made_without_background(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        made = client.responses.create(model="any", input="question 1")
        with pytest.raises(openai.BadRequestError, match="background") as refused:
            client.responses.cancel(made.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.cancel("resp_" + "0" * 48)
        still = client.responses.retrieve(made.id)
    assert refused.value.status_code == 400 and still.status == "completed"


@pytest.mark.parametrize("body, named", [
    ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"tools": [WEATHER, WEATHER]}, "repeats the name"),
    ({"tools": [{**WEATHER, "name": "no spaces"}]}, "body.tools[0].name"),
    ({"tools": [{**WEATHER, "function": {}}]}, "'function'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_time"}}, "get_time"),
    ({"tool_choice": "required"}, "needs body.tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "sometimes"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "input[0].arguments"),
])
def test_bad_tool_fields_are_a_400_naming_them(tmp_path, body, named):
    with serving(tmp_path / "data") as server:
        answer = post(server, {"input": "x", **body})
    assert answer.status == 400, answer.body
    assert named in answer.json()["error"]["message"]


def test_input_tokens_count_the_tools_and_a_call_s_output_as_create_evaluates_them(tmp_path):
    _prompts, server_cm = tool_serving(tmp_path)
    with server_cm as server:
        client = server.client()
        bare = client.responses.input_tokens.count(model="any", input="weather?")
        with_tools = client.responses.input_tokens.count(model="any", input="weather?", tools=[WEATHER])
        first = client.responses.create(model="any", input="weather?", tools=[WEATHER])
        output = [{"type": "function_call_output", "call_id": first.output[1].call_id, "output": "sunny"}]
        counted = client.responses.input_tokens.count(model="any", input=output, previous_response_id=first.id,
                                                      tools=[WEATHER])
        second = client.responses.create(model="any", input=output, previous_response_id=first.id, tools=[WEATHER])
    assert with_tools.input_tokens == first.usage.input_tokens > bare.input_tokens
    assert counted.input_tokens == second.usage.input_tokens > first.usage.input_tokens


def test_a_response_stored_before_input_items_were_kept_lists_its_messages(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        made = client.responses.create(model="any", input=[{"role": "user", "content": "question 1"},
                                                           {"role": "assistant", "content": "answer 1"}])
        path = tmp_path / "data" / "responses" / f"{made.id}.json"
        stored = json.loads(path.read_text())
        del stored["items"]
        path.write_text(json.dumps(stored))
        listed = client.responses.input_items.list(made.id, order="asc")
    assert [(i.role, i.content[0].type, i.content[0].text) for i in listed.data] == [
        ("user", "input_text", "question 1"), ("assistant", "output_text", "answer 1")]
    assert len({i.id for i in listed.data}) == 2
