"""The serve-stdin protocol without a model: parsing lines, building events."""
from __future__ import annotations

import json

import pytest

from llamabatch.params import SamplingParams
from llamabatch.serve.stdin.protocol import (BadLine, Cancel, Stats, Submit, encode, error_event, parse_line, ready_event, stats_event, terminal_event, token_event)
from llamabatch.results import Result, Timings, Usage

DEFAULTS = SamplingParams(max_tokens=32, temperature=0.5, stop=["\n\n"])


def bad(text: str | bytes, line: int = 7) -> BadLine:
    with pytest.raises(BadLine) as info:
        parse_line(text, line, DEFAULTS)
    return info.value


def test_request_with_prompt_id_stream_and_sampling_fields():
    cmd = parse_line('{"id": "a1", "prompt": "Hi", "stream": true, "max_tokens": 5, "stop": "."}', 3, DEFAULTS)
    assert isinstance(cmd, Submit)
    assert (cmd.id, cmd.prompt, cmd.stream, cmd.line) == ("a1", "Hi", True, 3)
    assert cmd.params.max_tokens == 5 and cmd.params.stop == ["."]
    assert cmd.params.temperature == 0.5  # not given: the resolved default


def test_request_without_sampling_fields_gets_the_defaults_and_no_stream():
    cmd = parse_line(b'{"id": 9, "prompt": "Hi"}\n', 1, DEFAULTS)
    assert cmd.id == 9 and cmd.stream is False
    assert cmd.params == DEFAULTS


def test_request_without_id_is_named_after_its_line():
    cmd = parse_line('{"prompt": "Hi"}', 12, DEFAULTS)
    assert cmd.id == "line-12"


def test_messages_and_token_id_prompts():
    messages = [{"role": "user", "content": "Hello"}]
    assert parse_line(json.dumps({"messages": messages}), 1, DEFAULTS).prompt == messages
    assert parse_line('{"prompt": [2, 105, 9]}', 1, DEFAULTS).prompt == [2, 105, 9]


def test_blank_lines_are_skipped():
    assert parse_line("   \n", 4, DEFAULTS) is None
    assert parse_line(b"", 4, DEFAULTS) is None


def test_ops():
    assert parse_line('{"op": "cancel", "id": "a1"}', 5, DEFAULTS) == Cancel("a1", 5)
    assert parse_line('{"op": "stats"}', 6, DEFAULTS) == Stats(6)
    assert parse_line('{"op": "stats", "id": "s"}', 6, DEFAULTS) == Stats(6, "s")


@pytest.mark.parametrize("text, code, fragment", [
    ("not json", "invalid_json", "line 7 is not JSON"),
    ('{"id": "a", "prompt": "x"', "invalid_json", "line 7 is not JSON"),
    (b'{"prompt": "\xff"}', "invalid_json", "not UTF-8"),
    ("[1, 2]", "invalid_json", "must be a JSON object, got an array"),
    ('"text"', "invalid_json", "got a string"),
    ('{"op": "pause"}', "unknown_op", "unknown op 'pause'"),
    ('{"op": "cancel"}', "invalid_request", "needs the 'id'"),
    ('{"op": "cancel", "id": "a", "now": true}', "invalid_request", "takes only 'id'"),
    ('{"id": "a"}', "invalid_request", "exactly one of 'prompt' or 'messages'"),
    ('{"id": "a", "prompt": "x", "messages": []}', "invalid_request", "not both"),
    ('{"id": "a", "prompt": 5}', "invalid_request", "prompt must be a string or a list of token ids"),
    ('{"id": "a", "messages": "hi"}', "invalid_request", "messages must be a non-empty list"),
    ('{"id": "a", "prompt": "x", "stream": "yes"}', "invalid_request", "stream must be true or false"),
    ('{"id": "a", "prompt": "x", "temprature": 0}', "invalid_request", "unknown sampling parameter 'temprature'"),
    ('{"id": "a", "prompt": "x", "max_tokens": "many"}', "invalid_request", "max_tokens must be an integer"),
    ('{"id": "a", "prompt": "x", "top_p": 3}', "invalid_request", "top_p must be"),
    ('{"id": ["a"], "prompt": "x"}', "invalid_request", "id must be a non-empty string or an integer"),
    ('{"id": true, "prompt": "x"}', "invalid_request", "id must be"),
])
def test_bad_lines_name_a_code_and_one_line_message(text, code, fragment):
    error = bad(text)
    assert error.code == code
    assert fragment in error.message and "\n" not in error.message
    assert error.line == 7


