"""A q8_0 KV cache end to end on both model families: requests side by side, a reused prompt
prefix, the KV llama.cpp allocates (its own log) equal to what the memory checks count, and disk
prefix store entries of another type never restored while the run goes on.

What is asserted holds on every CPU kernel path: no token is compared with an f16 run (the
cache's rounding may change a near tie); only that each request runs to its length, that the
cache is the size and type asked for, and that restoring follows the fingerprint.
"""
from __future__ import annotations

import logging

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.kernel_paths import resources

Q8 = {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}
INSTRUCTION = ("You are a careful assistant. Read the short product review that follows and answer "
               "with a single word: positive, negative or mixed. Do not explain. " * 5)
ITEMS = ["Review: the battery died after two days. Answer:", "Review: it works and it is cheap. Answer:"]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def q8_engine(family):
    config = EngineConfig(model=family.path, n_parallel=4, n_ctx=4 * 1024, **Q8)
    with Engine(config) as engine:
        yield engine


def test_q8_0_requests_side_by_side_run_to_their_length(q8_engine):
    with q8_engine.hold():
        handles = [q8_engine.submit(f"Item {i}: the weather in city {i} today is", PARAMS) for i in range(4)]
    results = [h.result(120) for h in handles]
    assert all(r.ok and r.finish_reason == "length" and r.usage.completion_tokens == 12 for r in results)
    assert all(r.text.strip() for r in results)


def test_q8_0_reuses_a_cached_prompt_prefix(q8_engine):
    first = q8_engine.generate([INSTRUCTION + ITEMS[0]], PARAMS)[0]
    again = q8_engine.generate([INSTRUCTION + ITEMS[1]], PARAMS)[0]
    assert first.ok and again.ok
    assert again.usage.cached_tokens > 0


def test_the_kv_llama_cpp_allocates_is_what_the_memory_check_counts(q8_engine):
    runner = q8_engine.runner
    need = resources.needs(q8_engine.config, runner.metadata, weights=0)
    assert runner.capabilities.kv_mib == pytest.approx(need.kv_bytes / 2**20, abs=0.01)  # llama.cpp logs MiB to 2 decimals
    f16 = resources.needs(q8_engine.config.replace(cache_type_k="f16", cache_type_v="f16"), runner.metadata, 0)
    assert need.kv_bytes * 64 == f16.kv_bytes * 34  # q8_0: 34 bytes per 32 values, f16: 64
    assert "KV q8_0/q8_0" in runner.kernel_text and "flash attention on" in runner.kernel_text
    assert runner.kv_fingerprint["cache_types"] == "q8_0/q8_0"
    assert "v_layout" not in runner.kv_fingerprint  # V by rows, as every entry before the key existed


def answers(path, store, **config):
    cfg = EngineConfig(model=path, n_parallel=2, n_ctx=2048, prefix_store=str(store), **config)
    with Engine(cfg) as engine:
        with engine.hold():
            handles = [engine.submit(INSTRUCTION + item, PARAMS) for item in ITEMS]
        return [h.result(120) for h in handles]


def test_an_f16_entry_is_never_restored_into_a_q8_0_cache_and_the_run_goes_on(family, tmp_path, caplog):
    assert all(r.ok for r in answers(family.path, tmp_path))
    assert len(list(tmp_path.rglob("*.kv"))) == 1  # the shared instruction, saved in f16
    with caplog.at_level(logging.WARNING, logger="llamabatch.prefix_store"):
        q8 = answers(family.path, tmp_path, **Q8)
    assert all(r.ok and r.usage.restored_tokens == 0 and r.usage.completion_tokens == 12 for r in q8)
    notes = [r.getMessage() for r in caplog.records if "other KV settings" in r.getMessage()]
    assert len(notes) == 1 and "1 with KV f16/f16" in notes[0] and "(KV q8_0/q8_0" in notes[0]
    again = answers(family.path, tmp_path, **Q8)  # q8_0's own entry is restored by the next q8_0 run
    assert again[0].usage.restored_tokens > 0
