"""serve-stdin's embeddings requests on the scripted FakeRunner: one terminal event each (the
vectors, in input order), bad input as that request's error, cancel, and generation beside."""
from __future__ import annotations

import json

import pytest

from llamabatch.openai_format.embed_vectors import decode_base64
from llamabatch.serve.stdin.protocol import BadLine, parse_line
from llamabatch.params import SamplingParams

from fake_runner import FAKE_N_EMBD, fake_embedding, text_tokens
from test_run_embeddings import unit
from test_serve_loop import run_serve


def by_id(events: list[dict]) -> dict:
    out: dict = {}
    for e in events:
        if "id" in e:
            out.setdefault(e["id"], []).append(e)
    return out


def test_embeddings_requests_get_one_done_event_each():
    code, events = run_serve([
        json.dumps({"id": "e1", "input": ["ab", "xyz"]}),
        json.dumps({"id": "g1", "prompt": "hello", "stream": True}),
        json.dumps({"id": "e2", "input": "ab", "encoding_format": "base64", "dimensions": 3, "normalize": False}),
        json.dumps({"id": "bad", "input": ""}),
        json.dumps({"id": "bad2", "input": "a", "encoding_format": "hex"}),
    ])
    assert code == 0
    seen = by_id(events)
    [e1] = seen["e1"]
    assert e1["event"] == "done" and e1["finish_reason"] == "stop" and e1["pooling"] == "mean"
    assert e1["embeddings"] == [pytest.approx(unit(fake_embedding(text_tokens(t), "mean"))) for t in ("ab", "xyz")]
    assert e1["usage"]["prompt_tokens"] == 5
    [e2] = seen["e2"]
    assert decode_base64(e2["embeddings"][0]) == pytest.approx(fake_embedding(text_tokens("ab"), "mean")[:3], abs=1e-6)
    [bad] = seen["bad"]
    assert bad["event"] == "error" and bad["error"]["code"] == "invalid_request" and "empty string" in bad["error"]["message"]
    [bad2] = seen["bad2"]
    assert bad2["event"] == "error" and "encoding_format" in bad2["error"]["message"]
    assert seen["g1"][-1]["event"] == "done" and seen["g1"][-1]["text"] == "hello!"


def test_embeddings_line_checks():
    defaults = SamplingParams()
    cmd = parse_line(json.dumps({"id": 1, "input": [1, 2], "pooling": "cls", "truncate": True, "timeout": 2}), 1, defaults)
    assert cmd.embed.inputs == [1, 2] and cmd.embed.pooling == "cls" and cmd.embed.truncate and cmd.embed.timeout == 2
    for line, words in [({"input": "a", "prompt": "b"}, "takes input, encoding_format"),
                        ({"input": "a", "stream": True}, "takes input"),
                        ({"input": "a", "normalize": "yes"}, "normalize must be true or false"),
                        ({"input": "a", "dimensions": -1}, "dimensions must be an integer >= 1"),
                        ({"input": "a", "timeout": 0}, "timeout must be a number")]:
        with pytest.raises(BadLine, match=words):
            parse_line(json.dumps(line), 3, defaults)


def test_dimensions_above_the_model_is_that_requests_error():
    _, events = run_serve([json.dumps({"id": "d", "input": "a", "dimensions": FAKE_N_EMBD + 1}),
                           json.dumps({"id": "ok", "input": "a"})])
    seen = by_id(events)
    assert seen["d"][0]["event"] == "error" and "dimensions" in seen["d"][0]["error"]["message"]
    assert seen["ok"][0]["event"] == "done"


def test_cancel_an_embeddings_request():
    _, events = run_serve([json.dumps({"id": "big", "input": ["a"] * 40}), json.dumps({"op": "cancel", "id": "big"})],
                          embed_delay=0.05, embed_max_seqs=1)
    seen = by_id(events)
    assert [e["event"] for e in seen["big"]] == ["done"]
    assert seen["big"][0]["finish_reason"] == "cancelled" and seen["big"][0]["embeddings"] == []
