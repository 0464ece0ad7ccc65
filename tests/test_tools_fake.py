"""Tool calls without a model: the request fields and their errors (openai_format/tools_request.py,
tool_turns.py), the call grammar's shape (constraints/tool_grammar.py), reading calls out of an
answer whole and streamed (tool_calls.py), the fallback prompt (models/tool_prompt.py), and the
front ends over the scripted fake runner: `run`'s records, serve-stdin's done event, and
`serve` through the openai SDK (a call, streamed calls, a two-turn round trip)."""
from __future__ import annotations

import json

import pytest

from llamabatch.constraints.tool_grammar import LarkGrammar, tool_grammar
from llamabatch.models.chat_template import plain_template
from llamabatch.openai_format import (CHAT_URL, LineError, LineParser, ToolCallSplitter, build_record,
                                      split_tool_calls)
from llamabatch.params import SamplingParams
from llamabatch.results import Result, Timings, Usage
from llamabatch.serve.stdin.protocol import parse_line, terminal_event

from http_server import serving
from lazy_modules import lazy

openai = lazy("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'


def chat_line(**body) -> dict:
    return {"custom_id": "r1", "method": "POST", "url": CHAT_URL,
            "body": {"messages": [{"role": "user", "content": "weather in Paris?"}], **body}}


def parse(line: dict, **kw):
    return LineParser(SamplingParams(temperature=0), input_format="jsonl", **kw).parse(json.dumps(line), 1)


def result(text: str, finish_reason: str = "stop") -> Result:
    return Result(0, text, [], finish_reason, Usage(prompt_tokens=3, completion_tokens=len(text)), Timings())


# -- reading calls out of an answer ---------------------------------------------------------------


def streamed(text: str, step: int = 1) -> list[tuple[str, object]]:
    splitter = ToolCallSplitter()
    events = []
    for i in range(0, len(text), step):
        events += splitter.feed(text[i:i + step])
    return events + splitter.finish()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_call_split_across_tokens_is_one_call(step):
    events = streamed(CALL, step)
    assert events == [("call", {"name": "get_weather", "arguments": {"city": "Paris"}})]


def test_two_calls_in_one_answer_and_the_newline_between_them_is_no_content():
    content, calls = split_tool_calls(CALL + "\n" + CALL2)
    assert content is None and [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert [e[0] for e in streamed(CALL + "\n" + CALL2)] == ["call", "call"]


def test_text_before_a_call_is_content():
    content, calls = split_tool_calls("Let me look. " + CALL)
    assert content == "Let me look. " and calls[0]["arguments"] == {"city": "Paris"}
    joined = "".join(v for k, v in streamed("Let me look. " + CALL) if k == "content")
    assert joined == content


def test_a_call_never_closed_is_content_and_keeps_finish_reason_length():
    text = CALL + "\n" + CALL2[:30]
    item = parse(chat_line(tools=[WEATHER, TIME], tool_choice="required"))
    body = build_record(item, result(text, "length"), "m")["response"]["body"]
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == "\n" + CALL2[:30]
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]
    # only an unclosed call: no calls at all, the text as written
    content, calls = split_tool_calls(CALL2[:30])
    assert calls == [] and content == CALL2[:30]
    assert "".join(v for k, v in streamed(CALL2[:30]) if k == "content") == CALL2[:30]


def test_a_partial_opener_in_plain_text_is_given_out_at_the_end():
    events = streamed("a < b <tool")
    assert {kind for kind, _ in events} == {"content"} and "".join(v for _, v in events) == "a < b <tool"
    splitter = ToolCallSplitter()
    assert splitter.feed("a <tool") == [("content", "a ")]  # "<tool" may open a call: held
    assert splitter.feed("box>") == [("content", "<toolbox>")]


def test_the_chat_record_has_openais_tool_call_shape():
    item = parse(chat_line(tools=[WEATHER]))
    body = build_record(item, result(CALL), "m")["response"]["body"]
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_legacy_functions_answer_with_function_call():
    item = parse(chat_line(functions=[WEATHER["function"]], function_call={"name": "get_weather"}))
    assert item.tools.legacy and item.tools.named == "get_weather" and not item.tools.parallel
    body = build_record(item, result(CALL), "m")["response"]["body"]
    assert body["choices"][0]["finish_reason"] == "function_call"
    assert body["choices"][0]["message"]["function_call"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_tool_choice_none_reads_no_calls_and_sets_no_grammar():
    item = parse(chat_line(tools=[WEATHER], tool_choice="none"))
    assert item.params.grammar is None and item.prompt == chat_line()["body"]["messages"]
    body = build_record(item, result(CALL), "m")["response"]["body"]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": CALL}


# -- requests ----------------------------------------------------------------------------------


def test_tools_become_the_templates_pseudo_message_and_a_lark_grammar():
    item = parse(chat_line(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}},
                           parallel_tool_calls=False))
    assert item.prompt[0] == {"role": "llamabatch.tools", "content": "", "tools": [WEATHER, TIME]}
    grammar = item.params.grammar
    assert isinstance(grammar, LarkGrammar) and '"get_time' in grammar and '"get_weather' not in grammar
    assert "start: call\n" in grammar  # one call
    named = parse(chat_line(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert "start: call\n" in named.params.grammar  # a named tool is called once, parallel_tool_calls or not


def test_grammar_shapes_by_mode():
    tools = [("a", {"type": "object"})]
    assert tool_grammar(tools, "none", True) is None
    assert 'start: call ("\\n" call)*' in tool_grammar(tools, "required", True)
    auto = tool_grammar(tools, "auto", False)
    assert "start: free_call? free_text" in auto and "opener[lazy]" in auto


BAD = [
    (dict(tools=[WEATHER, WEATHER]), "body.tools[1] repeats the name 'get_weather'"),
    (dict(tools=[{"type": "function", "function": {"name": "no spaces"}}]), "body.tools[0].function.name must be"),
    (dict(tools=[{"type": "code_interpreter"}]), 'body.tools[0].type must be "function"'),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
     "body.tools[0].function.parameters must be a JSON schema object"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": False}, "required": ["x"]}}}]),
     "body.tools[0].function.parameters is not a usable schema"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]),
     "body.tools[0].function.parameters must describe an object"),
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
     "body.tool_choice names 'nope', which is not among the listed tools (get_weather)"),
    (dict(tools=[WEATHER], tool_choice="always"), "body.tool_choice must be none, auto, required"),
    (dict(tool_choice="required"), "body.tool_choice \"required\" needs body.tools"),
    (dict(tools=[WEATHER], parallel_tool_calls="yes"), "body.parallel_tool_calls must be true or false"),
    (dict(tools=[WEATHER], functions=[WEATHER["function"]]), "give body.tools or the older body.functions"),
    (dict(tools=[WEATHER], response_format={"type": "json_object"}), "cannot be combined with response_format"),
    (dict(tools="get_weather"), "body.tools must be an array of tools"),
    (dict(messages=[{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "1"}]),
     'messages[1].tool_call_id "call_9" matches no tool call of an earlier assistant message'),
    (dict(messages=[{"role": "llamabatch.tools", "tools": []}]), "messages[0].role 'llamabatch.tools'"),
    (dict(messages=[{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}]),
     "messages[0].tool_calls[0].id must be a non-empty string"),
]


