"""POST /tokenize and /detokenize on both model families, with the engine in its supervised
child (serve's default): round trips, BOS only with add_special, pieces that split a character
given as byte lists, and an id past the vocabulary refused with a 400."""
from __future__ import annotations

import json

import pytest

from llamabatch import EngineConfig
from llamabatch.serve.http.app import build_app
from llamabatch.serve.http.server import listen
from llamabatch.serve.http.service import Service
from llamabatch.supervised import SupervisedEngine

from http_server import raw

pytestmark = pytest.mark.model
TEXT = "Hello world, llamas 🦙 and café"


def _post(base: str, path: str, body) -> tuple[int, dict]:
    got = raw("POST", f"{base}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return got.status, got.json()


@pytest.fixture(scope="module")
def base(family, tmp_path_factory):
    engine = SupervisedEngine(EngineConfig(model=family.path, n_parallel=1, n_ctx=512))
    service = Service(engine, str(tmp_path_factory.mktemp("data")))
    listening = listen(build_app(service), "127.0.0.1", 0)
    thread = listening.run_in_thread()
    try:
        yield f"http://127.0.0.1:{listening.port}", engine
    finally:
        listening.stop()
        thread.join(10)
        service.close(10)
        engine.close()


def test_round_trip_and_pieces_on_the_model(base):
    url, engine = base
    status, plain = _post(url, "/tokenize", {"content": TEXT})
    assert status == 200 and plain["tokens"] and all(isinstance(t, int) for t in plain["tokens"])
    assert _post(url, "/detokenize", plain) == (200, {"content": TEXT})
    # add_special: the tokens the model puts before (and after) a prompt, as its own tokenize gives them
    _, special = _post(url, "/tokenize", {"content": TEXT, "add_special": True})
    assert special["tokens"] == engine.tokenize(TEXT, special=True)
    assert len(special["tokens"]) >= len(plain["tokens"])
    _, pieces = _post(url, "/tokenize", {"content": TEXT, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == plain["tokens"]
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                      for p in pieces["tokens"])
    assert joined.decode() == TEXT


def test_an_id_past_the_vocabulary_is_a_400(base):
    url, engine = base
    status, answer = _post(url, "/detokenize", {"tokens": [1, 10 ** 7]})
    assert status == 400 and "is not a token id of this model" in answer["error"]["message"]
    assert engine.ready  # the child answered the refusal and still serves
