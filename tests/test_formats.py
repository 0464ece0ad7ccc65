"""Batch-file line shapes: parsing input lines and building output records, without a model."""
from __future__ import annotations

import json

import pytest

from llamabatch.openai_format.lines import (CHAT_URL, COMPLETIONS_URL, OPENAI, PLAIN, LineError, LineParser, LineRequest, build_record, duplicate_id_error, error_result, openai_record, plain_record, record_error_code, record_id)
from llamabatch.params import SamplingParams
from llamabatch.results import Result, Timings, Usage

DEFAULTS = SamplingParams(max_tokens=32, temperature=0.5)


def parse(line, n=1, **kw):
    return LineParser(DEFAULTS, **kw).parse(line if isinstance(line, (str, bytes)) else json.dumps(line), n)


def openai(url=CHAT_URL, custom_id="r1", **body):
    body.setdefault("model", "gpt-4o-mini")
    if url == CHAT_URL:
        body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    else:
        body.setdefault("prompt", "Once")
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def ok_result(text="Hi.", reason="stop") -> Result:
    return Result(3, text, [1, 2], reason, Usage(prompt_tokens=25, cached_tokens=20, completion_tokens=3),
                  Timings(ttft_ms=12.5), seed=42)


# -- text lines --------------------------------------------------------------------------------


def test_text_line_is_a_prompt_with_the_line_number_as_id():
    req = parse("Tell me a joke\r\n", 7)
    assert isinstance(req, LineRequest)
    assert (req.id, req.prompt, req.shape, req.line_no) == (7, "Tell me a joke", PLAIN, 7)
    assert req.params is DEFAULTS


def test_blank_lines_are_skipped_and_a_bom_is_dropped():
    assert parse("   \n") is None
    assert parse("\n") is None
    assert parse("\ufeffHello", 1).prompt == "Hello"


def test_text_format_takes_json_looking_lines_as_prompts():
    req = parse('{"prompt": "x"}', input_format="text")
    assert req.prompt == '{"prompt": "x"}'


def test_jsonl_format_rejects_a_text_line():
    err = parse("just words", 3, input_format="jsonl")
    assert isinstance(err, LineError) and err.code == "invalid_json" and err.id is None
    assert err.message.startswith("line 3 ")


def test_system_turns_a_text_line_into_chat():
    req = parse("What is 2+2?", system="Be brief.")
    assert req.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


def test_not_utf8_is_that_lines_error():
    err = parse(b"caf\xe9\n", 4)
    assert isinstance(err, LineError) and err.code == "invalid_json" and "UTF-8" in err.message and err.id is None
    assert parse(b"caf\xe9\n", 4, input_format="text").id == 4  # text input: ids are line numbers


# -- plain JSON lines --------------------------------------------------------------------------


def test_prompt_line_fields_override_the_defaults():
    req = parse({"id": "a", "prompt": "Hi", "max_tokens": 5, "stop": "\n", "ignore_eos": True, "label": "x"})
    assert (req.id, req.prompt) == ("a", "Hi")
    assert (req.params.max_tokens, req.params.stop, req.params.ignore_eos) == (5, ["\n"], True)
    assert req.params.temperature == 0.5  # from the defaults
    assert req.echo is None


def test_echo_keeps_the_prompt_and_extra_fields():
    req = parse({"id": "a", "prompt": "Hi", "label": "x", "max_tokens": 5}, echo=True)
    assert req.echo == {"prompt": "Hi", "label": "x", "max_tokens": 5}
    assert parse("plain text", echo=True).echo == {"prompt": "plain text"}


def test_messages_line_gets_system_only_when_it_has_none():
    msgs = [{"role": "user", "content": "Hi"}]
    assert parse({"messages": msgs}, system="S").prompt == [{"role": "system", "content": "S"}, *msgs]
    own = [{"role": "system", "content": "Mine"}, *msgs]
    assert parse({"messages": own}, system="S").prompt == own
    assert parse({"messages": msgs, "system": "Line's"}, system="S").prompt[0]["content"] == "Line's"


def test_developer_role_is_read_as_system():
    req = parse({"messages": [{"role": "developer", "content": "D"}, {"role": "user", "content": "Hi"}]})
    assert req.prompt[0] == {"role": "system", "content": "D"}


def test_token_id_prompt_passes_through():
    assert parse({"prompt": [2, 100, 200]}).prompt == [2, 100, 200]


