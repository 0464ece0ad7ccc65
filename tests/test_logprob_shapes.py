"""Logprobs in OpenAI's chat and completions shapes, and how OpenAI lines ask for them (no model)."""
from __future__ import annotations

import json

from fake_runner import fake_logprobs, text_tokens

from llamabatch.openai_format.lines import CHAT_URL, COMPLETIONS_URL, LineError, LineParser, openai_record, plain_record
from llamabatch.openai_format.logprobs import chat_logprobs, completion_logprobs, covering
from llamabatch.params import SamplingParams
from llamabatch.results import Result, Timings, Usage

DEFAULTS = SamplingParams(max_tokens=32)


def records(text: str, k: int) -> list[dict]:
    return [fake_logprobs(t, k) for t in text_tokens(text)]


def result(text: str, lp: list[dict] | None) -> Result:
    return Result(0, text, text_tokens(text), "stop", Usage(4, 0, len(text)), Timings(), seed=1, logprobs=lp)


def parse(url: str, **body) -> object:
    body.setdefault("messages" if url == CHAT_URL else "prompt", [{"role": "user", "content": "Hi"}]
                    if url == CHAT_URL else "Once")
    line = {"custom_id": "r", "method": "POST", "url": url, "body": body}
    return LineParser(DEFAULTS).parse(json.dumps(line), 1)


def test_openai_lines_ask_for_logprobs_as_openai_documents():
    assert parse(CHAT_URL, logprobs=True, top_logprobs=3).params.logprobs == 3
    assert parse(CHAT_URL, logprobs=True).params.logprobs == 0
    assert parse(CHAT_URL, logprobs=False).params.logprobs is None
    assert parse(CHAT_URL, logprobs=None, top_logprobs=None).params.logprobs is None
    assert parse(COMPLETIONS_URL, logprobs=5).params.logprobs == 5
    assert parse(COMPLETIONS_URL, logprobs=0).params.logprobs == 0
    for url, body, words in [
        (CHAT_URL, {"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer in [0, 20]"),
        (CHAT_URL, {"top_logprobs": 2}, "top_logprobs needs body.logprobs set to true"),
        (CHAT_URL, {"logprobs": 3}, "logprobs must be true or false"),
        (COMPLETIONS_URL, {"logprobs": True}, "logprobs must be an integer in [0, 20]"),
        (COMPLETIONS_URL, {"logprobs": 2, "top_logprobs": 2}, "not body.top_logprobs"),
    ]:
        err = parse(url, **body)
        assert isinstance(err, LineError) and err.code == "invalid_request" and words in err.message, (body, err)


def test_chat_shape():
    lp = chat_logprobs(records("ab", 2), "ab")
    assert lp["refusal"] is None
    assert lp["content"][0] == {"token": "a", "logprob": -0.5, "bytes": [97],
                                "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]},
                                                 {"token": "b", "logprob": -1.5, "bytes": [98]}]}
    assert "".join(c["token"] for c in lp["content"]) == "ab"
    assert chat_logprobs(records("ab", 0), "ab")["content"][1]["top_logprobs"] == []


def test_completions_shape():
    lp = completion_logprobs(records("abc", 2), "abc")
    assert lp == {"tokens": ["a", "b", "c"], "token_logprobs": [-0.5, -0.5, -0.5],
                  "top_logprobs": [{"a": -0.5, "b": -1.5}, {"b": -0.5, "a": -1.5}, {"c": -0.5, "a": -1.5}],
                  "text_offset": [0, 1, 2]}


def test_tokens_of_a_cut_stop_string_are_left_out():
    # "ab" was returned; "XY" (the stop string) was generated but cut from the text
    assert [r["token"] for r in covering(records("abXY", 1), "ab")] == ["a", "b"]
    assert covering(records("ab", 1), "") == []
    assert covering(None, "ab") == []


def test_openai_records_carry_logprobs_only_when_asked():
    chat = openai_record("r", CHAT_URL, result("ab", records("ab", 1)), "m")["response"]["body"]["choices"][0]
    assert [c["token"] for c in chat["logprobs"]["content"]] == ["a", "b"]
    comp = openai_record("r", COMPLETIONS_URL, result("ab", records("ab", 1)), "m")["response"]["body"]["choices"][0]
    assert comp["logprobs"]["tokens"] == ["a", "b"]
    assert openai_record("r", CHAT_URL, result("ab", None), "m")["response"]["body"]["choices"][0]["logprobs"] is None


def test_plain_records_carry_the_engines_records():
    rec = plain_record(1, result("ab", records("ab", 1)))
    assert [r["id"] for r in rec["logprobs"]] == text_tokens("ab")
    assert "logprobs" not in plain_record(1, result("ab", None))


# -- n samples in records ------------------------------------------------------------------------


def n_result(texts: list[str], lp: bool = False) -> Result:
    samples = [Result(0, t, text_tokens(t), "stop" if i else "length", Usage(4, 0, len(t)), Timings(), seed=7 + i,
                      logprobs=records(t, 1) if lp else None, index=i) for i, t in enumerate(texts)]
    return Result(0, texts[0], text_tokens(texts[0]), "length", Usage(4, 0, sum(map(len, texts))), Timings(),
                  seed=7, logprobs=samples[0].logprobs, samples=samples)


def test_openai_lines_take_n():
    assert parse(CHAT_URL, n=3).params.n == 3
    assert parse(COMPLETIONS_URL, n=2, logprobs=1).params.n == 2


def test_openai_record_has_one_choice_per_sample_and_counts_the_prompt_once():
    body = openai_record("r", CHAT_URL, n_result(["ab", "cd", "e"], lp=True), "m")["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == ["ab", "cd", "e"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "stop", "stop"]
    assert ["".join(t["token"] for t in c["logprobs"]["content"]) for c in body["choices"]] == ["ab", "cd", "e"]
    assert body["usage"]["prompt_tokens"] == 4 and body["usage"]["completion_tokens"] == 5
    comp = openai_record("r", COMPLETIONS_URL, n_result(["ab", "c"]), "m")["response"]["body"]
    assert [(c["index"], c["text"], c["logprobs"]) for c in comp["choices"]] == [(0, "ab", None), (1, "c", None)]


def test_plain_record_of_n_samples():
    rec = plain_record("x", n_result(["ab", "cd"], lp=True))
    assert list(rec)[:4] == ["id", "texts", "finish_reasons", "finish_reason"]
    assert rec["texts"] == ["ab", "cd"] and rec["finish_reasons"] == ["length", "stop"] and "text" not in rec
    assert rec["usage"]["prompt_tokens"] == 4 and rec["usage"]["completion_tokens"] == 4
    assert [[r["token"] for r in lp] for lp in rec["logprobs"]] == [["a", "b"], ["c", "d"]]
