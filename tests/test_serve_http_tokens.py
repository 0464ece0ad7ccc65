"""POST /tokenize and POST /detokenize in llama-server's shapes, over the scripted fake (one
token per character): round trips, pieces, the API key, and bad input answered with a 400 in
OpenAI's error shape (the model's own round trips: test_serve_http_tokens_model.py)."""
from __future__ import annotations

import json

import pytest

from http_server import raw, serving
from fake_runner import byte_tokens


def _post(base: str, path: str, body, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    got = raw("POST", f"{base}{path}", data, {"Content-Type": "application/json", **(headers or {})})
    return got.status, got.json()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("tokens")) as server:
        yield server.base_url.removesuffix("/v1")


def test_tokenize_then_detokenize_gives_the_text_back(base):
    status, body = _post(base, "/tokenize", {"content": "héllo, wörld"})
    assert status == 200 and body == {"tokens": [ord(c) for c in "héllo, wörld"]}
    assert _post(base, "/detokenize", body) == (200, {"content": "héllo, wörld"})


def test_with_pieces_gives_each_token_with_its_text(base):
    status, body = _post(base, "/tokenize", {"content": "hé", "with_pieces": True, "add_special": False})
    assert status == 200 and body == {"tokens": [{"id": ord("h"), "piece": "h"}, {"id": ord("é"), "piece": "é"}]}


def test_detokenize_joins_the_bytes_of_tokens_that_split_a_character(base):
    assert _post(base, "/detokenize", {"tokens": byte_tokens("é!".encode())}) == (200, {"content": "é!"})
    assert _post(base, "/detokenize", {"tokens": []}) == (200, {"content": ""})


@pytest.mark.parametrize(("path", "body", "says"), [
    ("/tokenize", {}, "content must be a string"),
    ("/tokenize", {"content": 5}, "content must be a string, got int"),
    ("/tokenize", {"content": "a", "with_pieces": "yes"}, "with_pieces must be true or false"),
    ("/tokenize", {"content": "a", "add_special": 1}, "add_special must be true or false"),
    ("/tokenize", ["content"], "must be a JSON object"),
    ("/detokenize", {"tokens": "1 2"}, "tokens must be a list of token ids, got str"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens[1] = -1 is not a token id of this model"),
    ("/detokenize", {"tokens": [1, 10 ** 30]}, "is not a token id of this model"),
    ("/detokenize", {"tokens": [1.5]}, "tokens[0] = 1.5 is not a token id"),
    ("/detokenize", {"tokens": [True]}, "tokens[0] = True is not a token id"),
    ("/detokenize", {"tokens": [[1]]}, "is not a token id"),
    ("/detokenize", b"{not json", "is not usable JSON"),
])
def test_bad_input_is_a_400_saying_what_is_wrong(base, path, body, says):
    status, answer = _post(base, path, body)
    assert status == 400 and says in answer["error"]["message"], answer
    assert answer["error"]["type"] == "invalid_request_error"


def test_a_body_past_the_bound_is_refused_before_it_is_read(base):
    got = raw("POST", f"{base}/tokenize", b"{}", {"Content-Type": "application/json", "Content-Length": str(1 << 30)})
    assert got.status == 413 and "larger than" in got.json()["error"]["message"]


def test_too_long_a_text_is_refused_without_tokenizing_it(base):
    status, answer = _post(base, "/tokenize", {"content": " " * ((1 << 20) + 1)})
    assert status == 400 and "at most" in answer["error"]["message"]


def test_tokenize_wants_the_key_as_every_route(tmp_path):
    with serving(tmp_path, api_key="sekrit", health_without_key=True) as server:
        base = server.base_url.removesuffix("/v1")
        assert _post(base, "/tokenize", {"content": "a"})[0] == 401
        assert _post(base, "/detokenize", {"tokens": [97]})[0] == 401
        assert _post(base, "/tokenize", {"content": "a"}, {"Authorization": "Bearer sekrit"}) == (200, {"tokens": [97]})
