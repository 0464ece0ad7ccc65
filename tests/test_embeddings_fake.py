"""Embeddings through the engine's tick loop on the scripted FakeRunner: packing, order,
pooling, normalization, bad input, cancel, timeout, failed decodes, and embeddings beside
generation. No model."""
from __future__ import annotations

import math
import threading

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.embedding import MAX_INPUTS, EmbedQueue, EmbedJob, split_inputs
from llamabatch.core.engine_base import EmbeddingFailed
from llamabatch.errors import InvalidRequest
from llamabatch.results import EmbeddingResult

from fake_runner import FAKE_N_EMBD, FakeRunner, fake_embedding, text_tokens

WAIT = 10


def make_engine(runner: FakeRunner, **config) -> Engine:
    cfg = dict(n_parallel=runner.n_slots, n_batch=64, chunk_size=16)
    cfg.update(config)
    runner.n_batch = cfg["n_batch"]
    return Engine(EngineConfig(**cfg), runner=runner,
                  default_params=SamplingParams(temperature=0, max_tokens=8))


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def test_vectors_in_input_order_unit_length_and_packed():
    runner = FakeRunner(embed_max_tokens=20, embed_max_seqs=3)
    texts = ["alpha", "be", "gamma ray", "d", "alpha", "epsilon zeta"]
    with make_engine(runner) as engine:
        out = engine.embed(texts)
    assert [e.index for e in out] == list(range(len(texts)))
    assert all(len(e.vector) == FAKE_N_EMBD and abs(norm(e.vector) - 1) < 1e-9 for e in out)
    for text, e in zip(texts, out):
        raw = fake_embedding(text_tokens(text), "mean")
        assert e.vector == pytest.approx([x / norm(raw) for x in raw])
        assert e.n_tokens == len(text)
    assert out[0].vector == out[4].vector  # identical text, identical vector
    # several inputs share each decode, within the runner's bounds
    assert len(runner.embed_batches) < len(texts)
    assert all(len(b.inputs) <= 3 and b.n_tokens <= 20 for b, _ in runner.embed_batches)
    assert runner.violations == []


def test_token_ids_pooling_and_unnormalized():
    runner = FakeRunner()
    with make_engine(runner) as engine:
        last = engine.embed([[104, 105], [106]], pooling="last", normalize=False)
        cls = engine.embed([104, 105], pooling="cls", normalize=False)  # one input as token ids
    assert last[0].vector == fake_embedding([104, 105], "last")
    assert last[1].vector == fake_embedding([106], "last")
    assert len(cls) == 1 and cls[0].vector == fake_embedding([104], "cls")
    assert {b.pooling for b, _ in runner.embed_batches} == {"last", "cls"}


def test_engine_pooling_setting_is_the_default():
    runner = FakeRunner(default_pooling="cls")
    with make_engine(runner) as engine:
        result = engine.submit_embedding(["ab"], normalize=False).result(WAIT)
    assert result.pooling == "cls" and result.vectors[0] == fake_embedding(text_tokens("ab"), "cls")


@pytest.mark.parametrize("inputs, fragment", [
    ("", "input is an empty string"),
    ([], "input is an empty list"),
    (["ok", ""], "input[1] is an empty string"),
    (["ok", 3.5], "input[1] must be a string or a list of token ids, got float"),
    ([["a"]], "input[0] must be a string or a list of token ids"),
    ([-1, 2], "token -1 is not a token id"),
    ([[5], [10**9]], "input[1]: token 1000000000 is not a token id"),
    (["x"] * (MAX_INPUTS + 1), f"at most {MAX_INPUTS} per request"),
    ({"a": 1}, "input must be a string"),
])
def test_bad_input_is_that_requests_error_only(inputs, fragment):
    runner = FakeRunner()
    with make_engine(runner) as engine:
        bad = engine.submit_embedding(inputs)
        good = engine.submit_embedding("fine")
        r_bad, r_good = bad.result(WAIT), good.result(WAIT)
    assert isinstance(r_bad, EmbeddingResult) and r_bad.finish_reason == "error"
    assert fragment in r_bad.error and r_bad.error_code == "invalid_request"
    assert r_good.ok and len(r_good.vectors) == 1


def test_too_long_input_errors_or_truncates():
    runner = FakeRunner(embed_max_tokens=10)
    with make_engine(runner) as engine:
        long = "x" * 25
        with pytest.raises(EmbeddingFailed, match="25 tokens but an embedding input may have at most 10"):
            engine.embed(long)
        out = engine.embed(long, truncate=True)
    assert out[0].n_tokens == 10


