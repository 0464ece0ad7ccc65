"""Regression tests for inputs that once hung, crashed or ended a whole run, on the scripted
FakeRunner: lone surrogates, unparseable JSON, long stop strings,
NUL-filled lines, and any unexpected exception while a request is prepared.

Each must cost exactly its own line: one error record / event with a code and the id when
it can be read, and everything else still answered."""
from __future__ import annotations

import io
import json
import threading

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.jobs.batch_loop import BatchLoop
from llamabatch.jobs.batch_watch import StopRequests, watch
from llamabatch.jobs.reading.input_source import Source
from llamabatch.jobs.writing.output_sink import open_output
from llamabatch.jobs.writing.record_writer import RecordWriter
from llamabatch.errors import InvalidRequest
from llamabatch.openai_format.lines import LineError, LineParser, LineRequest
from llamabatch.files.json_line import BadJSON, loads, sniff_id
from llamabatch.params import MAX_STOP_CHARS, MAX_STOPS
from llamabatch.serve.stdin.protocol import BadLine, parse_line

from fake_runner import FakeRunner

DEEP_ARRAY = "[" * 100_000 + "]" * 100_000
DEEP_FIELD = '{"id": "deep", "prompt": "x", "json_schema": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001
HUGE_INT = '{"id": "big", "prompt": "x", "max_tokens": ' + "9" * 5000 + "}"
SURROGATE_LINES = {  # every string field a request has, with a lone surrogate in it
    "prompt": {"prompt": "\ud800"},
    "stop": {"prompt": "hi", "stop": ["ok", "\udfff"]},
    "dry_sequence_breakers": {"prompt": "hi", "dry_multiplier": 0.8, "dry_sequence_breakers": ["\ud800"]},
    "grammar": {"prompt": "hi", "grammar": 'root ::= "\ud800"'},
    "json_schema": {"prompt": "hi", "json_schema": {"type": "string", "enum": ["\ud800"]}},
    "messages": {"messages": [{"role": "user", "content": "a\udc00b"}]},
    "system": {"prompt": "hi", "system": "\ud800"},
}


def json_line(obj: dict) -> str:
    return json.dumps(obj)  # ensure_ascii: a lone surrogate becomes the escape "\ud800", as a client writes it


# -- the JSON reader ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, code, words", [
    (DEEP_ARRAY, "invalid_json", "deeper than 100 levels"),
    (DEEP_FIELD, "invalid_json", "deeper than 100 levels"),
    ("[" * 101 + "]" * 101, "invalid_json", "deeper than 100 levels"),  # parses in Python; still refused
    (HUGE_INT, "invalid_json", "4300 digits"),
    ('{"prompt": "\\ud800"}', "invalid_request", "prompt has a lone surrogate \\ud800 at character 0"),
    ('{"a": [1, {"\\udbff": 2}]}', "invalid_request", "a key in a[1] has a lone surrogate"),
])
def test_loads_turns_every_failure_into_bad_json(text, code, words):
    with pytest.raises(BadJSON) as info:
        loads(text)
    assert info.value.code == code and words in info.value.message


def test_loads_keeps_valid_unicode_and_reasonable_depth():
    assert loads('{"t": "\\ud83d\\ude00 \u00e9"}') == {"t": "\U0001F600 \u00e9"}  # a surrogate *pair* is fine
    assert loads("[" * 100 + "]" * 100) is not None


def test_sniff_id_reads_a_plainly_written_id():
    assert sniff_id('{"id": "a1", "prompt": [[[') == "a1"
    assert sniff_id('{"prompt": "x", "id": 7, ') == 7
    assert sniff_id('{"custom_id": "c", "id": "i"', "custom_id") == "c"
    assert sniff_id('{"id": "\\ud800"}') is None and sniff_id('{"id": 1.5}') is None and sniff_id("{") is None


# -- run's line parser ----------------------------------------------------------------------------


def parse(raw, line_no=1, **kw) -> LineRequest | LineError | None:
    return LineParser(SamplingParams(), **kw).parse(raw, line_no)


@pytest.mark.parametrize("field", sorted(SURROGATE_LINES))
def test_run_line_with_a_lone_surrogate_is_its_own_error(field):
    item = parse(json_line({"id": "s1", **SURROGATE_LINES[field]}), 3)
    assert isinstance(item, LineError), item
    assert (item.id, item.code) == ("s1", "invalid_request")
    assert field in item.message and "lone surrogate" in item.message and item.message.startswith("line 3")


