"""`llamabatch serve`'s /v1/responses through the openai SDK, unchanged (fake runner): create,
stream (typed events), retrieve, delete, chains through previous_response_id, what is refused,
and a batch of /v1/responses lines."""
from __future__ import annotations

import json
import threading

import pytest

from http_server import ended, raw, records, reply, serving, wait_batch
from lazy_modules import lazy

openai = lazy("openai")

RESPONSES = "/v1/responses"


def capturing():
    """A fake reply that also keeps every prompt the engine was given (rendered)."""
    prompts: list[str] = []
    lock = threading.Lock()

    def reply_with(prompt: str) -> str:
        with lock:
            prompts.append(prompt)
        return reply(prompt)
    return prompts, reply_with


def post(server, body: dict, path: str = "/responses"):
    return raw("POST", server.base_url + path, json.dumps(body).encode(), {"content-type": "application/json"})


def sse_events(body: bytes) -> list[tuple[str, dict]]:
    events = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_create_answers_in_openais_response_shape(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        got = client.responses.create(model="any", input="question 7", instructions="Answer briefly.",
                                      metadata={"team": "a"}, temperature=0.5, top_p=0.9)
        body = post(server, {"model": "any", "input": "question 8"}).json()
    assert got.object == "response" and got.id.startswith("resp_") and got.status == "completed"
    assert got.output_text == "answer 7" and got.instructions == "Answer briefly." and got.metadata == {"team": "a"}
    message = got.output[0]
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    assert got.usage.output_tokens == len("answer 7") and got.usage.input_tokens > 0
    assert got.usage.total_tokens == got.usage.input_tokens + got.usage.output_tokens
    assert got.usage.output_tokens_details.reasoning_tokens == 0 and got.usage.input_tokens_details.cached_tokens >= 0
    assert (got.temperature, got.top_p, got.store, got.incomplete_details) == (0.5, 0.9, True, None)
    # the wire's JSON, not the SDK's reading of it: output_text is the SDK's own convenience
    assert "output_text" not in body and body["text"] == {"format": {"type": "text"}}
    assert list(body["usage"]["input_tokens_details"]) == ["cached_tokens"]
    assert body["output"][0]["content"][0] == {"type": "output_text", "text": "answer 8", "annotations": [],
                                               "logprobs": []}


def test_input_items_of_every_role_and_text_part_become_the_chat(tmp_path):
    prompts, reply_with = capturing()
    with serving(tmp_path / "data", reply_with=reply_with) as server:
        got = server.client().responses.create(model="any", input=[
            {"role": "developer", "content": "Be terse."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "question 1"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "answer 1"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "Now:"},
                                         {"type": "input_text", "text": "question 2"}]}])
    assert got.output_text == "answer 2"
    prompt = prompts[-1]
    assert prompt.index("Be terse.") < prompt.index("question 1") < prompt.index("answer 1") < prompt.index(
        "Now:\nquestion 2")  # a message's parts joined, a line between them


def test_max_output_tokens_cuts_it_incomplete(tmp_path):
    with serving(tmp_path / "data") as server:
        got = server.client().responses.create(model="any", input="question 12345", max_output_tokens=3)
    assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
    assert got.output_text == "ans" and got.usage.output_tokens == 3 and got.max_output_tokens == 3
    assert got.output[0].status == "incomplete"


