"""Embeddings on the bundled Gemma 3 270M: real vectors through the engine, `run` and
deterministic mode. Small on purpose (a few short inputs): 2 cores run the whole suite."""
from __future__ import annotations

import json
import math

import pytest

from llamabatch import Engine, EngineConfig
from llamabatch.openai_format.embed_vectors import decode_base64

from cli_harness import invoke

pytestmark = pytest.mark.model

TEXTS = ["The cat sat on the mat.", "Quarterly revenue grew by four percent.", "A dog slept on the rug."]
CONFIG = dict(n_parallel=2, n_ctx=1024)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(scope="module")
def engine(model_path):
    with Engine(EngineConfig(model=model_path, **CONFIG)) as e:
        yield e


def test_vectors_have_the_models_width_unit_length_and_input_order(engine):
    out = engine.embed(TEXTS + [TEXTS[0]])
    assert engine.runner.n_embd == 640
    assert [e.index for e in out] == [0, 1, 2, 3]
    assert all(len(e.vector) == 640 for e in out)
    assert all(abs(math.sqrt(sum(x * x for x in e.vector)) - 1) < 1e-6 for e in out)
    # identical text: the same vector up to the CPU kernels' rounding of a row's place in the
    # batch (exactly the same in deterministic mode: below)
    assert cosine(out[0].vector, out[3].vector) > 0.9999
    # each input's own vector, in its place: the same text alone agrees, another does not
    for i, text in enumerate(TEXTS):
        alone = engine.embed(text)[0].vector
        assert cosine(alone, out[i].vector) > 0.9999
        assert all(cosine(alone, out[j].vector) < 0.999 for j in range(3) if j != i)
    raw = engine.embed(TEXTS[1], normalize=False)[0].vector
    assert abs(math.sqrt(sum(x * x for x in raw)) - 1) > 1e-3  # pooled, not normalized
    assert engine.embed([TEXTS[1]], pooling="last")[0].vector != out[1].vector


def test_pooled_here_matches_llama_cpps_own_pooling(engine):
    """The bundled model is a generative LM: its graph stops before the vocabulary projection
    and the states are pooled in Python (llama/embedder.py); llama.cpp's own pooling of the
    full graph gives the same vectors."""
    from llamabatch.core.plan import EmbedBatch
    from llamabatch.llama.embedder import Embedder

    runner = engine.runner
    stops = runner.embedder.stops
    tokens = [runner.tokenize(t, special=False) for t in TEXTS]
    ours = runner.embed(EmbedBatch("mean", tokens)).vectors
    assert runner.embedder.stops > stops  # the graph really stopped early
    arch = runner.metadata["general.architecture"]
    for pooling in ("mean", "last"):
        theirs = Embedder(runner.model, engine.config, False, {"general.architecture": arch,
                                                               f"{arch}.pooling_type": "1"})
        try:
            assert not theirs.pool_here
            reference = theirs.run(EmbedBatch(pooling, tokens)).vectors
        finally:
            theirs.close()
        ours = runner.embed(EmbedBatch(pooling, tokens)).vectors
        assert all(cosine(a, b) > 0.99999 for a, b in zip(ours, reference))


def test_generation_and_embeddings_share_the_engine(engine):
    from llamabatch import SamplingParams

    gen = engine.submit("The capital of France is", SamplingParams(max_tokens=4, temperature=0))
    emb = engine.submit_embedding(TEXTS)
    assert emb.result(120).ok and gen.result(120).finish_reason in ("stop", "length")


def test_run_answers_openai_lines_with_real_vectors_and_base64_round_trips(model_path, tmp_path):
    body = {"model": "x", "input": TEXTS[:2]}
    lines = [{"custom_id": "f", "method": "POST", "url": "/v1/embeddings", "body": body},
             {"custom_id": "b", "method": "POST", "url": "/v1/embeddings",
              "body": {**body, "encoding_format": "base64"}},
             {"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {"input": [[1, 10**8]]}}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = invoke(["run", str(src), "--model", model_path, "--no-isolate", "--n-parallel", "2",
                     "--n-ctx", "1024", "--deterministic"])
    assert result.exit_code == 0, result.stderr
    recs = {r["custom_id"]: r for r in map(json.loads, result.stdout.splitlines())}
    floats = recs["f"]["response"]["body"]["data"]
    encoded = recs["b"]["response"]["body"]["data"]
    assert [d["index"] for d in floats] == [0, 1] and all(len(d["embedding"]) == 640 for d in floats)
    for f, b in zip(floats, encoded):
        # deterministic mode: the same vector in either line; base64 is it as float32
        assert decode_base64(b["embedding"]) == pytest.approx(f["embedding"], abs=1e-7)
    assert recs["f"]["response"]["body"]["usage"]["prompt_tokens"] > 0
    assert recs["bad"]["error"]["code"] == "invalid_request" and "not a token id" in recs["bad"]["error"]["message"]


def test_deterministic_mode_gives_the_same_vector_alone_or_in_a_batch(model_path):
    with Engine(EngineConfig(model=model_path, deterministic=True, **CONFIG)) as e:
        together = e.embed(TEXTS + [TEXTS[0]])
        alone = [e.embed(t)[0].vector for t in TEXTS]
        result = e.submit_embedding(TEXTS[0]).result(120)
    assert together[0].vector == together[3].vector  # identical text, identical vector
    assert [v.vector for v in together[:3]] == alone
    assert result.deterministic
