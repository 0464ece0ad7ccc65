"""Priority through every front end (no model): a plain line's and a serve-stdin request's
`priority`, an OpenAI body's `priority` and `service_tier`, out-of-range and unknown values as
that line's error naming the field (a 400 online), and `serve` giving online requests a higher
priority than batch lines, which then keep every slot (--online-slots 0, the default)."""
from __future__ import annotations

import threading

import pytest

from llamabatch.openai_format.lines import LineError, LineParser
from llamabatch.params import SamplingParams
from llamabatch.serve.http.online import online_defaults
from llamabatch.serve.stdin.protocol import BadLine, parse_line

from http_server import CHAT, batch_file, ended, records, serving, wait_batch
from lazy_modules import lazy

openai = lazy("openai")

CHAT_BODY = {"messages": [{"role": "user", "content": "hi"}]}


def openai_line(**body) -> dict:
    return {"custom_id": "a", "method": "POST", "url": CHAT, "body": {**CHAT_BODY, **body}}


def parse(line: dict, defaults: SamplingParams = SamplingParams()):
    return LineParser(defaults, input_format="jsonl").parse_object(line, 1)


def test_a_plain_line_and_a_serve_stdin_request_carry_their_priority():
    assert parse({"id": "x", "prompt": "hi", "priority": -3}).params.priority == -3
    assert parse({"id": "x", "prompt": "hi"}).params.priority == 0
    submit = parse_line('{"id": 1, "prompt": "hi", "priority": 7}', 1, SamplingParams())
    assert submit.params.priority == 7
    with pytest.raises(BadLine, match=r"priority must be an integer in \[-1000, 1000\]"):
        parse_line('{"id": 1, "prompt": "hi", "priority": 1001}', 1, SamplingParams())


def test_out_of_range_priority_is_that_lines_error_naming_the_field():
    for bad in (5000, -1001, 1.5, "high", True):
        error = parse({"id": "x", "prompt": "hi", "priority": bad})
        assert isinstance(error, LineError) and error.code == "invalid_request"
        assert "priority must be" in error.message


def test_service_tier_is_a_step_from_the_default_and_priority_wins():
    assert parse(openai_line(service_tier="flex")).params.priority == 10
    assert parse(openai_line(service_tier="priority")).params.priority == -10
    assert parse(openai_line(service_tier="default")).params.priority == 0
    assert parse(openai_line(service_tier="auto"), SamplingParams(priority=-1)).params.priority == -1
    assert parse(openai_line(service_tier="priority", priority=4)).params.priority == 4
    assert parse(openai_line(priority=-7)).params.priority == -7
    error = parse(openai_line(service_tier="turbo"))
    assert isinstance(error, LineError) and error.code == "invalid_request"
    assert error.message.startswith('body.service_tier must be one of "auto", "default", "flex", "priority"')


def test_online_requests_go_one_step_ahead_of_batch_lines():
    assert online_defaults(SamplingParams()).priority == -1
    assert online_defaults(SamplingParams(priority=5)).priority == 4
    assert online_defaults(SamplingParams(priority=-1000)).priority == -1000


def test_serve_refuses_a_bad_priority_or_tier_with_a_400_naming_it(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        with pytest.raises(openai.BadRequestError, match="priority must be an integer"):
            client.chat.completions.create(model="any", messages=CHAT_BODY["messages"], extra_body={"priority": 99999})
        with pytest.raises(openai.BadRequestError, match="service_tier"):
            client.chat.completions.create(model="any", messages=CHAT_BODY["messages"], extra_body={"service_tier": "x"})


def test_an_online_request_during_a_batch_runs_at_a_higher_priority_and_every_line_ends_once(tmp_path):
    with serving(tmp_path / "data", n_parallel=2, online_slots=0, step_delay=0.003) as server:
        client = server.client()
        assert server.service.inflight == 4  # every slot and a line queued behind each
        f = client.files.create(file=("in.jsonl", batch_file(30)), purpose="batch")
        batch_id = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id
        wait_batch(client, batch_id, lambda b: b.status == "in_progress")
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            got = client.chat.completions.create(model="any", messages=[{"role": "user", "content": f"question {i}"}])
            answers[i] = got.choices[0].message.content

        askers = [threading.Thread(target=ask, args=(i,)) for i in (100, 101, 102)]
        for t in askers:
            t.start()
        for t in askers:
            t.join(60)
        batch = wait_batch(client, batch_id, ended)
        out = records(client, batch.output_file_id)
        ticks = list(server.engine.telemetry.recent_ticks)
    assert answers == {i: f"answer {i}" for i in (100, 101, 102)}
    assert batch.status == "completed" and sorted(r["custom_id"] for r in out) == sorted(f"q{i}" for i in range(30))
    assert any(t.rows_by_priority.get(-1) for t in ticks)  # the online rows ran at priority -1
    assert all(set(t.rows_by_priority) <= {-1, 0} for t in ticks)