def test_streamed_as_typed_events_with_sequence_numbers(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        answer = raw("POST", server.base_url + "/responses",
                     json.dumps({"input": "question 3", "stream": True}).encode(), {"content-type": "application/json"})
        with client.responses.stream(model="any", input="question 4") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        created = list(client.responses.create(model="any", input="question 5", stream=True))
        kept = client.responses.retrieve(final.id)
    events = sse_events(answer.body)
    kinds = [kind for kind, _ in events]
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert all(kind == data["type"] for kind, data in events)  # each event: line names its data's type
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert "".join(d["delta"] for k, d in events if k == "response.output_text.delta") == "answer 3"
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []
    done = events[-1][1]["response"]
    assert done["status"] == "completed" and done["id"] == events[0][1]["response"]["id"]
    assert done["output"][0]["id"] == events[2][1]["item"]["id"] and done["usage"]["output_tokens"] == 8
    assert "".join(deltas) == final.output_text == "answer 4" and len(deltas) > 1
    assert kept.output_text == "answer 4" and kept.id == final.id  # stored before its last event left
    assert created[-1].type == "response.completed" and created[-1].response.output_text == "answer 5"


def test_a_streamed_response_cut_by_max_output_tokens_ends_incomplete(tmp_path):
    with serving(tmp_path / "data") as server:
        answer = post(server, {"input": "question 3", "stream": True, "max_output_tokens": 2})
    events = sse_events(answer.body)
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_retrieve_and_delete(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        made = client.responses.create(model="any", input="question 9")
        assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
        deleted = raw("DELETE", f"{server.base_url}/responses/{made.id}")
        assert deleted.status == 200 and deleted.json() == {"id": made.id, "object": "response", "deleted": True}
        with pytest.raises(openai.NotFoundError, match=made.id):
            client.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(made.id)
        for bad in ("resp_1", "../catalogue.sqlite3", "resp_" + "0" * 48):
            answer = raw("GET", f"{server.base_url}/responses/{bad}")
            assert answer.status == 404 and answer.json()["error"]["type"] == "invalid_request_error"
        other = client.responses.create(model="any", input="question 10")
        client.responses.delete(other.id)  # the SDK's own call


def test_store_false_keeps_nothing(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        made = client.responses.create(model="any", input="question 1", store=False)
        assert made.store is False and made.output_text == "answer 1"
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError, match="Previous response"):
            client.responses.create(model="any", input="question 2", previous_response_id=made.id)
    assert not list((tmp_path / "data" / "responses").iterdir())


def test_previous_response_id_continues_the_conversation(tmp_path):
    prompts, reply_with = capturing()
    with serving(tmp_path / "data", reply_with=reply_with) as server:
        client = server.client()
        first = client.responses.create(model="any", input="question 1", instructions="Be kind.")
        second = client.responses.create(model="any", input="question 2", previous_response_id=first.id,
                                         instructions="Be kind.")
        with client.responses.stream(model="any", input="question 3", previous_response_id=second.id) as stream:
            third = stream.get_final_response()
    assert (first.output_text, second.output_text, third.output_text) == ("answer 1", "answer 2", "answer 3")
    assert second.previous_response_id == first.id and third.previous_response_id == second.id
    last = prompts[-1]
    order = [last.index(t) for t in ("question 1", "answer 1", "question 2", "answer 2", "question 3")]
    assert order == sorted(order)
    assert "Be kind." in prompts[1] and "Be kind." not in last  # instructions are not carried over (OpenAI's rule)
    assert second.usage.input_tokens > first.usage.input_tokens


def test_a_response_deleted_mid_chain_breaks_only_the_chains_through_it(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        a = client.responses.create(model="any", input="question 1")
        b = client.responses.create(model="any", input="question 2", previous_response_id=a.id)
        c = client.responses.create(model="any", input="question 3", previous_response_id=b.id)
        d = client.responses.create(model="any", input="question 4", previous_response_id=a.id)
        client.responses.delete(b.id)
        with pytest.raises(openai.NotFoundError) as broken:
            client.responses.create(model="any", input="question 5", previous_response_id=c.id)
        assert b.id in broken.value.body["message"] and broken.value.body["param"] == "previous_response_id"
        assert broken.value.body["code"] == "previous_response_not_found"
        after_d = client.responses.create(model="any", input="question 6", previous_response_id=d.id)
        after_a = client.responses.create(model="any", input="question 7", previous_response_id=a.id)
        assert (after_d.output_text, after_a.output_text) == ("answer 6", "answer 7")
        with pytest.raises(openai.NotFoundError, match="resp_nothing"):
            client.responses.create(model="any", input="x", previous_response_id="resp_nothing")


@pytest.mark.parametrize("body, named", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input_image"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "input_file"),
    ({"input": [{"type": "computer_call", "call_id": "c", "action": {}}]}, "computer_call"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}, "matches no function_call"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "no message"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": [{"role": "tool", "content": "x"}]}, "role"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "web_search"),
    ({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "file_search"),
    ({"input": "x", "tool_choice": {"type": "computer_use_preview"}}, "computer_use_preview"),
    ({"input": "x", "temperature": -1}, "temperature"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "previous_response_id": 5}, "previous_response_id"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata"),
    ({"input": []}, "input"),
    ({"instructions": "x"}, "input"),
    ({"input": "x", "n": 2}, "'n'"),
])
def test_what_is_not_served_is_a_400_naming_it(tmp_path, body, named):
    with serving(tmp_path / "data") as server:
        answer = post(server, body)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert named in error["message"] and "\n" not in error["message"] and error["type"] == "invalid_request_error"


def test_json_schema_and_json_object_formats_are_echoed_and_reach_the_engine(tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with serving(tmp_path / "data") as server:
        schemas = []
        build = server.runner.build_sampler
        server.runner.build_sampler = lambda params, seed: (schemas.append(params.json_schema), build(params, seed))[1]
        client = server.client()
        got = client.responses.create(model="any", input="question 1", text={"format": {
            "type": "json_schema", "name": "count", "schema": schema, "strict": True}})
        loose = post(server, {"input": "question 2", "text": {"format": {"type": "json_object"}}}).json()
    assert got.text.format.type == "json_schema" and got.text.format.name == "count"
    assert got.text.format.schema_ == schema and got.text.format.strict is True
    assert loose["text"] == {"format": {"type": "json_object"}}
    assert schemas == [schema, {"type": "object"}]  # the masks chat's response_format uses (the model test: they hold)


def test_a_batch_of_responses_lines(tmp_path):
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": RESPONSES,
              "body": {"model": "any", "input": f"question {i}", "instructions": "Be kind.", "metadata": {"i": str(i)}}}
             for i in range(5)]
    lines.append({"custom_id": "chained", "method": "POST", "url": RESPONSES,
                  "body": {"input": "question 9", "previous_response_id": "resp_x"}})
    lines.append({"custom_id": "image", "method": "POST", "url": RESPONSES,
                  "body": {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}})
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with serving(tmp_path / "data") as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=RESPONSES, completion_window="24h")
        done = wait_batch(client, batch.id, ended)
        outputs, errors = records(client, done.output_file_id), records(client, done.error_file_id)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 5, 2)
    for record in outputs:
        body = record["response"]["body"]
        i = record["custom_id"][1:]
        assert record["response"]["status_code"] == 200 and body["object"] == "response"
        assert body["output"][0]["content"][0]["text"] == f"answer {i}" and body["metadata"] == {"i": i}
        assert body["status"] == "completed" and body["store"] is False and body["usage"]["output_tokens"] > 0
    by_id = {r["custom_id"]: r["error"]["message"] for r in errors}
    assert "previous_response_id is not supported in batch lines" in by_id["chained"]
    assert "input_image" in by_id["image"]