def test_megabytes_of_input_are_refused_or_cut_without_tokenizing_them():
    # more bytes than n_batch of the longest tokens (4 on the fake) can spell is
    # context_overflow before tokenizing; with truncate only a prefix is tokenized, and the
    # vector is the one of the first 10 tokens, as for a short text
    runner = FakeRunner(embed_max_tokens=10)
    with make_engine(runner) as engine:
        with pytest.raises(EmbeddingFailed, match="8,000,000 bytes, more than 10 tokens"):
            engine.embed(" " * 8_000_000)
        cut = engine.embed("abcdefghijklmnop" + " " * 8_000_000, truncate=True)[0]
        short = engine.embed("abcdefghij")[0]
    assert runner.tokenized_chars < 10_000
    assert cut.n_tokens == 10 and cut.vector == short.vector


def test_unknown_pooling_and_reranker_default_refused():
    with make_engine(FakeRunner()) as engine:
        with pytest.raises(EmbeddingFailed, match="pooling must be one of mean, cls, last"):
            engine.embed("a", pooling="none")
    with make_engine(FakeRunner(default_pooling="rank")) as engine:
        with pytest.raises(EmbeddingFailed, match="reranker"):
            engine.embed("a")
        assert engine.embed("a", pooling="mean")  # naming a pooling makes it possible
    with make_engine(FakeRunner(embed_refusal="no embeddings here")) as engine:
        with pytest.raises(EmbeddingFailed, match="no embeddings here"):
            engine.embed("a")


def test_failed_decode_ends_only_its_batch():
    runner = FakeRunner(embed_status={1: -3}, embed_max_seqs=1)
    with make_engine(runner) as engine:
        first = engine.submit_embedding("one")
        second = engine.submit_embedding("two")
        a, b = first.result(WAIT), second.result(WAIT)
    assert a.finish_reason == "error" and "llama_decode returned -3" in a.error and a.error_code == "decode_error"
    assert b.ok


def test_cancel_and_timeout_each_one_outcome():
    runner = FakeRunner(embed_delay=0.05, embed_max_seqs=1)
    outcomes: list[str] = []
    lock = threading.Lock()

    def seen(_h, item):
        with lock:
            outcomes.append(item.finish_reason)

    with make_engine(runner) as engine:
        busy = engine.submit_embedding(["a"] * 20, callback=seen)  # 20 decodes of 50 ms
        cancelled = engine.submit_embedding("b", callback=seen)
        cancelled.cancel()
        timed = engine.submit_embedding("c", timeout=0.1, callback=seen)
        assert cancelled.result(WAIT).finish_reason == "cancelled"
        assert timed.result(WAIT).finish_reason == "timeout"
        assert busy.result(WAIT).ok
        cancelled.cancel()  # after the outcome: nothing more
    assert sorted(outcomes) == ["cancelled", "stop", "timeout"]


def test_close_cancels_waiting_embeddings():
    runner = FakeRunner(embed_delay=0.05, embed_max_seqs=1)
    engine = make_engine(runner)
    handle = engine.submit_embedding(["a"] * 50)
    engine.close()
    assert handle.result(WAIT).finish_reason == "cancelled"


def test_embeddings_run_between_generation_ticks():
    runner = FakeRunner(n_slots=2)
    with make_engine(runner) as engine:
        gen = engine.submit("hello there", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        emb = engine.submit_embedding(["x" * 5] * 30)
        assert emb.result(WAIT).ok
        assert gen.result(WAIT).finish_reason == "length"
    assert runner.violations == []
    assert runner.embed_batches and runner.plans


def test_split_inputs_shapes():
    assert split_inputs("a") == ["a"]
    assert split_inputs([1, 2]) == [[1, 2]]
    assert split_inputs(["a", [1]]) == ["a", [1]]
    with pytest.raises(InvalidRequest):
        split_inputs([True, False])


def test_queue_packs_fifo_one_pooling_per_batch():
    q = EmbedQueue()
    a = EmbedJob(1, [[1] * 4, [2] * 4], "mean", True)
    b = EmbedJob(2, [[3] * 4], "cls", True)
    c = EmbedJob(3, [[4] * 4], "mean", True)
    for job in (a, b, c):
        q.add(job)
    pooling, items = q.take(max_tokens=100, max_seqs=10)
    assert pooling == "mean" and [(i.job.request_id, i.index) for i in items] == [(1, 0), (1, 1), (3, 0)]
    pooling, items = q.take(max_tokens=100, max_seqs=10)
    assert pooling == "cls" and [(i.job.request_id, i.index) for i in items] == [(2, 0)]
    assert not q.has_work()


def test_dimensions_cut_then_normalize_and_bounds():
    runner = FakeRunner()
    with make_engine(runner) as engine:
        out = engine.embed("abc", dimensions=3)
        with pytest.raises(EmbeddingFailed, match=r"dimensions must be an integer in \[1, 8\]"):
            engine.embed("abc", dimensions=FAKE_N_EMBD + 1)
        with pytest.raises(EmbeddingFailed, match="dimensions must be"):
            engine.embed("abc", dimensions=0)
    raw = fake_embedding(text_tokens("abc"), "mean")[:3]
    assert out[0].vector == pytest.approx([x / norm(raw) for x in raw])
