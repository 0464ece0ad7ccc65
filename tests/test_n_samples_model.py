"""`n` samples on the bundled Gemma 3 270M, for real: one prefill for n samples, sample i =
a single request with seed + i, n > slots, cancel of every sample, and `run` writing n choices.
One thread and few tokens, to stay cheap on a shared two-core machine.

"Sample i equals a single request with seed + i" compares a row of an n=4 group with a
request of its own (the four singles run side by side) and "greedy sample 0" a group's row
with a request alone: the same tokens only where a row's numbers do not depend on its
batch-mates, which llama.cpp's CPU kernels promise only in deterministic mode (4-row gemm
tiles vs 1-row gemv on repacked weights: ../shared/probes/README.md). So those comparisons
run on a deterministic engine, on each CPU weight layout this machine has (`cpu_path`).
The one-prefill and deterministic tests run on Gemma 3 and SmolLM2 (`family`).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llamabatch import Delta, Engine, EngineConfig, SamplingParams, TickRecord

from family_engines import family_engine_of

pytestmark = pytest.mark.model

WAIT = 120
PROMPT = "Write one sentence about a lighthouse keeper and the sea:"


@pytest.fixture(scope="module")
def engine(model_path):
    with Engine(EngineConfig(model=model_path, n_parallel=4, n_ctx=4 * 256, threads=1)) as eng:
        yield eng


@pytest.fixture(scope="module")
def family_engine(request, family):
    """`engine` on each model family (the Gemma one is `engine` itself)."""
    yield from family_engine_of(request, family, n_parallel=4, n_ctx=4 * 256, threads=1)


@pytest.fixture(scope="module")
def det_engine(family, cpu_path):
    with Engine(EngineConfig(model=family.path, n_parallel=4, n_ctx=4 * 256, threads=1, deterministic=True,
                             cpu_buffers=cpu_path)) as eng:
        yield eng


def test_n_greedy_samples_are_identical_and_the_prompt_is_evaluated_once(family_engine):
    engine = family_engine
    params = SamplingParams(temperature=0, max_tokens=8, n=4)
    prompt = "Name three rivers of Europe and one of Africa, in a list:"  # in no slot's cache yet
    ticks: list[TickRecord] = []
    unsubscribe = engine.subscribe(lambda r: ticks.append(r) if isinstance(r, TickRecord) else None)
    result = engine.submit(prompt, params).result(WAIT)
    unsubscribe()
    n_prompt = len(engine.tokenize(prompt))
    assert result.ok and len(result.samples) == 4
    assert len({s.text for s in result.samples}) == 1 and result.samples[0].text
    assert sum(t.prefill_tokens for t in ticks) == n_prompt  # one prefill, not four
    assert result.usage.prompt_tokens == n_prompt  # counted once
    assert result.usage.completion_tokens == sum(len(s.token_ids) for s in result.samples)


def test_greedy_sample_0_equals_a_single_request_in_deterministic_mode(det_engine):
    params = SamplingParams(temperature=0, max_tokens=8, n=4)
    prompt = "Name three rivers of Asia and one of America, in a list:"
    group = det_engine.submit(prompt, params).result(WAIT)
    assert group.ok and len({s.text for s in group.samples}) == 1
    assert det_engine.submit(prompt, params.replace(n=1)).result(WAIT).text == group.samples[0].text


def test_sample_i_equals_a_single_request_with_seed_plus_i(det_engine):
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=1234)
    group = det_engine.submit(PROMPT, params.replace(n=4)).result(WAIT)
    # the four singles side by side, each a request of its own: on a deterministic engine a
    # row's numbers do not depend on its batch-mates, so each gives what it gives alone
    singles = [h.result(WAIT) for h in [det_engine.submit(PROMPT, params.replace(seed=1234 + i)) for i in range(4)]]
    assert [s.seed for s in group.samples] == [1234, 1235, 1236, 1237]
    assert [s.text for s in group.samples] == [r.text for r in singles]
    assert len({r.text for r in singles}) > 1  # temperature 1: the seeds really differ


def test_n_larger_than_the_slots_is_one_clear_error(engine):
    r = engine.submit(PROMPT, SamplingParams(n=5)).result(WAIT)
    assert r.finish_reason == "error" and r.error_code == "invalid_request"
    assert r.error == ("n=5 is more than the 4 slots (n_parallel): the samples of one prompt generate side by "
                       "side, one slot each")


def test_cancel_of_an_n_request_cancels_every_sample(engine):
    started = []

    def on_item(handle, item):
        if isinstance(item, Delta) and item.text and not started:
            started.append(item.index)
            handle.cancel()

    r = engine.submit(PROMPT, SamplingParams(max_tokens=200, ignore_eos=True, n=3), callback=on_item).result(WAIT)
    assert started and r.finish_reason == "cancelled"
    assert [s.finish_reason for s in r.samples] == ["cancelled"] * 3
    assert all(len(s.token_ids) < 200 for s in r.samples)
    assert engine.stats().slots_idle == 4


def test_run_writes_n_choices_with_logprobs(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    lines = [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Say hello to the sea."}], "n": 2,
                  "logprobs": True, "top_logprobs": 2, "max_tokens": 4, "temperature": 0.9, "seed": 7}},
        {"custom_id": "comp", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "Once upon a time", "n": 3, "logprobs": 1, "max_tokens": 3, "seed": 3}},
        {"id": "plain", "prompt": "Hello", "n": 2, "max_tokens": 3},
        {"id": "toomany", "prompt": "Hello", "n": 9},
        {"custom_id": "best", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "best_of": 2}},
    ]
    infile = tmp_path / "in.jsonl"
    infile.write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(infile), "--n-parallel", "4",
                           "--n-ctx", "1024", "--threads", "1"], capture_output=True, text=True, timeout=300)
    records = {(r.get("custom_id") or r["id"]): r for r in map(json.loads, proc.stdout.splitlines())}
    assert len(records) == 5, proc.stderr

    body = records["chat"]["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert "".join(t["token"] for t in content) == choice["message"]["content"]
        assert all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in content)
    body = records["comp"]["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all("".join(c["logprobs"]["tokens"]) == c["text"] for c in body["choices"])
    assert body["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in body["choices"])
    assert 0 < body["usage"]["prompt_tokens"] < 10  # the prompt counted once, not three times

    plain = records["plain"]
    assert len(plain["texts"]) == 2 and len(plain["finish_reasons"]) == 2 and "text" not in plain
    assert records["toomany"]["error"]["code"] == "invalid_request"
    assert "n=9 is more than the 4 slots" in records["toomany"]["error"]["message"]
    assert records["best"]["response"]["status_code"] == 400
    assert "best_of is not supported" in records["best"]["error"]["message"]