@pytest.mark.parametrize("body, words", BAD)
def test_bad_tool_requests_are_the_lines_own_error_naming_the_field(body, words):
    item = parse(chat_line(**body))
    assert isinstance(item, LineError) and item.code == "invalid_request" and item.id == "r1"
    assert words in item.message, item.message


def test_a_replayed_round_trip_reads_its_tool_turns():
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    item = parse(chat_line(messages=history, tools=[WEATHER]))
    assistant, tool = item.prompt[2], item.prompt[3]
    assert assistant["content"] == "" and assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "get_weather"}


def test_legacy_function_turns_map_onto_tool_turns():
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None,
                "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
               {"role": "function", "name": "get_weather", "content": "sunny"}]
    item = parse(chat_line(messages=history, functions=[WEATHER["function"]]))
    assert item.prompt[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert item.prompt[3]["role"] == "tool" and item.prompt[3]["tool_call_id"] == item.prompt[2]["tool_calls"][0]["id"]


def test_plain_lines_take_tools_and_their_records_carry_tool_calls():
    item = parse({"id": 4, "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
                  "tool_choice": "required"})
    record = build_record(item, result(CALL), "m")
    assert record["finish_reason"] == "tool_calls" and record["text"] == ""
    assert record["tool_calls"][0]["function"]["name"] == "get_weather"
    plain = build_record(parse({"id": 5, "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]}),
                         result("no call"), "m")
    assert plain["tool_calls"] == [] and plain["text"] == "no call"
    bad = parse({"id": 6, "prompt": "x", "tools": [WEATHER]})
    assert isinstance(bad, LineError) and "tools need a chat line" in bad.message


def test_completions_bodies_still_refuse_tools():
    line = {"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x", "tools": [WEATHER]}}
    assert "body.tools is not supported" in parse(line).message


# -- the fallback prompt -----------------------------------------------------------------------------


def test_a_template_without_tools_gets_them_in_a_system_turn_and_tool_turns_as_text(capsys):
    item = parse(chat_line(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "P"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], tools=[WEATHER]))
    text = plain_template().render(item.prompt)
    assert text.startswith("System: You may call one or more functions")
    assert '"name": "get_weather"' in text and "<tool_call>\n{\"name\": <function-name>" in text
    assert 'Assistant: <tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>' in text
    assert "User: <tool_response>\nsunny\n</tool_response>" in text
    plain_template().render(item.prompt)
    assert capsys.readouterr().err.count("does not read tools") <= 1  # said once a process


# -- front ends ----------------------------------------------------------------------------------------


def test_serve_stdin_done_event_carries_the_calls():
    line = json.dumps({"id": "s", "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
                       "tool_choice": "required"})
    command = parse_line(line, 1, SamplingParams(temperature=0))
    assert isinstance(command.params.grammar, LarkGrammar)
    event = terminal_event("s", result(CALL), 1, tools=command.tools)
    assert event["finish_reason"] == "tool_calls" and event["tool_calls"][0]["function"]["name"] == "get_weather"


def tool_reply(prompt: str) -> str:
    """The fake model: a weather call, then (once the tool's answer is in the prompt) a final answer."""
    if "<tool_response>" in prompt:
        return "It is sunny."
    return "Checking. " + CALL


def test_openai_sdk_tool_call_streamed_and_round_trip(tmp_path):
    with serving(tmp_path / "data", reply_with=tool_reply, max_tokens=200, slot_ctx=2048) as server:
        client = server.client()
        messages = [{"role": "user", "content": "weather in Paris?"}]
        first = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER], tool_choice="auto")
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking. "
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}

        chunks = list(client.chat.completions.create(model="any", messages=messages, tools=[WEATHER], stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.content or "" for d in deltas) == "Checking. "
        streamed_calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert [(tc.index, tc.function.name, tc.function.arguments) for tc in streamed_calls] == [
            (0, "get_weather", '{"city": "Paris"}')]
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        final = client.chat.completions.create(model="any", messages=messages, tools=[WEATHER])
        assert final.choices[0].message.content == "It is sunny." and final.choices[0].finish_reason == "stop"
        assert not final.choices[0].message.tool_calls

        with pytest.raises(openai.BadRequestError) as bad:
            client.chat.completions.create(model="any", messages=messages[:1], tools=[WEATHER, WEATHER])
        assert "repeats the name" in str(bad.value)


def test_openai_sdk_stream_helper_accumulates_the_call(tmp_path):
    with serving(tmp_path / "data", reply_with=tool_reply, max_tokens=200, slot_ctx=2048) as server:
        client = server.client()
        with client.chat.completions.stream(model="any", messages=[{"role": "user", "content": "weather?"}],
                                            tools=[WEATHER], tool_choice="required") as stream:
            for _event in stream:
                pass
            final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


# -- the library ----------------------------------------------------------------------------------


def test_the_library_helpers_around_engine_submit():
    from llamabatch import Engine, EngineConfig
    from llamabatch.openai_format import tool_message, with_tools

    from fake_runner import FakeRunner

    runner = FakeRunner(n_slots=1, slot_ctx=2048, n_batch=256, reply=lambda prompt: CALL)
    with Engine(EngineConfig(n_parallel=1, n_batch=256, n_ctx=2048), runner=runner,
                default_params=SamplingParams(temperature=0, max_tokens=200)) as engine:
        messages, params, tools = with_tools([{"role": "user", "content": "weather?"}], [WEATHER], "required",
                                             params=SamplingParams(temperature=0, max_tokens=200))
        assert isinstance(params.grammar, LarkGrammar) and messages[0]["role"] == "llamabatch.tools"
        result = engine.submit(messages, params).result(timeout=30)
    message, finish_reason = tool_message(result, tools)
    assert finish_reason == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "get_weather"
    with pytest.raises(Exception, match="tool_choice names 'nope'"):
        with_tools([{"role": "user", "content": "x"}], [WEATHER], {"type": "function", "function": {"name": "nope"}})


def test_a_tables_tool_calls_cell_holds_the_calls_and_its_response_the_content():
    from llamabatch.jobs.tables.table_output import calls_text, response_text

    item = parse(chat_line(tools=[WEATHER]))
    record = build_record(item, result(CALL), "m")
    assert response_text(record) is None and json.loads(calls_text(record))[0]["function"]["name"] == "get_weather"
    plain = build_record(parse({"id": 1, "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]}),
                         result("Sure. " + CALL), "m")
    assert response_text(plain) == "Sure. "
    assert json.loads(calls_text(plain))[0]["function"]["arguments"] == '{"city": "Paris"}'
    assert calls_text(build_record(item, result("No call."), "m")) is None


def test_run_to_a_table_has_a_tool_calls_column_only_when_an_answer_made_calls(tmp_path):
    import csv

    from cli_harness import invoke, runner_for

    lines = [{"id": i, "messages": [{"role": "user", "content": f"q{i}"}], "tools": [WEATHER]} for i in range(2)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for reply, has_column in ((lambda p: CALL if "q1" in p else "plain", True), (lambda p: "plain", False)):
        out = tmp_path / f"out{has_column}.csv"
        done = invoke(["run", str(tmp_path / "in.jsonl"), "-o", str(out)], runner=runner_for(reply))
        assert done.exit_code == 0, done.stderr
        rows = list(csv.DictReader(out.open()))
        assert ("tool_calls" in rows[0]) is has_column
        if has_column:
            by_id = {r["id"]: r for r in rows}
            assert by_id["0"]["tool_calls"] == "" and by_id["0"]["response"] == "plain"
            assert json.loads(by_id["1"]["tool_calls"])[0]["function"]["name"] == "get_weather"


def test_a_serve_batch_of_tool_lines_records_the_calls(tmp_path):
    from http_server import ended, records, wait_batch

    lines = [chat_line(tools=[WEATHER], tool_choice="required"),
             {**chat_line(tools=[WEATHER, WEATHER]), "custom_id": "r2"}]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    with serving(tmp_path / "data", reply_with=tool_reply, max_tokens=200, slot_ctx=2048) as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=CHAT_URL, completion_window="24h")
        done = wait_batch(client, batch.id, ended)
        out = {r["custom_id"]: r for r in records(client, done.output_file_id) + records(client, done.error_file_id)}
    message = out["r1"]["response"]["body"]["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather" and message["content"] == "Checking. "
    assert "repeats the name" in out["r2"]["error"]["message"]


# -- chat --tools ----------------------------------------------------------------------------------


def test_chat_with_tools_offers_them_and_names_each_call(tmp_path):
    from llamabatch import Engine, EngineConfig
    from llamabatch.chat.chat_tools import read_tools_file
    from llamabatch.chat.session import ChatIO, ChatSession
    from llamabatch.errors import InvalidRequest

    from fake_runner import FakeRunner

    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"tools": [WEATHER]}))
    prompts = []

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return CALL if len(prompts) == 1 else "Sunny then."

    notices: list[str] = []
    runner = FakeRunner(n_slots=1, slot_ctx=4096, reply=reply)
    with Engine(EngineConfig(n_parallel=1, n_ctx=4096), runner=runner) as engine:
        io = ChatIO(lambda prompt: "", lambda text: None, notices.append, notices.append)
        session = ChatSession(engine, SamplingParams(max_tokens=200, temperature=0), io, tools=read_tools_file(str(path)))
        assert isinstance(session.request_params().grammar, LarkGrammar)
        session.say("weather in Paris?")
        session.say("it is sunny")
    assert 'tool call: get_weather {"city": "Paris"}' in notices
    assert all('"name": "get_weather"' in p for p in prompts)  # offered with every turn
    path.write_text("[]")
    with pytest.raises(InvalidRequest, match="lists no tools"):
        read_tools_file(str(path))


def test_n_samples_each_get_their_calls_in_plain_records_and_serve_stdin():
    item = parse({"id": 1, "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER], "n": 2})
    both = result(CALL)
    both.samples = [result(CALL), result("no call")]
    record = build_record(item, both, "m")
    assert record["finish_reasons"] == ["tool_calls", "stop"] and record["texts"] == ["", "no call"]
    assert [len(calls) for calls in record["tool_calls"]] == [1, 0]
    event = terminal_event(1, both, 1, tools=item.tools)
    assert event["finish_reasons"] == ["tool_calls", "stop"] and len(event["tool_calls"][0]) == 1


def test_chat_names_a_call_whose_arguments_hold_a_lone_surrogate_escape():
    from llamabatch.chat.chat_tools import call_notices
    from llamabatch.constraints.tool_syntax import HERMES

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "\\ud800"}}\n</tool_call>'
    (line,) = call_notices(call, HERMES)
    line.encode("utf-8")  # printable: the escape is kept, not a character UTF-8 cannot hold
    assert line == 'tool call: get_weather {"city": "\\ud800"}'
