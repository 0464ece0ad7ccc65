"""A prompt too long for its request: one wording, the right advice, from
the engine (run, serve-stdin, serve and the library all submit through it) and from `run
--dry-run`. A prompt at least as long as the model's trained context can only be shortened:
"raise --n-ctx, or --kv-unified" cannot help it. On the scripted fake runner (one token a
character), whose metadata names the model's trained context."""
from __future__ import annotations

import json

import pytest

from llamabatch import ContextOverflow, Engine, EngineConfig, SamplingParams

from fake_runner import FakeRunner
from test_run_cli import llamabatch_run, write_lines

TRAINED = {"general.architecture": "fake", "fake.context_length": "6000"}  # as llama.cpp's metadata API gives it
QUICK = ["--max-tokens", "4", "--temperature", "0", "--n-parallel", "2"]


def refusal(prompt: str, **runner_kw) -> str:
    runner = FakeRunner(n_slots=2, slot_ctx=4096, metadata=TRAINED, **runner_kw)
    with Engine(EngineConfig(n_parallel=2, n_ctx=8192), runner=runner, default_params=SamplingParams()) as engine:
        result = engine.submit(prompt).result(timeout=10)
    assert (result.finish_reason, result.error_code) == ("error", ContextOverflow.code)
    return result.error


def test_a_prompt_past_the_trained_context_is_told_to_shorten_not_to_raise_n_ctx():
    message = refusal("x" * 7000)
    assert message == ("prompt has 7,000 tokens but the model's trained context is 6,000 tokens, prompt and answer "
                       "together: shorten the prompt, or give --n-ctx (n_ctx / n_parallel tokens a slot; past the "
                       "model's trained context its output may degrade)")


def test_a_prompt_within_the_trained_context_is_told_what_gives_a_slot_more():
    message = refusal("x" * 5000)
    assert message.startswith("prompt has 5,000 tokens but a slot holds 4,096 (n_ctx / n_parallel), and at least "
                              "one must be left for the answer; raise --n-ctx, or --kv-unified")


def test_a_prompt_refused_by_its_bytes_alone_past_the_trained_context_is_told_to_shorten():
    # 4 bytes a token at most: 30,000 bytes can never be 6,000 tokens or fewer
    message = refusal("x" * 30_000)
    assert message.startswith("prompt has 30,000 bytes, more than a slot's 4,096 tokens can hold")
    assert message.endswith("and more than the model's trained context of 6,000 tokens: shorten the prompt, or give "
                            "--n-ctx (n_ctx / n_parallel tokens a slot; past the model's trained context its output "
                            "may degrade)")


@pytest.mark.parametrize("length", [7000, 5000], ids=["past-the-trained-context", "past-the-slot"])
def test_run_and_its_dry_run_refuse_a_long_line_in_the_same_words(tmp_path, monkeypatch, length):
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))
    lines = [{"id": "a", "prompt": "A is for"}, {"id": "long", "prompt": "y" * length}]
    inp = write_lines(tmp_path / "in.jsonl", lines)
    args = [str(inp), *QUICK, "--n-ctx", "8192"]
    dry = llamabatch_run(*args, "--dry-run", "--json", metadata=TRAINED)
    assert dry.returncode == 0, dry.stderr
    [said_before] = json.loads(dry.stdout)["first_errors"]
    run = llamabatch_run(*args, metadata=TRAINED)
    records = {r["id"]: r for r in map(json.loads, run.stdout.splitlines())}
    said_during = records["long"]["error"]["message"]
    assert records["long"]["error"]["code"] == "context_overflow" and records["a"]["error"] is None
    assert said_before == f"context_overflow: line 2: {said_during}"
    assert ("shorten the prompt" in said_during) == (length >= 6000)
    assert ("--kv-unified" in said_during) == (length < 6000)


def test_the_dry_run_gives_one_request_of_a_shared_pool_what_the_runner_gives_it(tmp_path, monkeypatch):
    # --kv-unified: one request may hold up to the model's trained context within the pool
    # (llama/runner.py), not an even share of it
    monkeypatch.setenv("LLAMABATCH_CACHE_DIR", str(tmp_path / "cache"))
    inp = write_lines(tmp_path / "in.jsonl", [{"id": "doc", "prompt": "z" * 3000}])
    dry = llamabatch_run(str(inp), *QUICK, "--n-ctx", "4096", "--kv-unified", "--dry-run", "--json",
                         metadata=TRAINED)
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert (report["valid"], report["first_errors"], report["slots"]["slot_ctx"]) == (1, [], 4096)
