"""A line whose id can't be read (an empty custom_id, an id that is no id, a line that is not
JSON) gets no id, null, in its error record: never one a user's line may have, so it makes no
later line a duplicate, and --resume counts such records instead of matching them."""
from __future__ import annotations

import json

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.jobs import JobHost, estimate_job, run_job
from llamabatch.jobs.resume.id_sets import Answered, IdSet
from llamabatch.openai_format.lines import OPENAI, PLAIN, LineError, LineParser, build_record

from cli_harness import FakeEngines, runner_for
from fake_runner import FakeRunner

COMPLETIONS = "/v1/completions"


def engine() -> Engine:
    runner = FakeRunner(n_slots=2, slot_ctx=64, n_batch=64, reply=lambda prompt: prompt[::-1][:6])
    return Engine(EngineConfig(n_parallel=2, n_batch=64, chunk_size=16), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=8))


def batch_line(custom_id, prompt: str = "hello") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS, "body": {"prompt": prompt}}


def write_lines(path, lines) -> str:
    path.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
    return str(path)


def records(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8").read().splitlines()]


def parse(line, line_no: int = 1):
    return LineParser(SamplingParams(), input_format="jsonl").parse(json.dumps(line), line_no)


# -- the parser ------------------------------------------------------------------------------------


def test_an_empty_custom_id_gets_no_id_and_says_it_was_empty():
    err = parse(batch_line(""), 3)
    assert isinstance(err, LineError) and (err.id, err.shape, err.code) == (None, OPENAI, "invalid_request")
    assert err.message == "line 3: custom_id must be a non-empty string, got an empty string"
    assert parse(batch_line(7), 4).message == "line 4: custom_id must be a non-empty string, got a number"
    record = build_record(err, err.result(), "m")
    assert record["custom_id"] is None and record["response"]["status_code"] == 400


@pytest.mark.parametrize("line", [{"id": "", "prompt": "x"}, {"id": None, "prompt": "x"}, {"id": 1.5, "prompt": "x"},
                                  {"id": [2], "input": "x"}, {"id": "", "foo": 1}, [1, 2]])
def test_a_plain_line_whose_id_is_no_id_gets_none(line):
    err = parse(line, 2)
    assert isinstance(err, LineError) and err.id is None and err.shape == PLAIN
    assert err.message.startswith("line 2")


def test_a_plain_line_without_an_id_still_gets_its_line_number():
    assert parse({"prompt": "x"}, 5).id == 5
    assert parse({"prompt": "x", "max_tokens": "ten"}, 5).id == 5  # bad, but its id is the documented default


def test_lines_without_an_id_are_never_duplicates_and_are_counted_on_resume():
    seen = IdSet()
    assert seen.add(None) and seen.add(None) and None not in seen and len(seen) == 0
    answered = Answered()
    answered.add(None, "invalid_request")
    answered.add("1", None)
    assert answered.covers(None, first_use=True)  # the one record without an id answers one such line
    assert not answered.covers(None, first_use=True)  # a second such line was not answered yet
    assert answered.covers("1", first_use=True)


# -- run_job ---------------------------------------------------------------------------------------


def test_a_valid_line_whose_custom_id_is_a_bad_lines_number_runs(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", [batch_line("", "lost"), batch_line("1", "abc"), batch_line("2", "de")])
    out = tmp_path / "out.jsonl"
    with engine() as shared:
        report = run_job(inp, str(out), engine=shared, order="input")
    assert (report.ok, report.failed) == (2, 1)
    bad, first, second = records(out)
    assert bad["custom_id"] is None and bad["error"]["code"] == "invalid_request"
    assert "got an empty string" in bad["error"]["message"]
    assert (first["custom_id"], first["error"], first["response"]["body"]["choices"][0]["text"]) == ("1", None, "cba")
    assert second["custom_id"] == "2" and second["error"] is None


def test_a_valid_plain_line_whose_id_is_a_bad_lines_number_runs(tmp_path):
    lines = [{"id": 0, "prompt": "zero"}, {"id": "", "prompt": "lost"}, '{"id": 2, "prompt": ', {"id": 2, "prompt": "two"}]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    with engine() as shared:
        report = run_job(inp, str(out), engine=shared, order="input")
    assert (report.ok, report.failed) == (2, 2)
    got = records(out)
    assert [r["id"] for r in got] == [0, None, None, 2]
    assert [r["error"]["code"] if r["error"] else None for r in got] == [None, "invalid_request", "invalid_json", None]


def test_a_resume_writes_each_bad_lines_record_once_and_runs_every_good_line(tmp_path):
    lines = [batch_line("", "a"), batch_line("1", "bb"), {"url": COMPLETIONS, "body": {"prompt": "c"}},
             batch_line("3", "dd"), "not json", batch_line("2", "ee")]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    with engine() as shared:
        run_job(inp, str(out), engine=shared, order="input")
        whole = out.read_text().splitlines(keepends=True)
        out.write_text("".join(whole[:3]))  # stopped after the third line: two bad records, one answer
        resumed = run_job(inp, str(out), engine=shared, order="input", resume=True)
    assert resumed.already_answered == 3 and (resumed.ok, resumed.failed) == (2, 1)
    ids = [r["custom_id"] if "custom_id" in r else r["id"] for r in records(out)]  # "not json" is a plain record
    assert sorted(i for i in ids if i is not None) == ["1", "2", "3"] and ids.count(None) == 3
    with engine() as shared:  # and once everything is there, a resume has nothing left to do
        again = run_job(inp, str(out), engine=shared, resume=True)
    assert again.already_answered == 6 and again.written == 0 and len(records(out)) == 6


def test_a_dry_run_resume_counts_the_records_without_an_id_as_answered(tmp_path):
    inp = write_lines(tmp_path / "in.jsonl", [batch_line("", "a"), batch_line("1", "bb"), "not json"])
    out = tmp_path / "out.jsonl"
    with engine() as shared:
        run_job(inp, str(out), engine=shared)
    host = JobHost(engine_factory=FakeEngines(runner_for(), []))
    estimate = estimate_job(inp, str(out), host=host, n_parallel=2, resume=True)
    assert estimate["resume"]["already_answered"] == 3 and estimate["resume"]["records"] == 3
