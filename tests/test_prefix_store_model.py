"""The disk prefix store with the bundled model: KV saved by one engine and restored by a later
one continues exactly as the evaluated prefix does (greedy, both KV layouts).

What is asserted holds on every CPU kernel path: a restored slot holds the very bytes the first
engine computed, but not the same cells (llama.cpp saves only the last 512 positions of Gemma 3's
sliding-window layers), so the attention sums over a different cell layout and the logits may
differ in their last bits. Greedy tokens are compared where the evaluated run's choice was clear
(a top-2 logprob gap above NEAR_TIE); a divergence right after a near tie is rounding, not a wrong
prefix. A wrong prefix (wrong positions, another prompt's KV) changes the answer outright.
"""
from __future__ import annotations

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams

INSTRUCTION = ("You are a careful assistant. Read the short product review that follows and answer "
               "with a single word: positive, negative or mixed. Do not explain. " * 5)
ITEMS = ["Review: the battery died after two days. Answer:", "Review: it works and it is cheap. Answer:"]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True)
NEAR_TIE = 0.5  # nats between the top two candidates


def answers(model_path, store, **config):
    cfg = EngineConfig(model=model_path, n_parallel=2, n_ctx=2048, prefix_store=str(store), **config)
    with Engine(cfg) as engine:
        with engine.hold():
            handles = [engine.submit(INSTRUCTION + item, PARAMS) for item in ITEMS]
        return [h.result(120) for h in handles]


def agree_up_to_near_ties(evaluated, restored):
    for step, (a, b) in enumerate(zip(evaluated.logprobs, restored.logprobs)):
        if a["id"] == b["id"]:
            continue
        top = sorted((t["logprob"] for t in a["top_logprobs"]), reverse=True)
        assert top[0] - top[1] < NEAR_TIE, (
            f"restored run chose {b['token']!r} at step {step} where the evaluated run chose {a['token']!r} "
            f"with a clear margin ({top[0] - top[1]:.2f} nats)")
        return  # after a divergence the two continuations are of different texts


@pytest.mark.parametrize("kv_unified", [False, True], ids=["streams", "unified"])
def test_a_restored_instruction_answers_as_the_evaluated_one(model_path, tmp_path, kv_unified):
    first = answers(model_path, tmp_path, kv_unified=kv_unified)
    assert all(r.ok and r.usage.restored_tokens == 0 for r in first)
    entries = list(tmp_path.rglob("*.kv"))
    assert len(entries) == 1  # the shared instruction, saved once
    again = answers(model_path, tmp_path, kv_unified=kv_unified)
    assert all(r.ok for r in again)
    # the first request restored the instruction; the second forked it from that slot
    assert again[0].usage.restored_tokens > 0
    assert again[0].usage.restored_tokens == again[0].usage.cached_tokens
    assert again[1].usage.cached_tokens >= again[0].usage.restored_tokens
    for evaluated, restored in zip(first, again):
        agree_up_to_near_ties(evaluated, restored)


def test_entries_of_one_layout_are_not_restored_by_the_other(model_path, tmp_path):
    answers(model_path, tmp_path, kv_unified=False)
    other = answers(model_path, tmp_path, kv_unified=True)
    assert all(r.ok and r.usage.restored_tokens == 0 for r in other)
    assert len({p.parent for p in tmp_path.rglob("*.kv")}) == 2  # one fingerprint folder each


def test_deterministic_mode_does_not_use_the_store(model_path, tmp_path):
    cfg = EngineConfig(model=model_path, n_parallel=2, n_ctx=2048, deterministic=True,
                       prefix_store=str(tmp_path))
    with Engine(cfg) as engine:
        assert engine.disk is None
        with engine.hold():
            handles = [engine.submit(INSTRUCTION + item, PARAMS.replace(logprobs=None)) for item in ITEMS]
        assert all(h.result(120).ok for h in handles)
    assert list(tmp_path.rglob("*.kv")) == []


def test_a_second_run_restores_the_shared_instruction_and_says_so(model_path, tmp_path, monkeypatch):
    """`run` with the commands' default store (here the test's own folder, from conftest): the
    first run saves the instruction its lines share, the second restores it, and its summary
    line and records say how many tokens came from disk."""
    import json
    import subprocess
    import sys

    monkeypatch.delenv("LLAMABATCH_MODEL", raising=False)
    src = tmp_path / "lines.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": INSTRUCTION + item}) + "\n" for i, item in enumerate(ITEMS)))
    args = ["--n-parallel", "2", "--n-ctx", "2048", "--temperature", "0", "--max-tokens", "4"]
    summaries = []
    for n in (1, 2):
        out = tmp_path / f"out{n}.jsonl"
        r = subprocess.run([sys.executable, "-m", "llamabatch", "run", str(src), "-o", str(out), *args],
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        summaries.append(next(line for line in r.stderr.splitlines() if "prompt tokens" in line))
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted(rec["id"] for rec in records) == [0, 1]
    assert "from the disk prefix store" not in summaries[0]
    assert "from the disk prefix store" in summaries[1]
    restored = [rec["usage"].get("restored_tokens", 0) for rec in records]
    assert max(restored) > 100 and restored.count(0) == 1  # one restore; the other line forks it