def test_errors_carry_the_id_when_it_was_readable_and_the_line_always():
    assert bad('{"id": "a", "prompt": "x", "nope": 1}').event() == {
        "id": "a", "event": "error", "line": 7,
        "error": {"code": "invalid_request", "message": "unknown sampling parameter 'nope'"}}
    assert bad('{"prompt": "x", "nope": 1}', 3).event()["id"] == "line-3"
    assert "id" not in bad("nope").event()


def test_errors_answering_a_control_line_say_which_op():
    event = bad('{"op": "cancel", "id": "a", "x": 1}').event()
    assert event["op"] == "cancel" and event["id"] == "a"
    assert bad('{"op": "reboot"}').event()["op"] == "reboot"


def _result(**kw) -> Result:
    base = dict(request_id=0, text="Hello there", token_ids=[1, 2], finish_reason="length",
                usage=Usage(3, 1, 2), timings=Timings(queue_ms=1.23456), seed=42)
    return Result(**{**base, **kw})


def test_done_event():
    event = terminal_event("a1", _result(), line=2)
    assert event["id"] == "a1" and event["event"] == "done"
    assert event["text"] == "Hello there" and event["finish_reason"] == "length"
    assert event["usage"] == {"prompt_tokens": 3, "cached_tokens": 1, "completion_tokens": 2, "total_tokens": 5}
    assert event["timings"]["queue_ms"] == 1.235
    assert event["seed"] == 42
    assert "stop" not in event and "logprobs" not in event
    assert terminal_event("a1", _result(finish_reason="stop", stop="\n"))["stop"] == "\n"
    assert terminal_event("a1", _result(finish_reason="cancelled"))["event"] == "done"


def test_a_failed_result_is_an_error_event():
    event = terminal_event("a1", _result(finish_reason="error", error="prompt has 9000 tokens",
                                         error_code="context_overflow"), line=4)
    assert event == {"id": "a1", "event": "error", "line": 4,
                     "error": {"code": "context_overflow", "message": "prompt has 9000 tokens"}}


def test_other_events_and_encoding():
    assert token_event("a", "Hi") == {"id": "a", "event": "token", "text": "Hi"}
    assert ready_event("m", 4, 1024, 256) == {"event": "ready", "model": "m", "n_parallel": 4, "n_ctx": 1024,
                                              "slot_ctx": 256}
    assert stats_event({"ticks": 3}, {"in_flight": 1}, "s") == {"id": "s", "event": "stats", "ticks": 3,
                                                                 "in_flight": 1}
    assert error_event(None, "c", "m") == {"event": "error", "error": {"code": "c", "message": "m"}}
    line = encode(token_event("a", "é\n\u2028"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one event, one line, whatever the text
    assert json.loads(line) == {"id": "a", "event": "token", "text": "é\n\u2028"}


def test_n_sample_events_name_their_sample():
    samples = [_result(text=t, index=i, seed=5 + i) for i, t in enumerate(["a", "b"])]
    event = terminal_event("q", _result(text="a", samples=samples))
    assert event["texts"] == ["a", "b"] and event["finish_reasons"] == ["length", "length"] and "text" not in event
    assert token_event("q", "b", 1) == {"id": "q", "event": "token", "text": "b", "index": 1}