@pytest.mark.parametrize("text", [DEEP_ARRAY, DEEP_FIELD, HUGE_INT])
def test_run_line_that_python_cannot_parse_is_its_own_error(text):
    item = parse(text, 5)
    assert isinstance(item, LineError) and item.code == "invalid_json" and item.message.startswith("line 5")
    # a plain invalid_json record has no id (null, no user's id: --resume counts these records),
    # an OpenAI line keeps its custom_id
    assert item.id is None
    openai = parse('{"custom_id": "c9", "url": "/v1/completions", "body": {"max_tokens": ' + "9" * 5000 + "}}", 5)
    assert isinstance(openai, LineError) and (openai.id, openai.shape) == ("c9", "openai")


def test_jsonl_input_runs_no_line_that_is_not_json():
    # a .jsonl file (input_format jsonl) or auto input whose first line is JSON: corruption is an error
    for kw in ({"input_format": "jsonl"}, {}):
        p = LineParser(SamplingParams(), **kw)
        assert isinstance(p.parse('{"prompt": "ok"}', 1), LineRequest)
        for n, raw in enumerate([b"\x00" * 40, "h\x00i\x00".encode(), b"just words", b'{"prompt": "tr'], start=2):
            item = p.parse(raw, n)
            assert isinstance(item, LineError) and item.code == "invalid_json" and item.id is None, (raw, item)
            assert item.message.startswith(f"line {n} "), item


def test_auto_input_whose_first_line_is_text_stays_text_and_nul_is_never_a_prompt():
    p = LineParser(SamplingParams())
    assert isinstance(p.parse("hello", 1), LineRequest)
    assert isinstance(p.parse('{"looks": "like json"}', 2), LineRequest)  # text input: a prompt like any other
    nul = p.parse(b"\x00\x00\x00", 3)
    assert isinstance(nul, LineError) and nul.code == "invalid_request" and "NUL" in nul.message


def test_utf16_file_lines_are_errors_not_prompts():
    data = '{"prompt": "a"}\n{"prompt": "b"}\n'.encode("utf-16")
    p = LineParser(SamplingParams(), input_format="jsonl")
    items = [p.parse(raw, n) for n, raw in enumerate(io.BytesIO(data), start=1)]
    assert items and all(isinstance(i, LineError) for i in items if i is not None), items


# -- serve-stdin's parser -------------------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(SURROGATE_LINES))
def test_serve_request_with_a_lone_surrogate_is_an_error_with_its_id(field):
    with pytest.raises(BadLine) as info:
        parse_line(json_line({"id": "s1", **SURROGATE_LINES[field]}), 4, SamplingParams())
    event = info.value.event()
    assert event["id"] == "s1" and event["error"]["code"] == "invalid_request" and event["line"] == 4
    assert field in event["error"]["message"]


@pytest.mark.parametrize("text, request_id", [(DEEP_ARRAY, None), (DEEP_FIELD, "deep"), (HUGE_INT, "big")])
def test_serve_line_that_python_cannot_parse_names_its_id(text, request_id):
    with pytest.raises(BadLine) as info:
        parse_line(text, 2, SamplingParams())
    event = info.value.event()
    assert event.get("id") == request_id and event["error"]["code"] == "invalid_json"


# -- sampling parameters --------------------------------------------------------------------------


def test_stop_strings_are_bounded_in_count_and_length():
    SamplingParams(stop=["x" * MAX_STOP_CHARS] * 2 + [str(i) for i in range(MAX_STOPS - 2)]).validate()
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(stop=[str(i) for i in range(MAX_STOPS + 1)]).validate()
    # the count and the limit in words, not "got '17 strings'"
    assert str(info.value) == f"stop has {MAX_STOPS + 1} strings; at most {MAX_STOPS} are allowed"
    with pytest.raises(InvalidRequest, match=f"at most {MAX_STOP_CHARS} characters"):
        SamplingParams(stop=["x" * (MAX_STOP_CHARS + 1)]).validate()


def test_an_empty_stop_string_is_named_as_one():
    # `"stop": ""` used to read "got ['']"
    with pytest.raises(InvalidRequest) as info:
        SamplingParams.from_dict({"stop": ""}).validate()
    assert str(info.value) == "stop is an empty string; a stop string needs at least one character"
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(stop=["a", ""]).validate()
    assert str(info.value).startswith("stop string 2 of 2 is an empty string")


def test_surrogates_in_sampling_strings_are_refused_by_validate():
    for changes in ({"stop": ["\ud800"]}, {"dry_sequence_breakers": ["a", "\udc00"]}, {"grammar": "\ud800"},
                    {"json_schema": {"enum": ["\ud800"]}}):
        with pytest.raises(InvalidRequest, match="lone surrogate"):
            SamplingParams(**changes).validate()


def test_nan_and_infinities_are_refused_where_they_mean_nothing():
    # Python's JSON reader accepts NaN, Infinity and 1e999; llama.cpp would get NaN probabilities
    for data in ({"temperature": float("inf")}, {"mirostat_tau": float("nan")}, {"dry_base": 1e999},
                 {"timeout": float("inf")}, {"logit_bias": {"5": float("inf")}}, {"logit_bias": {"5": float("nan")}},
                 {"mirostat_eta": -1}):
        with pytest.raises(InvalidRequest):
            SamplingParams.from_dict(data)
    assert SamplingParams.from_dict({"logit_bias": {"5": float("-inf")}}).logit_bias == {5: float("-inf")}  # a ban


