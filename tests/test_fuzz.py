"""Property-based fuzzing (Hypothesis) of everything that reads request data: run's line
parser (plain and OpenAI Batch shapes), serve-stdin's protocol, SamplingParams.from_dict,
the stop-string matcher, and whole runs and serve loops on the scripted fake engine.

Invariants: no exception escapes; exactly one record / terminal event per input line;
every error is one line with a code. The normal suite runs the "fast" profile (see
conftest.py); `pytest tests/test_fuzz.py --hypothesis-profile=long` runs 50x more examples.
"""
from __future__ import annotations

import functools
import json
import os
import threading

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llamabatch import SamplingParams
from llamabatch.serve.stdin.loop import serve
from llamabatch.core.scheduling.detok import IncrementalDetokenizer
from llamabatch.errors import InvalidRequest
from llamabatch.openai_format.lines import LineError, LineParser, LineRequest
from llamabatch.params import FIELD_TYPES
from llamabatch.serve.stdin.protocol import BadLine, Cancel, Stats, Submit, encode, parse_line

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


# -- files read whole ---------------------------------------------------------------------------
# Each reader of a file the user names or the tool wrote earlier (a grammar, a schema, a template,
# the config file, the run manifest, a bench --json document, a chat transcript) takes random bytes
# and damaged JSON: it returns, or raises its one-line error type, never anything else; and what
# it returns, its consumers use without a traceback.

from llamabatch.bench import report as bench_report  # noqa: E402
from llamabatch.chat.conversation import Conversation  # noqa: E402
from llamabatch.jobs.resume import manifest_fields  # noqa: E402
from llamabatch.jobs.resume.fingerprint import changes  # noqa: E402
from llamabatch.jobs.resume.manifest import ManifestProblem, read_manifest  # noqa: E402
from llamabatch.cli.run.report import rows as report_rows  # noqa: E402
from llamabatch.settings.config_file import ConfigFileError, load as load_config  # noqa: E402
from llamabatch.settings.layers import merge  # noqa: E402
from llamabatch.tables import TableError, load_messages_template, load_template_file  # noqa: E402
from llamabatch.files.whole_file import UnreadableFile, read_json  # noqa: E402

file_bytes = st.one_of(st.binary(max_size=200), json_values.map(as_json).map(str.encode),
                       st.sampled_from([b"\x00\xff", b"[" * 100_000, b'{"a": ' + b"9" * 5000 + b"}", b"\xef\xbb\xbf{}",
                                        b'"\\ud800"', b"{" * 50 + b"}" * 50, b"1e999", b"NaN", b"\n" * 3]))
files = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


def one_line(exc: BaseException) -> None:
    message = str(exc)
    assert message and "\n" not in message and "Traceback" not in message, message


def write_file(tmp_path, data: bytes):
    path = tmp_path / "f"
    path.write_bytes(data)
    return str(path)


def mutations(document):
    """A strategy: `document` with one value somewhere in it (or the whole) replaced by random JSON."""
    def paths(value, here=()):
        yield here
        if isinstance(value, dict):
            for key, item in value.items():
                yield from paths(item, here + (key,))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                yield from paths(item, here + (i,))

    def replaced(path, new):
        if not path:
            return new
        copy = json.loads(json.dumps(document))
        target = copy
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = new
        return copy

    extremes = st.sampled_from([10 ** 400, -(10 ** 400), 1e308, -1.0, 0, "x", [], {}, None, True, [1], {"a": 1}])
    return st.builds(replaced, st.sampled_from(list(paths(document))), st.one_of(json_values, extremes))


@files
@given(data=file_bytes)
def test_the_whole_file_reader_returns_or_says_one_line(tmp_path, data):
    try:
        read_json(write_file(tmp_path, data), "the file")
    except UnreadableFile as exc:
        one_line(exc)


@files
@given(data=file_bytes)
def test_grammar_schema_and_template_files_return_or_say_one_line(tmp_path, data):
    path = write_file(tmp_path, data)
    for flags in ({"grammar_file": path}, {"json_schema": path}):
        try:
            merge(flags)
        except InvalidRequest as exc:
            one_line(exc)
    for load in (load_template_file, load_messages_template):
        try:
            load(path)
        except TableError as exc:
            one_line(exc)


TOML_VALUES = st.sampled_from(['1', '-1', '0.5', 'nan', 'inf', '"x"', '"\\u00e9"', 'true', '[1, "a"]', '{ a = 1 }',
                               '9' * 400, '"' + 'x' * 300 + '"', '[' * 5000 + ']' * 5000, '"auto"', '"off"', '""',
                               '[[1]]', '{}', '1979-05-27', '"16GiB"'])
