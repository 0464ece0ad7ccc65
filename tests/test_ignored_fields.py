"""OpenAI's documented fields with no local effect (openai_format/ignored_fields.py): accepted and
named in the batch record's `ignored_fields` and the online `LlamaBatch-Ignored-Fields` header;
documented fields asking for other than text are refused naming them; undocumented ones stay errors."""
from __future__ import annotations

import json

import pytest

from llamabatch.openai_format import CHAT_URL, LineError, LineParser, build_record
from llamabatch.params import SamplingParams
from llamabatch.results import Result, Timings, Usage

from http_server import serving


def parse(body: dict, url: str = CHAT_URL):
    line = {"custom_id": "r1", "method": "POST", "url": url,
            "body": {"messages": [{"role": "user", "content": "question 1"}], **body} if url == CHAT_URL
            else {"prompt": "question 1", **body}}
    return LineParser(SamplingParams(temperature=0), input_format="jsonl").parse(json.dumps(line), 1)


def answered(item) -> dict:
    return build_record(item, Result(0, "answer", [], "stop", Usage(prompt_tokens=1, completion_tokens=1), Timings()), "m")


def test_noted_fields_are_named_in_the_record_in_body_order():
    item = parse({"store": True, "metadata": {"k": "v"}, "prompt_cache_key": "p", "safety_identifier": "s",
                  "verbosity": "low", "modalities": ["text"], "user": "u", "model": "any"})
    record = answered(item)
    assert record["ignored_fields"] == ["store", "metadata", "prompt_cache_key", "safety_identifier", "verbosity",
                                        "modalities", "user"]
    assert record["response"]["body"]["choices"][0]["message"]["content"] == "answer"


def test_a_line_with_none_of_them_has_no_ignored_fields():
    assert "ignored_fields" not in answered(parse({"model": "any", "store": None}))
    assert answered(parse({"user": "u"}, url="/v1/completions"))["ignored_fields"] == ["user"]


@pytest.mark.parametrize("body, words", [
    ({"modalities": ["text", "audio"]}, 'body.modalities must be ["text"]'),
    ({"audio": {"voice": "alloy", "format": "mp3"}}, "body.audio is not supported"),
    ({"web_search_options": {}}, "body.web_search_options is not supported"),
    ({"frobnicate": 1}, "unsupported body field 'frobnicate'"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(body, words):
    item = parse(body)
    assert isinstance(item, LineError) and words in item.message


def test_online_answers_name_them_in_a_header(tmp_path):
    with serving(tmp_path / "data") as server:
        client = server.client()
        raw = client.chat.completions.with_raw_response.create(
            model="any", messages=[{"role": "user", "content": "question 2"}], store=True, metadata={"a": "b"})
        assert set(raw.headers["llamabatch-ignored-fields"].split(", ")) == {"store", "metadata"}
        assert raw.parse().choices[0].message.content == "answer 2"
        plain = client.chat.completions.with_raw_response.create(model="any", messages=[{"role": "user", "content": "q"}])
        assert "llamabatch-ignored-fields" not in plain.headers