@pytest.mark.parametrize("line, code, words", [
    ({"prompt": "x", "max_tokens": "ten"}, "invalid_request", "max_tokens must be an integer, got 'ten'"),
    ({"prompt": "x", "temperature": -1}, "invalid_request", "temperature must be a number >= 0"),
    ({"prompt": "x", "top_p": 1.5}, "invalid_request", "top_p must be a number in (0, 1]"),
    ({"prompt": "x", "messages": []}, "invalid_request", "not both"),
    ({"prompt": 12}, "invalid_request", "prompt must be a string or a list of token ids"),
    ({"messages": []}, "invalid_request", "messages must be a non-empty list"),
    ({"prompt": "x", "id": 1.5}, "invalid_request", "id must be a non-empty string or an integer"),
    ({"prompt": "x", "system": 3}, "invalid_request", "system must be a string"),
    ({"foo": 1}, "unknown_shape", "neither 'prompt', 'messages'"),
    ([1, 2], "unknown_shape", "is an array"),
])
def test_bad_plain_lines_become_line_errors(line, code, words):
    err = parse(line, 9)
    assert isinstance(err, LineError), err
    assert err.code == code and words in err.message and err.shape == PLAIN


def test_error_keeps_a_readable_id():
    assert parse({"id": "keep", "prompt": "x", "max_tokens": "ten"}).id == "keep"
    assert parse({"id": "keep", "foo": 1}).id == "keep"


def test_malformed_json_has_no_id_and_names_its_line():
    err = parse('{"prompt": "unterminated', 12)
    assert (err.code, err.id, err.shape) == ("invalid_json", None, PLAIN)
    assert "line 12 is not valid JSON" in err.message


def test_malformed_openai_line_keeps_its_custom_id():
    err = parse('{"custom_id": "req-\\"7\\"", "url": "/v1/completions", "body": {', 3)
    assert (err.code, err.id, err.shape) == ("invalid_json", 'req-"7"', OPENAI)


# -- OpenAI Batch lines ------------------------------------------------------------------------


def test_openai_chat_body_maps_to_sampling_fields():
    req = parse(openai(max_tokens=10, max_completion_tokens=7, temperature=0, top_p=0.9, stop=["\n"], seed=3,
                       presence_penalty=0.5, frequency_penalty=0.25, logit_bias={"17": -100}, n=1,
                       stream=False, user="u", ignore_eos=True, top_k=5))
    assert (req.shape, req.url, req.id) == (OPENAI, CHAT_URL, "r1")
    assert req.prompt == [{"role": "user", "content": "Hi"}]
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.stop, p.seed) == (7, 0.0, 0.9, ["\n"], 3)
    assert (p.presence_penalty, p.frequency_penalty, p.logit_bias) == (0.5, 0.25, {17: -100.0})
    assert (p.ignore_eos, p.top_k) == (True, 5)


def test_openai_null_fields_mean_the_default():
    p = parse(openai(max_tokens=None, temperature=None, stop=None, seed=None, n=None)).params
    assert (p.max_tokens, p.temperature, p.stop, p.seed) == (32, 0.5, [], None)


def test_openai_response_format_becomes_a_json_schema():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert parse(openai(response_format=fmt)).params.json_schema == schema
    assert parse(openai(response_format={"type": "json_object"})).params.json_schema == {"type": "object"}
    assert parse(openai(response_format={"type": "text"})).params.json_schema is None


def test_openai_completion_prompt_forms():
    assert parse(openai(COMPLETIONS_URL, prompt="Once")).prompt == "Once"
    assert parse(openai(COMPLETIONS_URL, prompt=["Once"])).prompt == "Once"
    assert parse(openai(COMPLETIONS_URL, prompt=[5, 6])).prompt == [5, 6]


def test_system_flag_reaches_openai_chat_but_not_completions():
    assert parse(openai(), system="S").prompt[0] == {"role": "system", "content": "S"}
    assert parse(openai(COMPLETIONS_URL), system="S").prompt == "Once"


