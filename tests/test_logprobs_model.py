"""Logprobs on the bundled Gemma 3 270M, for real: records that are log probabilities of the
tokens generated (on Gemma 3's 262k and SmolLM2's 49k vocabularies), and `run` writing them in
OpenAI's chat and completions shapes. One thread
and a few tokens, to stay cheap on a shared two-core machine.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.model


def test_logprobs_are_log_probabilities_of_the_tokens_generated(family, cpu_path):
    # no prompt cache: both requests run alone in the same shapes, so "asking changes nothing
    # else" means the same tokens on every kernel path
    with Engine(EngineConfig(model=family.path, n_parallel=2, n_ctx=512, threads=1, cache_prompt=False,
                             cpu_buffers=cpu_path)) as engine:
        params = SamplingParams(temperature=0, max_tokens=5, logprobs=5)
        r = engine.submit("The capital of France is", params).result(120)
        plain = engine.submit("The capital of France is", params.replace(logprobs=None)).result(120)
    assert plain.logprobs is None and plain.text == r.text  # asking changes nothing else
    assert len(r.logprobs) == len(r.token_ids) == 5
    for rec, tok in zip(r.logprobs, r.token_ids):
        assert rec["id"] == tok and rec["logprob"] <= 0
        tops = [t["logprob"] for t in rec["top_logprobs"]]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        assert rec["top_logprobs"][0]["id"] == tok and rec["top_logprobs"][0]["logprob"] == rec["logprob"]
        assert sum(math.exp(lp) for lp in tops) <= 1.0 + 1e-6  # part of a distribution over the vocabulary
        assert bytes(rec["bytes"]).decode("utf-8", "replace") == rec["token"]
    assert "".join(rec["token"] for rec in r.logprobs) == r.text


def test_run_writes_logprobs_in_openai_shapes_and_plain_records(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    lines = [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Say hello to the sea."}], "logprobs": True,
                  "top_logprobs": 3, "max_tokens": 4, "temperature": 0.9, "seed": 7}},
        {"custom_id": "comp", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "Once upon a time", "logprobs": 2, "max_tokens": 4, "seed": 3}},
        {"custom_id": "none", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Hi", "max_tokens": 2}},
        {"id": "plain", "prompt": "Hello", "max_tokens": 3, "logprobs": 1},
    ]
    infile = tmp_path / "in.jsonl"
    infile.write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(infile), "--n-parallel", "4",
                           "--n-ctx", "1024", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = {(r.get("custom_id") or r["id"]): r for r in map(json.loads, proc.stdout.splitlines())}

    choice = records["chat"]["response"]["body"]["choices"][0]
    content = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None and content
    assert "".join(t["token"] for t in content) == choice["message"]["content"]
    for t in content:
        assert set(t) == {"token", "logprob", "bytes", "top_logprobs"} and t["logprob"] <= 0
        tops = [a["logprob"] for a in t["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert all(set(a) == {"token", "logprob", "bytes"} for a in t["top_logprobs"])

    choice = records["comp"]["response"]["body"]["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == 4
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(4)]
    assert all(x <= 0 for x in lp["token_logprobs"])
    for alts in lp["top_logprobs"]:
        assert 1 <= len(alts) <= 2 and list(alts.values()) == sorted(alts.values(), reverse=True)

    assert records["none"]["response"]["body"]["choices"][0]["logprobs"] is None
    assert [r["id"] for r in records["plain"]["logprobs"]] and len(records["plain"]["logprobs"]) == 3
