"""The embedding context (made on first use, llamabatch/llama/embedder.py) is checked against
max_memory before llama.cpp reserves it: what is counted matches the buffers llama.cpp reports,
and one that does not fit fails its embedding requests with one line while generation goes on."""
from __future__ import annotations

import logging
import re

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.kernel_paths import resources

MIB = 2**20


def test_the_counted_bytes_are_what_llama_cpp_reserves(model_path, caplog):
    config = EngineConfig(model=model_path, n_parallel=1, n_ctx=512)
    with Engine(config) as engine, caplog.at_level(logging.INFO, logger="llamabatch.runner"):
        assert len(engine.embed(["one", "two"])) == 2
        embedder = engine.runner.embedder
        counted = embedder.reserved_bytes(embedder.max_tokens, min(embedder.max_tokens, 512))
    said = [float(m) for m in re.findall(r"CPU\s+(?:output|KV|compute) buffer size =\s+([\d.]+) MiB", caplog.text)]
    assert said, caplog.text  # the embedding context's output, KV (full and window layers) and compute buffers
    reserved = sum(said) * MIB
    assert abs(counted - reserved) < 0.02 * reserved, (counted / MIB, said)


def test_an_embedding_context_past_max_memory_fails_its_requests_and_generation_goes_on(model_path):
    config = EngineConfig(model=model_path, n_parallel=1, n_ctx=512)
    taken = resources.check(config, model_path).total
    with Engine(config.replace(max_memory=taken + 64 * MIB)) as engine:  # fits the engine, not 780 MiB more
        refused = engine.submit_embedding(["one", "two"]).result(timeout=120)
        assert not refused.ok and refused.error_code == "resource_limit"
        assert refused.error.startswith("the embedding context needs ") and "raise max_memory or lower n_batch" in refused.error
        assert engine.submit_embedding("three").result(timeout=120).error_code == "resource_limit"  # the same answer every time, no crash
        text = engine.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))[0]
        assert text.ok and text.usage.completion_tokens == 4