TOML_KEYS = st.sampled_from(["model", "n_parallel", "n_ctx", "temperature", "top_k", "stop", "seed", "max_memory",
                             "prefix_store", "grammar", "json_schema", "order", "x", "models.a", "sampling.top_p"])
toml_files = st.lists(st.tuples(st.sampled_from(["", "[run]\n", "[sampling]\n", "[chat]\n", "[models]\n", "[x]\n"]),
                                TOML_KEYS, TOML_VALUES), max_size=6).map(
    lambda items: "".join(f"{table}{key} = {value}\n" for table, key, value in items).encode())


@files
@given(data=st.one_of(toml_files, file_bytes))
def test_the_config_file_loads_or_says_one_line(tmp_path, data):
    try:
        load_config(write_file(tmp_path, data))
    except ConfigFileError as exc:
        one_line(exc)


MANIFEST = {
    "format": "llamabatch-run-manifest", "version": 1, "status": "finished", "llamabatch": "1.0.0",
    "model": {"path": "/m.gguf", "name": "m", "size": 10, "sha256": "ab" * 32},
    "engine": {"n_parallel": 2}, "sampling": {"max_tokens": 4, "temperature": 0.0, "stop": ["\n"]},
    "setting_sources": {"model": "flag"}, "chat_template": {"setting": None, "source": "gguf"}, "system": None,
    "deterministic": False, "input": {"path": "/in.jsonl", "size": 5, "sha256_first_mb": "cd" * 32, "lines": 2},
    "output": {"path": "/out.jsonl", "error_file": None},
    "fingerprint": {"model_sha256": "ab" * 32, "sampling": {"max_tokens": 4}, "seed": None},
    "started_at": "2025-01-01T00:00:00Z", "ended_at": "2025-01-01T00:01:00Z",
    "counts": {"records": 2, "finish_reason": {"stop": 2}, "error_code": {}},
    "tokens": {"prompt": 10, "cached": 0, "generated": 4}, "wall_s": 1.5, "generated_tok_s": 2.6, "ray": None,
    "history": [{"event": "start", "started_at": "2025-01-01T00:00:00Z", "ended_at": "2025-01-01T00:01:00Z",
                 "argv": ["run"], "wall_s": 1.5, "records_written": 2, "generated_tokens": 4, "generated_tok_s": 2.6,
                 "status": "finished", "changed_settings": ["seed: 1 → 2"], "overridden": "x"}],
}


@files
@given(data=st.one_of(mutations(MANIFEST).map(as_json).map(str.encode), file_bytes))
def test_a_manifest_reads_or_is_one_problem_and_what_reads_is_usable(tmp_path, data):
    try:
        manifest = read_manifest(write_file(tmp_path, data))
    except ManifestProblem as exc:
        one_line(exc)
        return
    # what report and a resume do with a manifest they accepted
    report_rows(manifest)
    changes(manifest.get("fingerprint") or {}, MANIFEST["fingerprint"])
    entry = manifest_fields.start_event(manifest, "resume", ("run",))
    output = tmp_path / "out.jsonl"
    output.write_text('{"id": 1, "text": "a", "finish_reason": "stop", "usage": {"completion_tokens": 2}}\n')
    manifest_fields.finish(manifest, entry, status="finished", wall_s=0.5, generated=2, written=1, output=str(output),
                      error_file=None, input_path="-")
    json.dumps(manifest, default=str)


@functools.lru_cache(maxsize=1)
def bench_document() -> str:
    """A real bench --json document, from a bench run on the fake runner (once)."""
    import tempfile

    from cli_harness import invoke
    from test_bench_charts import slow_runner

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "bench.json")
        result = invoke(["bench", "--pp", "16", "--tg", "4", "--parallel", "1,2", "--verbose", "--json", out],
                        runner=slow_runner)
        assert result.exit_code == 0, result.stderr
        with open(out, encoding="utf-8") as f:
            return f.read()


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bench_from_json_draws_or_names_the_bad_field(tmp_path, data):
    from cli_harness import invoke

    document = json.loads(bench_document())
    raw = data.draw(st.one_of(mutations(document).map(as_json).map(str.encode), file_bytes))
    path = write_file(tmp_path, raw)
    result = invoke(["bench", "--from-json", path, "--html", str(tmp_path / "r.html"), "--ticks", "2"])
    if result.exit_code == 0:
        assert "Traceback" not in result.stderr
        return
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"llamabatch: error: --from-json {path}: "), \
        result.stderr


TRANSCRIPT = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "hello"}], "model": "m"}


@files
@given(data=st.one_of(mutations(TRANSCRIPT).map(as_json).map(str.encode), file_bytes))
def test_a_chat_transcript_loads_or_says_one_line(tmp_path, data):
    try:
        Conversation.load(write_file(tmp_path, data))
    except InvalidRequest as exc:
        one_line(exc)