@pytest.mark.parametrize("line, code, words", [
    (openai(n=0), "invalid_request", "n must be an integer >= 1"),
    (openai(best_of=3), "invalid_request", "body.best_of is not supported (got 3): llamabatch does not rank"),
    (openai(stream=True), "invalid_request", "body.stream is not supported"),
    (openai(tools=[{"type": "function"}]), "invalid_request", "body.tools[0].function must be an object"),
    (openai(frobnicate=1), "invalid_request", "unsupported body field 'frobnicate'"),
    (openai(max_tokens="ten"), "invalid_request", "max_tokens must be an integer"),
    (openai(temperature=-0.5), "invalid_request", "temperature must be a number >= 0"),
    (openai(response_format={"type": "xml"}), "invalid_request", "response_format.type"),
    (openai(COMPLETIONS_URL, prompt=["a", "b"]), "invalid_request", "one prompt"),
    ({**openai(), "url": "/v1/moderations"}, "invalid_url", "unknown url \"/v1/moderations\""),
    ({**openai(), "method": "GET"}, "invalid_request", "method must be POST"),
    ({**openai(), "body": "text"}, "invalid_request", "body must be an object"),
    ({"custom_id": "r1", "url": CHAT_URL, "body": {"prompt": "x"}}, "invalid_request", "needs body.messages"),
])
def test_bad_openai_lines_become_openai_errors(line, code, words):
    err = parse(line, 5)
    assert isinstance(err, LineError), err
    assert (err.code, err.shape, err.id) == (code, OPENAI, "r1")
    assert words in err.message


def test_openai_line_without_custom_id_has_no_id_and_names_its_line():
    err = parse({"url": CHAT_URL, "body": {"messages": [{"role": "user", "content": "x"}]}}, 8)
    assert (err.code, err.id, err.shape) == ("invalid_request", None, OPENAI)
    assert err.message == "line 8: custom_id is missing: an OpenAI Batch line needs one, a non-empty string"


# -- records -----------------------------------------------------------------------------------


def test_plain_record_shape():
    rec = plain_record("a", ok_result(), echo={"prompt": "Hi"})
    assert list(rec) == ["id", "text", "finish_reason", "usage", "timings", "seed", "error", "input"]
    assert rec["usage"] == {"prompt_tokens": 25, "cached_tokens": 20, "completion_tokens": 3, "total_tokens": 28}
    assert rec["error"] is None and rec["input"] == {"prompt": "Hi"}


def test_plain_error_record_has_code_and_message():
    rec = build_record(LineError(4, 4, "invalid_json", "line 4 is not valid JSON"), error_result("invalid_json",
                       "line 4 is not valid JSON"), "m")
    assert rec["id"] == 4 and rec["finish_reason"] == "error" and rec["text"] == ""
    assert rec["error"] == {"code": "invalid_json", "message": "line 4 is not valid JSON"}


def test_openai_chat_record_matches_the_batch_output_shape():
    rec = openai_record("request-1", CHAT_URL, ok_result(), "gemma", created=1764400000)
    assert rec["id"].startswith("batch_req_") and rec["custom_id"] == "request-1" and rec["error"] is None
    resp = rec["response"]
    assert resp["status_code"] == 200 and resp["request_id"]
    body = resp["body"]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert (body["model"], body["created"]) == ("gemma", 1764400000)
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hi."}, "logprobs": None,
                                "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 25, "completion_tokens": 3, "total_tokens": 28,
                             "prompt_tokens_details": {"cached_tokens": 20}}


def test_openai_completion_record_uses_text_completion():
    body = openai_record("c", COMPLETIONS_URL, ok_result("abc", "length"), "gemma")["response"]["body"]
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "abc"
    assert body["choices"][0]["finish_reason"] == "length"


def test_openai_error_records_carry_status_and_error():
    rec = openai_record("c", CHAT_URL, error_result("context_overflow", "prompt has 900 tokens"), "gemma")
    assert rec["response"]["status_code"] == 400 and rec["response"]["body"] is None
    assert rec["error"] == {"code": "context_overflow", "message": "prompt has 900 tokens"}
    assert openai_record("c", CHAT_URL, error_result("decode_error", "boom"), "g")["response"]["status_code"] == 500


def test_record_ids_for_resume():
    assert record_id(plain_record(7, ok_result())) == 7
    assert record_id(openai_record("x", CHAT_URL, ok_result(), "g")) == "x"
    assert record_id({"text": "no id"}) is None and record_id([1]) is None
    err = duplicate_id_error(LineRequest(9, "x", "p", DEFAULTS, OPENAI, CHAT_URL))
    rec = build_record(err, err.result(), "g")
    assert record_id(rec) == "x" and record_error_code(rec) == "duplicate_id"
    assert "line 9" in rec["error"]["message"]