def test_the_api_key_and_the_body_bounds_apply(tmp_path):
    with serving(tmp_path / "data", api_key="secret") as server:
        with pytest.raises(openai.AuthenticationError):
            server.client().responses.create(model="any", input="question 1")
        made = server.client("secret").responses.create(model="any", input="question 1")
        assert raw("GET", f"{server.base_url}/responses/{made.id}").status == 401
        assert raw("DELETE", f"{server.base_url}/responses/{made.id}").status == 401
        huge = b'{"input": "' + b"x" * (17 * 1024 * 1024) + b'"}'
        answer = raw("POST", f"{server.base_url}/responses", huge,
                     {"content-type": "application/json", "authorization": "Bearer secret"})
        assert answer.status == 413


def test_a_stored_file_that_is_not_whole_is_as_good_as_gone(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        made = client.responses.create(model="any", input="question 1")
        (tmp_path / "data" / "responses" / f"{made.id}.json").write_text('{"response": {"id": 1}}')
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError, match=made.id):
            client.responses.create(model="any", input="question 2", previous_response_id=made.id)


def test_a_stream_that_fails_after_it_began_ends_with_response_failed():
    from llamabatch.openai_format import ResponsesRequest
    from llamabatch.serve.http.responses_events import ResponseEvents

    shape = ResponseEvents(ResponsesRequest([{"role": "user", "content": "x"}], None, {}, {"type": "text"}, {}, True),
                           "m")
    began = shape.opening() + shape.delta("a")
    events = sse_events(began + shape.failed({"code": "engine_crashed", "message": "boom"}))
    assert [k for k, _ in events][-2:] == ["response.output_text.delta", "response.failed"]
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "engine_crashed", "message": "boom"}
    assert failed["id"] == events[0][1]["response"]["id"] and events[-1][1]["sequence_number"] == 5


def test_a_streamed_request_the_engine_refuses_gets_its_status_before_any_event(tmp_path):
    too_long = "word " * 300  # past a 256-token slot
    with serving(tmp_path / "data") as server:
        whole = post(server, {"input": too_long})
        streamed = post(server, {"input": too_long, "stream": True})
    assert whole.status == streamed.status == 400 and whole.json() == streamed.json()
    assert not list((tmp_path / "data" / "responses").iterdir())


def test_a_chain_past_its_bound_is_a_400_and_a_torn_save_is_swept(tmp_path, monkeypatch):
    from llamabatch.serve.http import response_store

    monkeypatch.setattr(response_store, "MAX_CHAIN", 2)
    torn = tmp_path / "data" / "responses" / ".resp_x.json.123.tmp"
    torn.parent.mkdir(parents=True)
    torn.write_text('{"respo')  # a save a kill -9 cut short
    with serving(tmp_path / "data") as server:
        assert not torn.exists()
        client = server.client()
        a = client.responses.create(model="any", input="question 1")
        b = client.responses.create(model="any", input="question 2", previous_response_id=a.id)
        c = client.responses.create(model="any", input="question 3", previous_response_id=b.id)  # a chain of 2
        with pytest.raises(openai.BadRequestError, match="longer than 2 responses"):
            client.responses.create(model="any", input="question 4", previous_response_id=c.id)


def test_input_tokens_counts_what_create_would_evaluate(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        first = client.responses.create(model="any", input="question 1", instructions="Be kind.")
        counted = client.responses.input_tokens.count(model="any", input="question 1", instructions="Be kind.")
        assert counted.object == "response.input_tokens"
        assert counted.input_tokens == first.usage.input_tokens
        # a chain counts its earlier turns, as create evaluates them
        chained = client.responses.input_tokens.count(model="any", input="question 2", previous_response_id=first.id)
        second = client.responses.create(model="any", input="question 2", previous_response_id=first.id)
        assert chained.input_tokens == second.usage.input_tokens > first.usage.input_tokens
        unknown = post(server, {"model": "any", "input": "hi", "previous_response_id": "resp_" + "0" * 48},
                       "/responses/input_tokens")
        refused = post(server, {"model": "any", "input": [{"type": "input_image", "image_url": "x"}]},
                       "/responses/input_tokens")
    assert unknown.status == 404 and unknown.json()["error"]["code"] == "previous_response_not_found"
    assert refused.status == 400 and "input_image" in refused.json()["error"]["message"]
