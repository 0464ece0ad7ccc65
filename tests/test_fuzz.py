"""Property-based fuzzing (Hypothesis) of everything that reads request data: run's line
parser (plain and OpenAI Batch shapes), serve-stdin's protocol, SamplingParams.from_dict,
the stop-string matcher, and whole runs and serve loops on the scripted fake engine.

Invariants: no exception escapes; exactly one record / terminal event per input line;
every error is one line with a code. The normal suite runs the "fast" profile (see
conftest.py); `pytest tests/test_fuzz.py --hypothesis-profile=long` runs 50x more examples.
"""
from __future__ import annotations

import json
import os
import threading

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llamabatch import SamplingParams
from llamabatch.cli.serve.loop import serve
from llamabatch.core.detok import IncrementalDetokenizer
from llamabatch.errors import InvalidRequest
from llamabatch.cli.run.formats import LineError, LineParser, LineRequest
from llamabatch.params import FIELD_TYPES
from llamabatch.cli.serve.protocol import BadLine, Cancel, Stats, Submit, encode, parse_line

from test_bad_input import fake_engine, run_lines

CODES = {"invalid_json", "unknown_shape", "invalid_url", "invalid_request", "duplicate_id", "context_overflow",
         "internal_error", "unknown_op", "unknown_id", "queue_full", "engine_closed", "line_too_long"}

# -- strategies -----------------------------------------------------------------------------------

odd_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12)  # surrogates too
numbers = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
                    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**63]))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, odd_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=4)),
    max_leaves=12)
field_values = st.one_of(json_values, st.lists(odd_text, max_size=3), st.dictionaries(
    st.one_of(odd_text, st.integers(-5, 300000).map(str)), numbers, max_size=3))
sampling = st.dictionaries(st.sampled_from(sorted(FIELD_TYPES)), field_values, max_size=5)
prompts = st.one_of(odd_text, st.lists(st.integers(-3, 300), max_size=5), json_values)
messages = st.one_of(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant",
                                                                               "developer", "x"]),
                                                     "content": odd_text}), max_size=3), json_values)
ids = st.one_of(odd_text, st.integers(-3, 2**64), json_values)
plain_lines = st.builds(lambda base, extra: {**base, **extra},
                        st.fixed_dictionaries({}, optional={"id": ids, "prompt": prompts, "messages": messages,
                                                            "system": odd_text}), sampling)
bodies = st.builds(lambda base, extra: {**base, **extra},
                   st.fixed_dictionaries({}, optional={
                       "messages": messages, "prompt": st.one_of(prompts, st.lists(odd_text, max_size=2)),
                       "max_completion_tokens": field_values, "n": field_values, "best_of": field_values,
                       "response_format": st.one_of(json_values, st.fixed_dictionaries(
                           {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])},
                           optional={"json_schema": json_values})),
                       "stream": field_values, "logprobs": field_values, "model": json_values, "tools": json_values}),
                   sampling)
