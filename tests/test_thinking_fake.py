"""Thinking models without a model: the reasoning split (core/thinking.py) on plain strings, the
engine over the scripted fake runner with tests/templates/thinking.jinja (a template that opens
`<think>` in its generation prompt): reasoning apart from the answer, streamed and whole, the
thinking budget written out by the engine, budget 0 and enable_thinking false, a block never
closed; the request fields and their errors; the constraint after the block (llguidance over a
byte vocabulary); and the front ends' shapes: run's records, serve-stdin's events, serve's
streamed and whole answers through the openai SDK."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.thinking import ReasoningSplit, Thinking, ends_inside, markers_in
from llamabatch.openai_format import CHAT_URL, LineError, LineParser, build_record

from fake_runner import FakeRunner, text_tokens
from http_server import serving
from lazy_modules import lazy

openai = lazy("openai")

TEMPLATE = str(Path(__file__).parent / "templates" / "thinking.jinja")
ASK = [{"role": "user", "content": "capital of France?"}]
ANSWER = "Paris is in France.\n</think>\n\nParis."


def split_pieces(text: str, step: int, thinking: Thinking) -> tuple[str, str, ReasoningSplit]:
    split = ReasoningSplit(thinking)
    content, reasoning = "", ""
    for i in range(0, len(text), step):
        c, r = split.feed(text[i:i + step])
        content, reasoning = content + c, reasoning + r
    c, r = split.finish()
    return content + c, reasoning + r, split


INSIDE = Thinking("<think>", "</think>", True, None, ())
OPENS = Thinking("<think>", "</think>", False, None, ())


# -- the split --------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_a_closer_split_across_tokens_ends_the_reasoning_and_the_answer_follows(step):
    content, reasoning, split = split_pieces("\nLet me think.\n</think>\n\nParis.", step, INSIDE)
    assert (content, reasoning) == ("Paris.", "Let me think.")
    assert split.reasoning_text == reasoning and split.content_text == content


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_block_the_model_opens_itself_is_reasoning_and_a_late_opener_is_content(step):
    assert split_pieces("  <think>hm</think>A", step, OPENS)[:2] == ("A", "hm")
    assert split_pieces("No <think> here", step, OPENS)[:2] == ("No <think> here", "")
    assert split_pieces("<thin", step, OPENS)[:2] == ("<thin", "")  # the answer ended on what looked like an opener


def test_a_block_never_closed_is_all_reasoning_even_a_partial_closer():
    assert split_pieces("thinking on and on </thi", 1, INSIDE)[:2] == ("", "thinking on and on </thi")


def test_the_prompts_last_opener_decides_whether_the_answer_starts_inside():
    pair = markers_in(Path(TEMPLATE).read_text())
    assert pair == ("<think>", "</think>")
    assert ends_inside("<|im_start|>assistant\n<think>\n", pair)
    assert not ends_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n", pair)
    assert not ends_inside("no markers", pair)


# -- the engine over the fake runner ----------------------------------------------------------------


def engine_with(reply, **kw) -> tuple[Engine, FakeRunner]:
    runner = FakeRunner(n_slots=2, slot_ctx=2048, n_batch=256, reply=reply, **kw)
    engine = Engine(EngineConfig(n_parallel=2, n_batch=256, n_ctx=4096, chat_template=TEMPLATE), runner=runner,
                    default_params=SamplingParams(temperature=0, max_tokens=80))
    return engine, runner


def test_reasoning_goes_apart_from_the_answer_and_the_deltas_join_to_each():
    engine, _ = engine_with(lambda prompt: ANSWER)
    with engine:
        handle = engine.submit(ASK, SamplingParams(temperature=0, max_tokens=80), stream=True)
        deltas = list(handle)
        result = handle.result()
    assert (result.text, result.reasoning, result.finish_reason) == ("Paris.", "Paris is in France.", "stop")
    assert "".join(d.text for d in deltas) == result.text and "".join(d.reasoning for d in deltas) == result.reasoning
    assert result.usage.reasoning_tokens == len("Paris is in France.\n</think>")  # one fake token a character
    assert result.to_dict()["usage"]["completion_tokens_details"]["reasoning_tokens"] == result.usage.reasoning_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_answer_only_after_the_reasoning(stream):
    engine, _ = engine_with(lambda prompt: "Step 1. Step 2.\n</think>\n\nParis. Step 3.")
    with engine:
        handle = engine.submit(ASK, SamplingParams(temperature=0, stop=["Step"]), stream=stream)
        deltas = list(handle) if stream else []
        result = handle.result()
    assert (result.reasoning, result.text, result.finish_reason) == ("Step 1. Step 2.", "Paris. ", "stop")
    if stream:
        assert "".join(d.text for d in deltas) == result.text and "".join(d.reasoning for d in deltas) == result.reasoning


def test_a_stop_string_split_across_tokens_in_the_answer_is_held_back_and_a_partial_one_released_at_the_end():
    engine, _ = engine_with(lambda prompt: "x\n</think>\n\nab<E")
    with engine:
        stopped = engine.submit(ASK, SamplingParams(temperature=0, stop=["b<"])).result()
        partial = engine.submit(ASK, SamplingParams(temperature=0, stop=["<EN"])).result()
        cut = engine.submit(ASK, SamplingParams(temperature=0, stop=["<EN"], max_tokens=16)).result()
    assert (stopped.text, stopped.finish_reason) == ("a", "stop")
    assert (partial.text, partial.finish_reason) == ("ab<E", "stop")  # the end of generation released it
    assert (cut.text, cut.finish_reason) == ("ab<E", "length")


def test_a_budget_run_out_has_the_engine_write_the_closer_and_the_answer_follows():
    engine, runner = engine_with(lambda prompt: "abcdefghijklmnop")
    with engine:
        result = engine.submit(ASK, SamplingParams(temperature=0, max_tokens=40, reasoning_budget=5)).result()
    assert result.reasoning == "abcde" and result.usage.reasoning_tokens == 5
    assert result.text == "fghijklmnop" and result.finish_reason == "stop"
    assert runner.written == [text_tokens("\n</think>\n\n")]  # the sampler was told of them
    assert result.usage.completion_tokens == 5 + len("\n</think>\n\n") + len("fghijklmnop")


def test_a_closer_the_engine_was_writing_when_max_tokens_cut_it_is_not_reasoning():
    engine, _ = engine_with(lambda prompt: "abcdef")
    with engine:
        result = engine.submit(ASK, SamplingParams(temperature=0, max_tokens=3, reasoning_budget=1)).result()
    assert (result.reasoning, result.text, result.finish_reason) == ("a", "", "length")


def test_a_runner_that_caps_decode_rows_gets_the_closer_over_several_ticks_and_the_same_answer():
    from dataclasses import replace

    engine, runner = engine_with(lambda prompt: "abcdefghijklmnop")
    with engine:
        free = engine.submit(ASK, SamplingParams(temperature=0, max_tokens=40, reasoning_budget=5)).result()
    runner = FakeRunner(n_slots=2, slot_ctx=2048, n_batch=256, reply=lambda prompt: "abcdefghijklmnop")
    runner.capabilities = replace(runner.capabilities, max_decode_rows=3)  # as deterministic mode's passes
    engine = Engine(EngineConfig(n_parallel=2, n_batch=256, n_ctx=4096, chat_template=TEMPLATE), runner=runner)
    with engine:
        capped = engine.submit(ASK, SamplingParams(temperature=0, max_tokens=40, reasoning_budget=5)).result()
    decode_rows = [len(c.tokens) for p in runner.plans for c in p.plan.chunks if c.is_decode]
    assert max(decode_rows) == 3 and (capped.reasoning, capped.text) == (free.reasoning, free.text)
    assert capped.token_ids == free.token_ids


def test_budget_zero_and_enable_thinking_false_generate_no_reasoning_token():
    prompts: list[str] = []
    engine, runner = engine_with(lambda prompt: prompts.append(prompt) or "Paris.")
    with engine:
        zero = engine.submit(ASK, SamplingParams(temperature=0, reasoning_budget=0)).result()
        off = engine.submit(ASK, SamplingParams(temperature=0, chat_template_kwargs={"enable_thinking": False})).result()
    for result in (zero, off):
        assert (result.text, result.reasoning, result.usage.reasoning_tokens) == ("Paris.", "", 0)
    assert all(p.endswith("<think>\n\n</think>\n\n") for p in prompts)  # the template closed the block
    assert runner.written == []


def test_budget_zero_on_a_template_that_always_opens_the_block_closes_it_in_the_prompt():
    prompts: list[str] = []
    engine, _ = engine_with(lambda prompt: prompts.append(prompt) or "Paris.")
    with engine:  # the opener given as token ids: no template variable can turn it off
        tokens = text_tokens("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n")
        result = engine.submit(tokens, SamplingParams(temperature=0, reasoning_budget=0)).result()
    assert prompts[0].endswith("<think>\n\n</think>\n\n") and result.usage.reasoning_tokens == 0
    assert (result.text, result.reasoning) == ("Paris.", "")


def test_a_block_never_closed_within_max_tokens_is_length_with_its_reasoning_and_no_content():
    engine, _ = engine_with(lambda prompt: "I keep thinking " * 10)
    with engine:
        result = engine.submit(ASK, SamplingParams(temperature=0, max_tokens=20)).result()
    assert result.finish_reason == "length" and result.text == "" and result.reasoning == "I keep thinking I kee"[:20]
    line = {"custom_id": "a", "method": "POST", "url": CHAT_URL, "body": {"messages": ASK}}
    item = LineParser(SamplingParams(), input_format="jsonl").parse(json.dumps(line), 1)
    message = build_record(item, result, "m")["response"]["body"]["choices"][0]["message"]
    assert message["content"] is None and message["reasoning_content"] == result.reasoning


def test_a_grammar_that_cannot_take_the_closer_ends_its_request_alone():
    engine, _ = engine_with(lambda prompt: "abcdefgh")
    with engine:
        bad = engine.submit(ASK, SamplingParams(temperature=0, reasoning_budget=2, grammar="NO_CLOSE")).result()
        good = engine.submit(ASK, SamplingParams(temperature=0, reasoning_budget=2)).result()
    assert bad.finish_reason == "error" and "NO_CLOSE" in bad.error
    assert good.finish_reason == "stop" and good.reasoning == "ab"


def test_reasoning_effort_and_chat_template_kwargs_reach_the_template():
    prompts: list[str] = []
    engine, _ = engine_with(lambda prompt: prompts.append(prompt) or "ok")
    with engine:
        engine.submit(ASK, SamplingParams(temperature=0, reasoning_effort="low")).result()
    assert "Reasoning effort: low." in prompts[0]


def test_guesses_never_cross_the_budget():
    from llamabatch.core.speculation import thinking_room
    from llamabatch.core.sequence import Sequence

    seq = Sequence(1, [1], SamplingParams(), 0, thinking=Thinking("<think>", "</think>", True, 10, ()))
    seq.answer.reasoning_split = ReasoningSplit(seq.thinking)
    seq.answer.reasoning_split.tokens = 7
    assert thinking_room(seq) == 2
    seq.answer.reasoning_split.closing = True
    assert thinking_room(seq) > 1000
    opens = Sequence(2, [1], SamplingParams(), 0, thinking=Thinking("<think>", "</think>", False, 0, ()))
    opens.answer.reasoning_split = ReasoningSplit(opens.thinking)
    assert thinking_room(opens) == 0  # the model may still open a block: no guess may run into it


def test_a_request_whose_prompt_marks_no_reasoning_is_unchanged():
    runner = FakeRunner(n_slots=1, slot_ctx=512, reply=lambda prompt: "<think>x</think>y")
    with Engine(EngineConfig(n_parallel=1, n_ctx=512), runner=runner) as engine:
        result = engine.submit("plain", SamplingParams(temperature=0, reasoning_budget=0)).result()
    assert result.text == "<think>x</think>y" and result.reasoning is None
    assert "completion_tokens_details" not in result.to_dict()["usage"] and "reasoning" not in result.to_dict()


# -- request fields ----------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, words", [
    ("reasoning_budget", -1, "reasoning_budget must be an integer >= 0"),
    ("reasoning_budget", "lots", "reasoning_budget must be an integer"),
    ("reasoning_budget", 2.5, "reasoning_budget must be an integer"),
    ("reasoning_effort", "extreme", "reasoning_effort must be one of none, minimal, low, medium, high"),
    ("chat_template_kwargs", [1], "chat_template_kwargs must be an object"),
    ("chat_template_kwargs", {"messages": []}, "chat_template_kwargs must be variables other than messages"),
])
def test_a_bad_field_is_that_lines_error_naming_it(field, value, words):
    line = {"custom_id": "a", "method": "POST", "url": CHAT_URL, "body": {"messages": ASK, field: value}}
    item = LineParser(SamplingParams(), input_format="jsonl").parse(json.dumps(line), 1)
    assert isinstance(item, LineError) and words in item.message
    plain = LineParser(SamplingParams(), input_format="jsonl").parse(json.dumps({"messages": ASK, field: value}), 1)
    assert isinstance(plain, LineError) and words in plain.message


def test_the_reasoning_budget_flag_is_every_lines_default_and_a_bad_one_is_refused(tmp_path):
    from cli_harness import invoke, runner_for

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "messages": ASK}) + "\n"
                   + json.dumps({"id": 2, "messages": ASK, "reasoning_budget": 3}) + "\n")
    done = invoke(["run", str(src), "--chat-template", TEMPLATE, "--reasoning-budget", "0", "--temperature", "0"],
                  runner=runner_for(lambda prompt: "abcdefgh"))
    assert done.exit_code == 0, done.stderr
    records = {r["id"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert records[1]["reasoning"] == "" and records[1]["text"] == "abcdefgh"
    assert records[2]["reasoning"] == "abc" and records[2]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3
    bad = invoke(["run", str(src), "--reasoning-budget", "-2"], runner=runner_for(lambda prompt: "x"))
    assert bad.exit_code != 0 and "reasoning_budget must be an integer >= 0" in bad.stderr


# -- the constraint after the block --------------------------------------------------------------------


def llguidance_accepts(grammar: str, text: str) -> bool:
    import llguidance

    tokenizer = llguidance.LLTokenizer("byte")
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    tokens = tokenizer.tokenize_str(text)
    return not matcher.is_error() and matcher.validate_tokens(tokens) == len(tokens)


def test_a_schema_applies_from_the_end_of_the_block_and_the_engines_closer_fits_it():
    from llamabatch.constraints.thinking_grammar import thinking_grammar

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    inside = thinking_grammar("<think>", "</think>", True, json_schema=schema)
    assert llguidance_accepts(inside, 'Think freely {not json}\n</think>\n\n{"city": "Paris"}')
    assert not llguidance_accepts(inside, "Think</think>\n\nParis")
    opens = thinking_grammar("<think>", "</think>", False, json_schema=schema)
    assert llguidance_accepts(opens, '{"city": "Paris"}') and llguidance_accepts(opens, '<think>hm</think>{"city": "A"}')
    # a few blanks between the block and the answer, never an endless run of them
    assert llguidance_accepts(inside, 'hm</think>\r\n\r\n{"city": "Paris"}')
    assert not llguidance_accepts(inside, 'hm</think>\n\n\n\n\n{"city": "Paris"}')


def test_a_tool_grammar_after_the_block_keeps_its_call_syntax():
    from llamabatch.constraints.thinking_grammar import thinking_grammar
    from llamabatch.constraints.tool_grammar import tool_grammar

    tools = tool_grammar([("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})], "required",
                         False)
    wrapped = thinking_grammar("<think>", "</think>", True, grammar=tools)
    assert wrapped.syntax == tools.syntax
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert llguidance_accepts(wrapped, "I should call it.\n</think>\n\n" + call)
    assert not llguidance_accepts(wrapped, "I should call it.\n</think>\n\nno call")


def test_a_thinking_request_with_a_schema_gets_the_wrapped_grammar():
    engine, runner = engine_with(lambda prompt: 'hm\n</think>\n\n{"a": 1}')
    with engine:
        result = engine.submit(ASK, SamplingParams(temperature=0, json_schema={"type": "object"})).result()
        zero = engine.submit(ASK, SamplingParams(temperature=0, json_schema={"type": "object"},
                                                 reasoning_budget=0)).result()
    first, second = runner.samplers[0].params, runner.samplers[1].params
    assert first.json_schema is None and "thought[lazy]" in first.grammar  # constrained after the block
    assert second.json_schema == {"type": "object"} and not second.grammar  # no block: from the first token
    assert result.text == '{"a": 1}' and result.reasoning == "hm" and zero.reasoning == ""


# -- front ends --------------------------------------------------------------------------------------


def test_serve_stdin_streams_reasoning_in_token_events_and_its_done_event_carries_it():
    from llamabatch.serve.stdin.protocol import terminal_event, token_event

    assert token_event(1, "", None, "hm") == {"id": 1, "event": "token", "text": "", "reasoning": "hm"}
    assert "reasoning" not in token_event(1, "a")
    engine, _ = engine_with(lambda prompt: ANSWER)
    with engine:
        result = engine.submit(ASK, SamplingParams(temperature=0)).result()
    done = terminal_event(1, result)
    assert done["reasoning"] == "Paris is in France." and done["text"] == "Paris."


def test_serve_answers_reasoning_content_whole_and_streamed_through_the_openai_sdk(tmp_path):
    with serving(tmp_path / "data", reply_with=lambda prompt: ANSWER, max_tokens=80, slot_ctx=1024,
                 chat_template=TEMPLATE) as server:
        client = server.client()
        whole = client.chat.completions.create(model="m", messages=ASK)
        chunks = list(client.chat.completions.create(model="m", messages=ASK, stream=True,
                                                     stream_options={"include_usage": True}))
        bad = None
        try:
            client.chat.completions.create(model="m", messages=ASK, reasoning_effort="extreme")
        except openai.BadRequestError as exc:
            bad = exc
    message = whole.choices[0].message
    assert message.content == "Paris." and message.reasoning_content == "Paris is in France."
    assert whole.usage.completion_tokens_details.reasoning_tokens == len("Paris is in France.\n</think>")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == message.reasoning_content
    assert "".join(d.content or "" for d in deltas) == message.content
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == whole.usage.completion_tokens_details.reasoning_tokens
    assert bad is not None and "reasoning_effort" in str(bad)


def test_the_library_tool_message_carries_reasoning_content():
    from llamabatch.openai_format import tool_message

    engine, _ = engine_with(lambda prompt: ANSWER)
    with engine:
        result = engine.submit(ASK, SamplingParams(temperature=0)).result()
    message, finish_reason = tool_message(result, None)
    assert message == {"role": "assistant", "content": "Paris.", "reasoning_content": "Paris is in France."}


@pytest.mark.parametrize("line", [{"id": 1, "messages": ASK},
                                  {"custom_id": "r1", "method": "POST", "url": "/v1/responses",
                                   "body": {"input": "capital of France?"}}], ids=["messages", "responses"])
def test_a_table_output_has_a_reasoning_column_when_some_answer_reasoned(tmp_path, line):
    import csv

    from cli_harness import invoke, runner_for

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(line) + "\n")
    out = tmp_path / "out.csv"
    done = invoke(["run", str(src), "-o", str(out), "--chat-template", TEMPLATE, "--temperature", "0"],
                  runner=runner_for(lambda prompt: ANSWER))
    assert done.exit_code == 0, done.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert (row["response"], row["reasoning"]) == ("Paris.", "Paris is in France.")
    assert int(row["completion_tokens"]) == len(ANSWER) and int(row["prompt_tokens"]) > 0  # a response's usage too
    plain = tmp_path / "plain.csv"
    assert invoke(["run", str(src), "-o", str(plain)], runner=runner_for(lambda prompt: "x")).exit_code == 0
    assert "reasoning" not in next(csv.DictReader(plain.open()))


def test_a_serve_batch_record_carries_reasoning_content(tmp_path):
    from http_server import ended, records, wait_batch

    line = {"custom_id": "r1", "method": "POST", "url": CHAT_URL, "body": {"messages": ASK, "reasoning_budget": 4}}
    with serving(tmp_path / "data", reply_with=lambda prompt: ANSWER, max_tokens=80, slot_ctx=1024,
                 chat_template=TEMPLATE) as server:
        client = server.client()
        f = client.files.create(file=("in.jsonl", (json.dumps(line) + "\n").encode()), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint=CHAT_URL, completion_window="24h")
        (record,) = records(client, wait_batch(client, batch.id, ended).output_file_id)
    body = record["response"]["body"]
    assert body["choices"][0]["message"]["reasoning_content"] == "Pari"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4


def test_a_retried_supervised_request_streams_only_the_reasoning_not_yet_seen():
    from llamabatch.supervised.flight import Flight

    flight = Flight(handle=None, prompt=ASK, params=SamplingParams(), submitted_at=0.0)  # type: ignore[arg-type]
    first = flight.new_part("", [1, 2], "abc")
    flight.new_attempt()  # a new child streams from the start
    again = flight.new_part("", [1, 2, 3], "abcd")
    assert (first.reasoning, again.reasoning, again.token_ids) == ("abc", "d", [3])