# -- the engine -----------------------------------------------------------------------------------


class BrittleRunner(FakeRunner):
    """A runner whose sampler construction fails the way C bindings do (not a LlamaBatchError)."""

    def build_sampler(self, params, seed):
        if params.grammar == "BOOM":
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return super().build_sampler(params, seed)


def fake_engine(runner=None) -> Engine:
    runner = runner or BrittleRunner(n_slots=2, slot_ctx=64, n_batch=64)
    return Engine(EngineConfig(n_parallel=2, n_batch=64, chunk_size=16), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=8))


def test_engine_answers_surrogate_prompts_and_unexpected_errors_with_that_request_only():
    with fake_engine() as engine:
        bad_text = engine.submit("\ud800", stream=False)
        bad_chat = engine.submit([{"role": "user", "content": "\udfff"}], stream=False)
        boom = engine.submit("x", SamplingParams(grammar="BOOM"), stream=False)
        fine = engine.submit("hi", stream=False)
        assert bad_text.result(5).error_code == "invalid_request" and "lone surrogate" in bad_text.result().error
        assert bad_chat.result(5).error_code == "invalid_request" and "messages[0].content" in bad_chat.result().error
        assert boom.result(5).error_code == "internal_error" and "UnicodeEncodeError" in boom.result().error
        assert fine.result(5).text == "hi!"


# -- whole runs on the fake engine ---------------------------------------------------------------


def run_lines(tmp_path, data: bytes, input_format: str = "auto", max_inflight: int = 4) -> list[dict]:
    """`llamabatch run` minus the command line: reader, engine, writer, on the fake runner.
    (tests/test_fuzz.py calls it once per Hypothesis example in the same tmp_path, so OUTPUT
    is emptied first, as a run without --resume does.)"""
    engine = fake_engine()
    out = tmp_path / "out.jsonl"
    sink = open_output(str(out), "in")
    sink.start_fresh()
    parser = LineParser(engine.default_params, input_format=input_format)
    window = threading.Semaphore(64)
    writer = RecordWriter(sink, engine.model_name, "input", window)
    run = BatchLoop(engine, parser, Source("in", io.BytesIO(data), False), writer, window, max_inflight=max_inflight)
    try:
        run.start()
        watch(run, StopRequests(), lambda _event: None, None)
    finally:
        writer.close()
        sink.close()
        engine.close()
    assert run.read_error is None and writer.error is None
    # split on "\n" only: str.splitlines() also splits inside a record at U+2028, U+0085...
    return [json.loads(line) for line in out.read_bytes().split(b"\n") if line]


def test_run_answers_every_line_once_whatever_it_holds(tmp_path):
    lines = [json_line({"id": "s1", "prompt": "\ud800", "max_tokens": 2}), json_line({"id": "s2", "prompt": "hi"}),
             DEEP_ARRAY, DEEP_FIELD, HUGE_INT, json_line({"id": "boom", "prompt": "x", "grammar": "BOOM"}),
             json_line({"id": "s3", "prompt": "yo", "stop": ["\ud800"]}), "\x00" * 30, "plain text", "",
             json_line({"id": "last", "prompt": "end"})]
    records = run_lines(tmp_path, "\n".join(lines).encode() + b"\n")
    by_id = {r["id"]: r for r in records}
    # lines that are no JSON have no id (null): their messages name them
    assert [r["id"] for r in records] == ["s1", "s2", None, None, None, "boom", "s3", None, None, "last"]
    assert by_id["s2"]["text"] == "hi!" and by_id["last"]["text"] == "end!"
    codes = [(r["id"], r["error"]["code"]) for r in records if r["error"]]
    assert codes == [("s1", "invalid_request"), (None, "invalid_json"), (None, "invalid_json"), (None, "invalid_json"),
                     ("boom", "internal_error"), ("s3", "invalid_request"), (None, "invalid_json"),
                     (None, "invalid_json")]
    unnamed = [r["error"]["message"] for r in records if r["id"] is None]
    assert [m.split(" ", 2)[1] for m in unnamed] == ["3", "4", "5", "8", "9"]


def test_a_surrogate_under_a_key_with_a_newline_is_named_on_one_line():
    # found by test_fuzz: the path to the bad value spelled the key "\n" raw
    from llamabatch.files.json_line import find_surrogate

    message = find_surrogate({"custom_id": {"\n": {"\ud800": None}}}, "line")
    assert message is not None and "\n" not in message and 'custom_id["\\n"]' in message, message