openai_lines = st.fixed_dictionaries(
    {"custom_id": ids, "body": st.one_of(bodies, json_values)},
    optional={"method": st.sampled_from(["POST", "post", "GET", 1]),
              "url": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", 5])})
serve_lines = st.one_of(
    st.builds(lambda base, extra: {**base, **extra},
              st.fixed_dictionaries({}, optional={"id": ids, "prompt": prompts, "messages": messages,
                                                  "stream": field_values}), sampling),
    st.fixed_dictionaries({"op": st.one_of(st.sampled_from(["cancel", "stats", "nope"]), json_values)},
                          optional={"id": ids, "x": json_values}))
hostile = st.sampled_from([
    "[" * 100_000, '{"id": "a", "prompt": ' + "[" * 5000, '{"max_tokens": ' + "7" * 5000 + "}",
    "\x00" * 50, '{"prompt": "\\ud800"}', '{"prompt": "x", "stop": ["\\udfff"]}', "NaN", "1e999", '"x"', "[]",
    '{"prompt": "x", "temperature": NaN}', '{"prompt": "x", "top_k": Infinity}', "\ufeff{}", "{}" * 3])


def as_json(value) -> str:
    try:
        return json.dumps(value)  # ensure_ascii: lone surrogates become \\ud800 escapes, as a client sends them
    except ValueError:  # (floats are fine; only recursion could fail here)
        return "null"


lines = st.one_of(plain_lines.map(as_json), openai_lines.map(as_json), json_values.map(as_json), hostile,
                  odd_text.map(lambda t: t.replace("\n", " ")))
raw_lines = st.one_of(lines.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=40))


def one_line_error(code: str, message: str) -> None:
    assert code in CODES, code
    assert isinstance(message, str) and message and "\n" not in message and "Traceback" not in message, message


# -- parsers --------------------------------------------------------------------------------------


@given(raw=raw_lines, line_no=st.integers(1, 10**6), fmt=st.sampled_from(["auto", "jsonl", "text"]))
@example(raw=b'{"id": 1, "prompt": "' + b"x" * (10 << 20) + b'"}', line_no=1, fmt="auto")  # a 10 MB line
def test_run_parser_answers_every_line(raw, line_no, fmt):
    item = LineParser(SamplingParams(), input_format=fmt).parse(raw, line_no)
    if item is None:
        assert not raw.decode("utf-8").lstrip("\ufeff").strip()  # only blank lines (Unicode spaces too) are skipped
        return
    assert isinstance(item, (LineRequest, LineError))
    json.dumps(item.id)  # every id can be written into its record
    if isinstance(item, LineError):
        one_line_error(item.code, item.message)
        assert item.code != "internal_error", item.message  # a bug, not a verdict on the line


@given(raw=st.one_of(serve_lines.map(as_json).map(str.encode), raw_lines), line=st.integers(1, 10**6))
def test_serve_parser_answers_every_line(raw, line):
    try:
        command = parse_line(raw, line, SamplingParams())
    except BadLine as bad:
        one_line_error(bad.code, bad.message)
        assert encode(bad.event()).count(b"\n") == 1
        return
    assert command is None or isinstance(command, (Submit, Cancel, Stats))


@given(data=sampling)
def test_sampling_params_from_dict_raises_only_invalid_request(data):
    try:
        params = SamplingParams.from_dict(data)
    except InvalidRequest as exc:
        one_line_error("invalid_request", str(exc))
        return
    assert params.validate() is params


# -- the stop-string matcher against a brute-force reference --------------------------------------


def reference(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    """Emit piece by piece; stop at the first piece after which a stop appears in the text
    (earliest start, longest at one start), cut before it."""
    text = ""
    for piece in pieces:
        text += piece
        found = [(text.find(s), -len(s), s) for s in stops if s in text]
        if found:
            at, _, stop = min(found)
            return text[:at], stop
    return text, None


@given(stops=st.lists(st.text(alphabet="abc\u00e9", min_size=1, max_size=6), max_size=4),
       pieces=st.lists(st.text(alphabet="abc\u00e9", max_size=5), max_size=12))
def test_stop_matcher_equals_the_brute_force_reference(stops, pieces):
    detok = IncrementalDetokenizer(stops)
    shown = "".join(detok.push(p.encode()) for p in pieces) + detok.finish()
    want_text, want_stop = reference(stops, pieces)
    assert (shown, detok.text, detok.stop_hit) == (want_text, want_text, want_stop)


# -- whole runs on the fake engine ----------------------------------------------------------------

whole = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                        HealthCheck.data_too_large])


@whole
@given(batch=st.lists(raw_lines, min_size=1, max_size=12))
def test_run_writes_exactly_one_record_per_line(tmp_path, batch):
    batch = [b.replace(b"\n", b" ").replace(b"\r", b" ") for b in batch]
    records = run_lines(tmp_path, b"\n".join(batch), max_inflight=3)
    parser = LineParser(SamplingParams())  # the same decisions, to know which lines are blank
    expected = [n for n, raw in enumerate(batch, start=1) if parser.parse(raw, n) is not None]
    assert len(records) == len(expected)
    for record in records:
        error = record.get("error")
        if error is not None:
            one_line_error(error["code"], error["message"])
            assert error["code"] != "internal_error", error


@whole
@given(batch=st.lists(st.one_of(serve_lines.map(as_json), lines), min_size=1, max_size=10))
def test_serve_gives_every_request_exactly_one_terminal_event(batch):
    batch = [b.replace("\n", " ").replace("\r", " ") for b in batch]
    engine = fake_engine()
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    data = "".join(b + "\n" for b in batch).encode("utf-8", "surrogatepass")
    threading.Thread(target=lambda: (os.write(stdin_w, data), os.close(stdin_w)), daemon=True).start()
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.append(_read_all(out_r)))
    reader.start()
    try:
        code = serve(engine, stdin_r, out_w, "drain")
    finally:
        engine.close()
        os.close(out_w)
        os.close(stdin_r)
    reader.join()
    assert code == 0  # it ended: no request was left in flight
    events = [json.loads(line) for line in output[0].split(b"\n") if line]
    # Each line gets one answer (done, error or stats), except a cancel that found its request:
    # that request's own terminal event answers it.
    answers = sum(e["event"] in ("done", "error", "stats") for e in events)
    non_blank = [b for b in batch if b.strip()]
    cancels = sum('"cancel"' in b for b in non_blank)
    assert len(non_blank) - cancels <= answers <= len(non_blank)
    for event in events:
        if event["event"] == "error":
            one_line_error(event["error"]["code"], event["error"]["message"])
            assert event["error"]["code"] != "internal_error", event


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 65536):
        parts.append(chunk)
    os.close(fd)
    return b"".join(parts)
